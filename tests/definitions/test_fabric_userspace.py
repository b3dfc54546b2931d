"""Fast-fabric userspace from the shipped registry: the grete-like (IB, Apptainer) and ParallelCluster-like (EFA,
pyxis) launchers name a fabric their images carry, the definitions install it, and %test checks it."""

from __future__ import annotations

import pytest
from fixtures_launch import build_launcher
from helpers_registry import ROOT

from shipyard import registry
from shipyard.definitions import recipe, render
from shipyard.launch import launcher
from shipyard.registry import compat, fabric_checks

SHIPPED = registry.load(ROOT / "registry.yaml")


@pytest.mark.parametrize("cluster", ["grete", "aws-pcluster"])
@pytest.mark.parametrize("env", sorted(SHIPPED.environments))
def test_shipped_launchers_name_a_fabric_the_image_carries(env, cluster):
    cl = SHIPPED.clusters[cluster]
    e = SHIPPED.environments[env]
    assert fabric_checks.image_has_fabric(e, cl)
    assert not [p for p in compat.check_on_cluster(e, cl) if p.severity == compat.ERROR]
    text = launcher.render(build_launcher(SHIPPED, environment=env, cluster=cluster, nodes=2,
                                          command=("examples/train.py",)))
    assert f"fabric {cl.fabric}:" in text.splitlines()[3]
    family = {"ib": "ib", "efa": "ofi"}[cl.fabric]
    assert f'fams != "{family}"' in text
    assert "export NCCL_DEBUG_SUBSYS=INIT,NET" in text
    definition = render.render_definition(e, SHIPPED)
    if cl.fabric == "ib":
        assert "apt-get install -y --no-install-recommends libibverbs1 ibverbs-providers librdmacm1" in definition
        assert "ctypes.CDLL('libibverbs.so.1')" in definition
    else:
        inst = cl.fabric_options["efa_installer"]
        assert f"aws-efa-installer-{inst}.tar.gz" in definition and "--skip-kmod" in definition
        assert "ctypes.CDLL('/opt/amazon/efa/lib/libfabric.so.1')" in definition
        assert "libnccl-ofi-tuner.so" in definition  # the file the launcher's NCCL_TUNER_PLUGIN names
        assert 'NCCL_TUNER_PLUGIN="/opt/amazon/ofi-nccl/lib/' in text


def test_socket_only_environment_installs_no_fabric():
    reg = registry.load_text("""environments:
  e: {torch: "2.3.1", cuda: "12.1", python: "3.11", os: ubuntu22.04}
clusters:
  s: {runtime: host, fabric: socket, gpus_per_node: 0, scheduler: {partition: p}}
""", "t.yaml")
    r = recipe.build_recipe(reg.environment("e"))
    assert not [s for s in r.post if "userspace" in s.comment]
    assert not [c for c in r.test if "ctypes" in c]


def test_host_injection_means_the_image_need_not_carry_it():
    reg = registry.load_text("""environments:
  e: {torch: "2.3.1", cuda: "12.1", python: "3.11", os: ubuntu22.04}
clusters:
  g:
    runtime: apptainer
    fabric: ib
    gpus_per_node: 4
    scheduler: {partition: p}
    fabric_options: {host_injection: {binds: [/usr/lib/x86_64-linux-gnu/libibverbs]}}
""", "t.yaml")
    e = reg.environment("e")
    assert e.fabrics == () and fabric_checks.image_has_fabric(e, reg.cluster("g"))
    assert not [p for p in compat.check_on_cluster(e, reg.cluster("g")) if p.severity == compat.ERROR]
