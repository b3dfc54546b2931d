"""The job's preflight: the facts a launcher holds each node to, and the shell that checks them, run with bash against
the nvidia-smi double (per-node values) as a node would run it. The Slurm run is in test_launch_sandbox.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from fixtures_launch import FAKE_ROOT, LAUNCH_REGISTRY, build_launcher

from shipyard import registry
from shipyard.errors import ShipyardError
from shipyard.launch import launcher as launch
from shipyard.launch import preflight
from shipyard.registry import compat

DOUBLES = Path(__file__).resolve().parents[1] / "doubles" / "doctor"
CMD = ("train.py",)
H100 = "NVIDIA H100 80GB HBM3, {driver}, 9.0"


@pytest.fixture
def preflight_registry():
    """The launch registry plus a CUDA 13.0 environment (torch 2.11.0's default wheel: no sm_70)."""
    data = yaml.safe_load(LAUNCH_REGISTRY)
    data["environments"]["pytorch-2.11"] = {"torch": "2.11.0", "cuda": "13.0", "python": "3.12",
                                            "os": "ubuntu24.04"}
    return registry.load_text(yaml.safe_dump(data), "registry.yaml", path=FAKE_ROOT / "registry.yaml")


def _function(l: launch.Launcher) -> str:
    """The shipyard_preflight function of ``l``'s launcher (with no grace wait: the tests need no pause)."""
    text = launch.render(l.replace(node_checks=replace(l.node_checks, grace=0)))
    m = re.search(r"^shipyard_preflight\(\) \{\n.*?^\}\n", text, re.S | re.M)
    assert m, "no shipyard_preflight in the launcher"
    return m.group(0)


def _run(l: launch.Launcher, node: str = "node3", *, path: str | None = None, **env) -> subprocess.CompletedProcess:
    """Run the launcher's preflight as node ``node`` would (its SLURMD_NODENAME), with the nvidia-smi double."""
    full = {"PATH": path if path is not None else f"{DOUBLES}{os.pathsep}/usr/bin:/bin", "SLURMD_NODENAME": node,
            **env}
    return subprocess.run([shutil.which("bash"), "-c", _function(l) + "shipyard_preflight"], env=full, capture_output=True,
                          text=True, timeout=30)


def test_facts_are_checks_facts(preflight_registry):
    """The driver minimum and the arch list are compat.yaml's, the same ones `invoke check` reads."""
    l = build_launcher(preflight_registry, environment="pytorch-2.11", cluster="lab-ib", command=CMD)
    c = l.node_checks
    assert c.driver_min == compat.cuda_facts("13.0")["driver_min"] and c.cuda == "13.0"
    assert list(c.arches) == compat.torch_series("2.11.0")["arches"]
    assert c.gpus == l.gpus_per_node == 4 and c.wheel == "torch 2.11.0" and c.unchecked == ""
    assert c.grace == preflight.data()["grace_s"]


def test_on_by_default_for_gpus_only(launch_registry):
    assert build_launcher(launch_registry, cluster="lab-ib", command=CMD).node_checks is not None
    assert build_launcher(launch_registry, cluster="lab-ib", gpus_per_node=0, command=CMD).node_checks is None
    assert build_launcher(launch_registry, cluster="lab-ib", gpus_per_node=0, preflight="on",
                          command=CMD).node_checks is not None
    off = build_launcher(launch_registry, cluster="lab-ib", preflight="off", command=CMD)
    assert off.node_checks is None and "shipyard_preflight" not in launch.render(off)
    assert off.regenerate[off.regenerate.index("--preflight") + 1] == "off"
    assert build_launcher(launch_registry, cluster="lab-ib", kind="nccl-test").node_checks is None
    with pytest.raises(ShipyardError, match=r"^--preflight 'maybe': expected on or off$"):
        build_launcher(launch_registry, cluster="lab-ib", preflight="maybe", command=CMD)


def test_external_image_checks_only_the_count(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-efa", image="nvcr.io#nvidia/pytorch:24.01-py3", command=CMD)
    assert l.node_checks.driver_min == "" and l.node_checks.arches == ()
    assert "external --image" in l.node_checks.unchecked
    res = _run(l, SHIPYARD_DOUBLE_GPUS_node3=H100.format(driver="418.40.04"))
    assert res.returncode == 3 and "1 GPU(s) visible, --gpus-per-node 8" in res.stderr
    assert "driver" not in res.stderr


def test_matching_node_passes(preflight_registry):
    l = build_launcher(preflight_registry, environment="pytorch-2.11", cluster="lab-socket", command=CMD)
    res = _run(l, CUDA_VISIBLE_DEVICES="0,1",
               SHIPYARD_DOUBLE_GPUS_node3=";".join([H100.format(driver="580.95.05")] * 2))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "shipyard: preflight: node3: ok\n"


def test_old_driver_stops_with_one_line_naming_node_driver_and_need(preflight_registry):
    l = build_launcher(preflight_registry, environment="pytorch-2.11", cluster="lab-socket", command=CMD)
    old = ";".join([H100.format(driver="535.104.05")] * 2)
    res = _run(l, SHIPYARD_DOUBLE_GPUS_node3=old, SHIPYARD_DOUBLE_GPUS_node1=";".join([H100.format(driver="580.95.05")] * 2))
    assert res.returncode == 3
    assert res.stderr == "shipyard: error: preflight: node3: driver 535.104.05 < 580 needed by CUDA 13.0\n"
    good = _run(l, "node1", SHIPYARD_DOUBLE_GPUS_node3=old,
                SHIPYARD_DOUBLE_GPUS_node1=";".join([H100.format(driver="580.95.05")] * 2))
    assert good.returncode == 0, good.stderr  # per-node values: the other node of the same job is fine


@pytest.mark.parametrize("driver,ok", [("580", True), ("580.0.1", True), ("579.99", False), ("1000.1", True),
                                       ("58.0", False)])
def test_driver_compared_by_number_not_text(preflight_registry, driver, ok):
    l = build_launcher(preflight_registry, environment="pytorch-2.11", cluster="lab-socket", command=CMD)
    res = _run(l, SHIPYARD_DOUBLE_GPUS_node3=";".join([H100.format(driver=driver)] * 2))
    assert (res.returncode == 0) is ok, res.stderr


def test_an_image_with_only_bash_is_still_checked(preflight_registry, tmp_path):
    """Inside a container the image's tools are all there is: with nothing on PATH but nvidia-smi and sleep (no awk,
    head or tr), an old driver still stops the node and a matching one passes."""
    l = build_launcher(preflight_registry, environment="pytorch-2.11", cluster="lab-socket", command=CMD)
    (tmp_path / "nvidia-smi").symlink_to(DOUBLES / "nvidia-smi")
    (tmp_path / "sleep").symlink_to(shutil.which("sleep"))
    old = _run(l, path=str(tmp_path), SHIPYARD_DOUBLE_GPUS_node3=";".join([H100.format(driver="535.104.05")] * 2))
    assert (old.returncode, old.stderr) == (3, "shipyard: error: preflight: node3: driver 535.104.05 < 580 needed "
                                               "by CUDA 13.0\n")
    ok = _run(l, path=str(tmp_path), CUDA_VISIBLE_DEVICES="0,1")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "shipyard: preflight: node3: ok\n", "")


def test_gpu_arch_missing_from_the_wheel(preflight_registry):
    l = build_launcher(preflight_registry, environment="pytorch-2.11", cluster="lab-socket", command=CMD)
    v100 = "Tesla V100-SXM2-32GB, 580.95.05, 7.0"
    res = _run(l, SHIPYARD_DOUBLE_GPUS_node3=f"{v100};{v100}")
    assert res.returncode == 3
    want = ", ".join(f"sm_{a}" for a in compat.torch_series("2.11.0")["arches"])
    assert res.stderr == (f"shipyard: error: preflight: node3: GPU 0 Tesla V100-SXM2-32GB (sm_70) cannot run the "
                          f"torch 2.11.0 wheel ({want})\n")


def test_arch_family_rule(launch_registry):
    """sm_89 (L4) runs the sm_86 code of torch 2.3's wheel: same major, a minor at least as high."""
    l = build_launcher(launch_registry, cluster="lab-socket", command=CMD)
    l4 = "NVIDIA L4, 550.54.15, 8.9"
    assert _run(l, SHIPYARD_DOUBLE_GPUS_node3=f"{l4};{l4}").returncode == 0
    k80 = "Tesla K80, 550.54.15, 3.7"  # torch 2.3 has no sm_37
    assert "(sm_37) cannot run the torch 2.3.1 wheel" in _run(l, SHIPYARD_DOUBLE_GPUS_node3=f"{k80};{k80}").stderr


def test_fewer_gpus_visible_than_asked(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-socket", command=CMD)  # 2 GPUs per node
    two = ";".join([H100.format(driver="580.95.05")] * 2)
    res = _run(l, CUDA_VISIBLE_DEVICES="0", SHIPYARD_DOUBLE_GPUS_node3=two)
    assert res.returncode == 3 and res.stderr.endswith("node3: 1 GPU(s) visible, --gpus-per-node 2\n")
    # every finding of a node on its one line
    res = _run(l, SHIPYARD_DOUBLE_GPUS_node3="NVIDIA H100 80GB HBM3, 470.1, 9.0")
    assert res.stderr.count("\n") == 1
    assert "driver 470.1 < 525.60.13 needed by CUDA 12.1; 1 GPU(s) visible, --gpus-per-node 2" in res.stderr


def test_broken_driver_stops(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-socket", command=CMD)
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    res = _run(l, SHIPYARD_DOUBLE_NVSMI_FAIL=msg)
    assert res.returncode == 3 and res.stderr == f"shipyard: error: preflight: node3: nvidia-smi failed: {msg}\n"


def test_no_nvidia_smi_says_so_and_goes_on(launch_registry, tmp_path):
    l = build_launcher(launch_registry, cluster="lab-ib", command=CMD)
    for tool in ("sleep",):  # a PATH without any nvidia-smi, even on a GPU machine
        (tmp_path / tool).symlink_to(shutil.which(tool))
    res = _run(l, path=str(tmp_path))
    assert res.returncode == 0
    assert res.stderr == ("shipyard: preflight: node3: no nvidia-smi in the container: driver, GPU arch and GPU "
                          "count not checked\n")


def test_preflight_runs_before_torchrun(launch_registry):
    text = launch.render(build_launcher(launch_registry, cluster="lab-efa", nodes=2, command=CMD))
    node = text[text.index("shipyard_node() {"):]
    assert node.index("shipyard_preflight || exit $?") < node.index("exec torchrun")
    assert 'declare -f shipyard_preflight shipyard_node' in text
