"""`invoke check`'s runtime findings (shipyard/registry/runtime_checks.py): Charliecloud on a GPU partition without a
declared GPU injection, MIG partitions; and the launcher's refusal of more than one MIG instance per node."""

from __future__ import annotations

import pytest
import yaml
from fixtures_launch import FAKE_ROOT, LAUNCH_REGISTRY, build_launcher

from shipyard import facts, registry
from shipyard.errors import ShipyardError
from shipyard.registry import compat

CMD = ("train.py",)


def _registry(**lab_ib):
    """The launch registry with ``lab-ib``'s entry updated by ``lab_ib``."""
    data = yaml.safe_load(LAUNCH_REGISTRY)
    data["clusters"]["lab-ib"].update(lab_ib)
    return registry.load_text(yaml.safe_dump(data), "registry.yaml", path=FAKE_ROOT / "registry.yaml")


def _problems(reg, partition=None):
    env, cluster = reg.environment("pytorch-2.3"), reg.cluster("lab-ib").on(partition)
    return [(p.severity, p.key, p.message) for p in compat.check_on_cluster(env, cluster)
            if "charliecloud" in p.message or "MIG" in p.message]


def test_charliecloud_on_a_gpu_partition_is_an_error():
    (found,) = _problems(_registry(runtime="charliecloud"))
    assert found[:2] == ("ERROR", "clusters.lab-ib.runtime")
    assert "no GPU" in found[2] and "clusters.lab-ib.gpu_injection" in found[2]


def test_charliecloud_with_a_declared_gpu_injection_or_no_gpus_is_fine():
    assert _problems(_registry(runtime="charliecloud", gpu_injection="ch-fromhost --nvidia on every image")) == []
    cpu = {"grete": {"gpus_per_node": 0}, "grete-interactive": {}}
    reg = _registry(runtime="charliecloud", scheduler={"partition": "grete", "partitions": cpu})
    assert _problems(reg, "grete") == []
    assert [f[0] for f in _problems(reg, "grete-interactive")] == ["ERROR"]  # the GPU partition still is one


def _mig_registry():
    parts = {"grete": {}, "grete-interactive": {"mig": "1g.10gb", "gpus_per_node": 7}}
    return _registry(scheduler={"partition": "grete", "partitions": parts})


def test_mig_partition_with_several_instances_per_node_is_warned_with_the_reason():
    reg = _mig_registry()
    assert _problems(reg, "grete") == []
    ((sev, key, msg),) = _problems(reg, "grete-interactive")
    assert sev == "WARN" and key == "clusters.lab-ib.scheduler.partitions.grete-interactive.gpus_per_node"
    assert "(1g.10gb), 7 per node" in msg and "NVIDIA/nccl#1716" in msg


def test_launchers_on_mig_use_one_instance_and_refuse_more():
    reg = _mig_registry()
    one = facts.load("compat")["mig"]["gpus_per_node"]
    l = build_launcher(reg, cluster="lab-ib", partition="grete-interactive", command=CMD)
    assert l.gpus_per_node == one == 1 and l.node_checks.gpus == 1
    with pytest.raises(ShipyardError, match=r"^--gpus-per-node 2: partition grete-interactive of cluster lab-ib has "
                                            r"MIG instances \(1g\.10gb\); a multi-process NCCL job can use 1 per node"):
        build_launcher(reg, cluster="lab-ib", partition="grete-interactive", gpus_per_node=2, command=CMD)
    assert build_launcher(reg, cluster="lab-ib", partition="grete", command=CMD).gpus_per_node == 4


def test_schema_refuses_a_malformed_mig_profile():
    with pytest.raises(ShipyardError, match="mig"):
        _registry(scheduler={"partition": "grete", "partitions": {"grete": {"mig": "half a gpu"}}})
