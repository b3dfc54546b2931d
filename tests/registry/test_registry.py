"""Loading registry.yaml: resolution, sources of pins, and one-line errors with file:line for bad input."""

from __future__ import annotations

import pytest
from helpers_registry import DATA, ROOT

from shipyard import registry
from shipyard.errors import ShipyardError

MINIMAL = (DATA / "minimal.yaml").read_text()


def err(text: str) -> str:
    with pytest.raises(ShipyardError) as exc:
        registry.load_text(text, "reg.yaml")
    msg = str(exc.value)
    assert "\n" not in msg and exc.value.exit_code == 2
    return msg


def test_shipped_registry_has_required_entries():
    reg = registry.load(ROOT / "registry.yaml")
    e = reg.environment("pytorch-2.3")
    assert (e.torch.value, e.cuda.value, e.python.value, e.nccl.value) == ("2.3.1", "12.1", "3.11", "2.20.5")
    for name in ("pytorch-2.5", "pytorch-2.7", "pytorch-2.10"):
        assert name in reg.environments
    assert any(e.cuda.value.startswith("13.") and e.torch.value.startswith(("2.13", "2.14"))
               for e in reg.environments.values())
    g = reg.cluster("grete")
    assert (g.runtime, g.fabric, g.gpus_per_node) == ("apptainer", "ib", 4)
    assert set(g.partitions) >= {"grete", "grete-interactive"} and {x.arch for x in g.gpus} == {"sm_80", "sm_90"}
    a = reg.cluster("aws-pcluster")
    assert (a.runtime, a.fabric, a.gpus_per_node, a.cpus_per_node) == ("pyxis", "efa", 8, 192)
    assert set(a.partitions) == {"cpu-queue", "a10-queue", "h100-queue"} and a.storage.startswith("/fsx")
    s = reg.cluster("sandbox")
    assert (s.runtime, s.fabric, s.nodes, s.gpus_per_node) == ("host", "socket", 2, 2)
    assert reg.default_environment == "pytorch-2.3" and reg.default_cluster == "sandbox"
    assert (ROOT / "registry.yaml").read_text().startswith("# yaml-language-server: $schema=")


def test_defaults_and_sources():
    e = registry.load_text(MINIMAL).environment("e")
    assert e.nccl.value == "2.20.5" and e.nccl.source.startswith("default")
    assert e.torchvision.value == "0.18.1" and "companion" in e.torchvision.source
    assert e.torch.source == "explicit"
    assert e.base.value == "nvidia/cuda:12.1.1-runtime-ubuntu22.04" and "compat data" in e.base.source


def test_extends_inherits_and_merges():
    reg = registry.load(DATA / "features.yaml")
    child = reg.environment("child")
    assert child.nccl.value == "2.21.5" and child.nccl.source == "inherited from nccl-override"
    assert child.torchaudio.value is None
    assert child.apt == ("git",) and child.pip == ("einops==0.8.0",)
    assert child.extends_chain == ("nccl-override",)


def test_registry_env_var_overrides_path(monkeypatch, tmp_path):
    p = tmp_path / "other.yaml"
    p.write_text(MINIMAL)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(p))
    assert registry.load().path == p
    assert list(registry.load().environments) == ["e"]


def test_malformed_yaml():
    assert err("environments:\n  e: [\n").startswith("reg.yaml:3: malformed YAML")


def test_unknown_key_did_you_mean():
    msg = err(MINIMAL.replace('cuda: "12.1"', 'cudaa: "12.1"'))
    assert msg == "reg.yaml:4: environments.e.cudaa: unknown key 'cudaa' (did you mean 'cuda'?)"


def test_unknown_cluster_key_did_you_mean():
    msg = err(MINIMAL.replace("gpus_per_node: 2", "gpu_per_node: 2"))
    assert "clusters.c.gpu_per_node: unknown key 'gpu_per_node' (did you mean 'gpus_per_node'?)" in msg
    assert msg.startswith("reg.yaml:11:")


def test_wrong_type():
    msg = err(MINIMAL.replace("gpus_per_node: 2", "gpus_per_node: two"))
    assert msg.startswith("reg.yaml:11: clusters.c.gpus_per_node: expected integer, got str 'two'")


def test_wrong_enum():
    msg = err(MINIMAL.replace("os: ubuntu22.04", "os: ubuntu20.04"))
    assert msg == "reg.yaml:6: environments.e.os: 'ubuntu20.04' is not one of: ubuntu22.04, ubuntu24.04, ubuntu26.04, debian12"


def test_unknown_environment_name():
    reg = registry.load_text(MINIMAL)
    with pytest.raises(ShipyardError, match=r"unknown environment 'f' \(known: e\)"):
        reg.environment("f")


