"""The pinned NCCL transport (shipyard/launch/fabric.py, launch.yaml ``net_pin``): NCCL_NET per fabric, the name
aws-ofi-nccl answers to per version, the flag and the cluster key that turn it off, the header and the hint."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from fixtures_launch import FAKE_ROOT, LAUNCH_REGISTRY, build_launcher, run_launch

from shipyard import registry
from shipyard.launch import fabric
from shipyard.launch import launcher as launch

CMD = ("train.py",)


def _registry(**fabric_options):
    """The launch registry with ``lab-efa``'s fabric_options replaced."""
    data = yaml.safe_load(LAUNCH_REGISTRY)
    data["clusters"]["lab-efa"]["fabric_options"] = fabric_options
    return registry.load_text(yaml.safe_dump(data), "registry.yaml", path=FAKE_ROOT / "registry.yaml")


def _net(l: launch.Launcher) -> str | None:
    return next((v.value for v in l.env if v.name == "NCCL_NET"), None)


@pytest.mark.parametrize("cluster", ["lab-ib", "lab-socket", "lab-efa"])
def test_each_fabric_pins_the_name_the_data_gives(launch_registry, cluster):
    l = build_launcher(launch_registry, cluster=cluster, nodes=2, command=CMD)
    pin = fabric.launch_data()["net_pin"][l.fabric]
    assert _net(l) == pin["name"]  # lab-efa's aws-ofi-nccl 1.16.1 is past every `below` version
    text = launch.render(l)
    assert f"export NCCL_NET={pin['name']}  # fabric {l.fabric}: pinned transport" in text
    assert f"# NCCL transport pinned: NCCL_NET={pin['name']} (fabric {l.fabric}" in text


@pytest.mark.parametrize("options,want", [
    ({"aws_ofi_nccl": "1.5.0"}, "AWS Libfabric"),    # the plugin called itself "AWS Libfabric" then
    ({"aws_ofi_nccl": "1.12.1"}, "AWS Libfabric"),   # below 1.13: the name every release answers to
    ({"aws_ofi_nccl": "1.13.0"}, "Libfabric"),
    ({"efa_installer": "1.43.0"}, "Libfabric"),      # the installer's plugin (1.16.1, compat data)
    ({}, "AWS Libfabric"),                           # version unknown
])
def test_efa_name_follows_the_plugin_version(options, want):
    l = build_launcher(_registry(**options), cluster="lab-efa", command=CMD)
    assert _net(l) == want
    assert f"export NCCL_NET={want!r}" in launch.render(l) or f"export NCCL_NET={want}" in launch.render(l)


def test_the_flag_turns_the_pin_off_and_the_header_says_so(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-efa", nodes=2, command=CMD, allow_transport_fallback=True)
    text = launch.render(l)
    assert _net(l) is None and "NCCL_NET" not in text
    assert "# NCCL transport NOT pinned (--allow-transport-fallback)" in text
    assert "--allow-transport-fallback" in l.regenerate
    assert "Failed to initialize any NET plugin" not in text  # no hint about a pin that is not there


def test_the_cluster_key_turns_the_pin_off():
    l = build_launcher(_registry(aws_ofi_nccl="1.16.1", allow_transport_fallback=True), cluster="lab-efa",
                       command=CMD)
    assert _net(l) is None
    assert ("# NCCL transport NOT pinned (clusters.lab-efa.fabric_options.allow_transport_fallback)"
            in launch.render(l))
    assert "--allow-transport-fallback" not in l.regenerate  # the registry says it, not a flag


def test_a_users_value_wins_and_the_header_names_it(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-ib", command=CMD, env=["NCCL_NET=IBext_v8"])
    assert _net(l) == "IBext_v8"
    assert "# NCCL transport pinned: NCCL_NET=IBext_v8 (--env)" in launch.render(l)


def test_the_nccl_test_launcher_is_pinned_too(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-efa", nodes=2, kind="nccl-test")
    assert _net(l) == "Libfabric" and "--container-env=NCCL_NET," in launch.render(l)


def test_hint_names_fabric_and_userspace_when_nccl_finds_no_such_network(launch_registry):
    """The launcher's own hint program, run over a log with NCCL's error for a pinned network it did not find."""
    l = build_launcher(launch_registry, cluster="lab-efa", nodes=2, command=CMD)
    log = "node1:1234:1250 [0] NCCL WARN Failed to initialize any NET plugin\n"
    out = subprocess.run(["awk", l.failure_hints], input=log, capture_output=True, text=True, check=True).stdout
    assert out.startswith("shipyard: hint: NCCL_NET=Libfabric pins the network of fabric efa")
    assert "/opt/amazon/ofi-nccl" in out and "--allow-transport-fallback" in out
    quiet = subprocess.run(["awk", l.failure_hints], input="NCCL INFO Using network Libfabric\n",
                           capture_output=True, text=True, check=True).stdout
    assert quiet == ""


def test_dry_run_shows_the_pin_and_the_flag_removes_it(launch_project, monkeypatch):
    """`invoke launch --cluster <efa cluster> --dry-run`, through the command."""
    monkeypatch.chdir(launch_project)
    (launch_project / "train.py").write_text("")
    out = run_launch(("train.py",), cluster="lab-efa", image="/fsx/images/x.sqsh", dry_run=True)
    assert "export NCCL_NET=Libfabric" in out
    out = run_launch(("train.py",), cluster="lab-efa", image="/fsx/images/x.sqsh", dry_run=True,
                     allow_transport_fallback=True)
    assert "NCCL_NET" not in out and "NCCL transport NOT pinned" in out