def test_cycle_in_extends():
    text = MINIMAL + "  # nothing\n"
    text = text.replace("environments:\n", "environments:\n  a: {extends: b}\n  b: {extends: a}\n")
    assert "environments.a.extends: cycle a -> b -> a" in err(text)


def test_unknown_parent():
    text = MINIMAL.replace("environments:\n", "environments:\n  a: {extends: ee}\n")
    assert "unknown environment 'ee' (did you mean 'e'?" in err(text)


def test_unpinned_pip_package():
    msg = err(MINIMAL.replace("os: ubuntu22.04", "os: ubuntu22.04\n    pip: [numpy>=1.0]"))
    assert msg == "reg.yaml:7: environments.e.pip[0]: 'numpy>=1.0' is not pinned: extra pip packages must be exact, NAME==VERSION"


def test_version_that_does_not_exist():
    msg = err(MINIMAL.replace('torch: "2.3.1"', 'torch: "2.3.7"'))
    assert msg == "reg.yaml:3: environments.e.torch: torch 2.3.7 does not exist (known: 2.3.0, 2.3.1)"
    msg = err(MINIMAL.replace('cuda: "12.1"', 'cuda: "12.7"'))
    assert msg.startswith("reg.yaml:4: environments.e.cuda: CUDA 12.7 is not a known CUDA release")


def test_number_instead_of_version_string():
    msg = err(MINIMAL.replace('cuda: "12.1"', "cuda: 12.1"))
    assert msg.startswith("reg.yaml:4: environments.e.cuda: expected string, got float 12.1")


def test_missing_required_field():
    msg = err(MINIMAL.replace('    python: "3.11"\n', ""))
    assert msg == "reg.yaml:2: environments.e: 'python' is required (directly or through extends)"


def test_duplicate_key():
    assert "duplicate key" in err(MINIMAL.replace('cuda: "12.1"', 'cuda: "12.1"\n    cuda: "11.8"'))


def test_bad_default():
    msg = err(MINIMAL + "defaults:\n  environment: ee\n")
    assert msg.startswith("reg.yaml:14: defaults.environment: unknown environment 'ee' (did you mean 'e'?")


def test_not_a_mapping_and_empty():
    assert "must be a mapping" in err("- a\n- b\n")
    assert "must be a mapping" in err("")


def test_missing_file(tmp_path):
    with pytest.raises(ShipyardError, match="registry not found"):
        registry.load(tmp_path / "nope.yaml")


def test_readme_registry_example_is_valid():
    """docs/registry.md's registry example must load and check clean: docs that users copy stay true."""
    import re

    from shipyard.registry import compat

    text = (ROOT / "docs" / "registry.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    reg = registry.load_text(block, "docs/registry.md")
    assert set(reg.environments) == {"pytorch-2.3", "pytorch-2.3-dev"}
    assert [p for p in compat.check_all(reg) if p.severity == compat.ERROR] == []


def test_the_local_sandbox_is_a_key_of_its_profile_not_its_name():
    """`local_sandbox: true` marks the machine's sandbox; a cluster called sandbox without it is a cluster like any
    other, and a sandbox profile under another name is the sandbox."""
    from shipyard import slurm

    reg = registry.load(ROOT / "registry.yaml")
    assert reg.sandbox_cluster().name == "sandbox" and slurm.is_sandbox(reg.cluster("sandbox"))
    assert not any(slurm.is_sandbox(c) for n, c in reg.clusters.items() if n != "sandbox")
    text = (ROOT / "registry.yaml").read_text()
    plain = registry.load_text(text.replace("    local_sandbox: true\n", ""), "reg.yaml")
    assert not slurm.is_sandbox(plain.cluster("sandbox")) and slurm.route(plain.cluster("sandbox"), ["squeue"]) == \
        (["squeue"], None)
    with pytest.raises(ShipyardError, match="no cluster has local_sandbox: true"):
        plain.sandbox_cluster()
    renamed = registry.load_text(text.replace("\n  sandbox:\n", "\n  laptop:\n").replace(
        "cluster: sandbox", "cluster: laptop"), "reg.yaml")
    assert renamed.sandbox_cluster().name == "laptop" and slurm.is_sandbox(renamed.cluster("laptop"))


def test_only_one_cluster_can_be_the_local_sandbox():
    text = (ROOT / "registry.yaml").read_text().replace("    runtime: apptainer\n",
                                                        "    runtime: apptainer\n    local_sandbox: true\n", 1)
    msg = err(text)
    assert "local_sandbox: only one cluster can be this machine's sandbox (clusters.sandbox is)" in msg, msg
