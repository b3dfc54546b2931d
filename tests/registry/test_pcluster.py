"""`invoke cluster.import-pcluster`: real ParallelCluster configs (tests/data/pcluster/, sources in SOURCES.md) read
into cluster profiles, inserted into registry.yaml without touching the user's text, and launchers written from
the imported partitions."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_launch import build_launcher

from shipyard import registry
from shipyard.commands import pcluster as pcluster_commands
from shipyard.errors import ShipyardError
from shipyard.launch import launcher as launch
from shipyard.registry import compat, pcluster

DATA = Path(__file__).resolve().parents[1] / "data" / "pcluster"
REPO = Path(__file__).resolve().parents[2]


def prof(name: str, runtime: str | None = None) -> dict:
    return pcluster.profile((DATA / name).read_text(), str(DATA / name), runtime)


def parts(p: dict) -> dict:
    return p["scheduler"]["partitions"]


# ------------------------------------------------------------------------------------------------ reading real configs
# Expected values are worked out by hand in tests/data/pcluster/SOURCES.md.


def test_p4de_and_g5_queues_with_the_older_instancetype_key():
    p = prof("awsome-p4de-g5.yaml", runtime="pyxis")
    gpu, inf = parts(p)["compute-gpu"], parts(p)["inference-gpu"]
    assert (gpu["instance_type"], gpu["gpus_per_node"], gpu["gpus"], gpu["cpus_per_node"], gpu["mem_per_node"],
            gpu["fabric"], gpu["line_rate_gbps"], gpu["exclusive"]) == \
        ("p4de.24xlarge", 8, [{"model": "A100", "arch": "sm_80"}], 96, "1120665M", "efa", 400, True)
    assert (inf["instance_type"], inf["gpus_per_node"], inf["gpus"], inf["cpus_per_node"], inf["mem_per_node"],
            inf["fabric"], inf["line_rate_gbps"], inf["exclusive"]) == \
        ("g5.12xlarge", 4, [{"model": "A10G", "arch": "sm_86"}], 48, "186777M", "socket", 40, False)
    assert p["scheduler"]["partition"] == "compute-gpu" and p["runtime"] == "pyxis"
    assert p["binds"] == ["/fsx:/fsx", "/apps:/apps"] and p["storage"] == "/fsx/shipyard/images"


def test_a_gpu_cluster_never_gets_a_silent_host_runtime(tmp_path):
    """Its scripts install neither pyxis nor Apptainer: the import asks for --runtime, in one line, writing nothing."""
    with pytest.raises(ShipyardError, match=r"awsome-p4de-g5.yaml: no post-install script .* pass --runtime pyxis"):
        prof("awsome-p4de-g5.yaml")
    reg = tmp_path / "registry.yaml"
    reg.write_text((REPO / "registry.yaml").read_text())
    with pytest.raises(ShipyardError, match="--runtime"):
        pcluster_commands.import_pcluster(str(DATA / "awsome-p4de-g5.yaml"), "pc", str(reg), yes=True)
    assert reg.read_text() == (REPO / "registry.yaml").read_text()
    assert prof("awsome-p4de-g5.yaml", runtime="host")["runtime"] == "host"  # chosen, not silent
    with pytest.raises(ShipyardError, match="--runtime 'docker': use one of apptainer, pyxis, charliecloud, host"):
        prof("awsome-p4de-g5.yaml", runtime="docker")
    # every runtime a profile may name can be chosen, the one added last included
    assert prof("awsome-p4de-g5.yaml", runtime="charliecloud")["runtime"] == "charliecloud"


def test_review_lists_what_the_config_cannot_say():
    text = (DATA / "awsome-p5-base.yaml").read_text()
    p = pcluster.profile(text, "p5.yaml")
    newest = pcluster.current_efa_installer()
    assert p["fabric_options"]["efa_installer"] == newest
    notes = pcluster.review(text, "p5.yaml", "aws", p)
    assert notes[0] == "clusters.aws.runtime: pyxis (a post-install script installs it)"
    keys = [n.split(":", 1)[0] for n in notes]
    assert keys == ["clusters.aws.runtime", "clusters.aws.driver", "clusters.aws.scheduler.account",
                    "clusters.aws.login", "clusters.aws.fabric_options.efa_installer"]
    assert newest in notes[-1]
    cpu = (DATA / "aws-parallelcluster-slurm-required.yaml").read_text()
    cp = pcluster.profile(cpu, "cpu.yaml")
    assert "efa_installer" not in cp["fabric_options"]
    assert [n.split(":", 1)[0] for n in pcluster.review(cpu, "cpu.yaml", "c", cp)] == \
        ["clusters.c.runtime", "clusters.c.scheduler.account", "clusters.c.login"]


def test_p5_with_pyxis_post_install_script():
    p = prof("awsome-p5-base.yaml")
    assert list(parts(p)) == ["compute-gpu"]
    q = parts(p)["compute-gpu"]
    assert (q["gpus_per_node"], q["gpus"], q["cpus_per_node"], q["mem_per_node"], q["fabric"], q["line_rate_gbps"],
            q["exclusive"]) == (8, [{"model": "H100", "arch": "sm_90"}], 192, "1992294M", "efa", 3200, True)
    assert p["runtime"] == "pyxis" and p["binds"] == ["/apps:/apps"] and p["storage"] == "/apps/shipyard/images"


def test_placeholders_and_home_on_shared_storage_is_not_bound():
    p = prof("awsome-cluster-vanilla.yaml")
    assert p["runtime"] == "pyxis" and p["binds"] == ["/fsx:/fsx"] and p["storage"] == "/fsx/shipyard/images"
    assert parts(p)["compute-gpu"]["fabric"] == "efa"


def test_minimal_cpu_only_config():
    p = prof("aws-parallelcluster-slurm-required.yaml")
    q = parts(p)["queue1"]
    assert (q["gpus_per_node"], q["gpus"], q["cpus_per_node"], q["mem_per_node"], q["fabric"]) == \
        (0, [], 8, "15564M", "socket")
    assert "binds" not in p and p["storage"] == "/home/shipyard/images" and p["runtime"] == "host"


def test_several_compute_resources_take_what_every_node_has(tmp_path):
    text = (DATA / "three-queues.yaml").read_text().replace(
        "        - Name: g5-2xl           # 1 x A10G, 8 vCPUs\n          Instances:\n            - InstanceType: g5.2xlarge\n",
        "        - Name: g5-2xl\n          Instances:\n            - InstanceType: g5.2xlarge\n"
        "        - Name: g6-4xl\n          DisableSimultaneousMultithreading: true\n          Instances:\n"
        "            - InstanceType: g6.4xlarge\n")
    q = parts(pcluster.profile(text, "c.yaml"))["a10"]
    # g5.2xlarge: 8 vCPUs; g6.4xlarge: 16 vCPUs, 8 without SMT -> 8; models: both; one instance type: none
    assert q["cpus_per_node"] == 8 and q["gpus"] == [{"model": "A10G", "arch": "sm_86"}, {"model": "L4", "arch": "sm_89"}]
    assert "instance_type" not in q and q["gpus_per_node"] == 1


# ------------------------------------------------------------------------------------------------ bad configs


def test_invalid_yaml_is_one_line_with_its_line_number(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("Scheduling:\n  Scheduler: slurm\n  SlurmQueues:\n    - Name: q\n   ComputeResources: [\n")
    with pytest.raises(ShipyardError) as e:
        pcluster_commands.import_pcluster(str(bad), registry_path=str(tmp_path / "registry.yaml"))
    assert str(e.value).startswith(f"{bad}:5: malformed YAML") and "\n" not in str(e.value)


def test_unknown_instance_type_names_it_and_writes_nothing(tmp_path):
    reg = tmp_path / "registry.yaml"
    reg.write_text((REPO / "registry.yaml").read_text())
    before = reg.read_bytes()
    cfg = tmp_path / "c.yaml"
    cfg.write_text((DATA / "three-queues.yaml").read_text().replace("g5.2xlarge", "x9.mega"))
    with pytest.raises(ShipyardError, match=r"c\.yaml:\d+: instance type 'x9\.mega' is not in shipyard/data/ec2\.yaml"):
        pcluster_commands.import_pcluster(str(cfg), registry_path=str(reg), yes=True)
    assert reg.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "registry.yaml"]


def test_existing_profile_name_is_refused(tmp_path):
    reg = tmp_path / "registry.yaml"
    reg.write_text((REPO / "registry.yaml").read_text())
    with pytest.raises(ShipyardError, match="clusters.grete already exists"):
        pcluster_commands.import_pcluster(str(DATA / "three-queues.yaml"), "grete", str(reg), yes=True)


# ------------------------------------------------------------------------------------------------ done when


@pytest.fixture
def imported(tmp_path):
    """The project's registry.yaml with three-queues.yaml imported as cluster `pc` (through the real CLI)."""
    from fixtures_invoke import invoke_cli

    reg = tmp_path / "registry.yaml"
    reg.write_text((REPO / "registry.yaml").read_text())
    res = invoke_cli("cluster.import-pcluster", str(DATA / "three-queues.yaml"), "--name", "pc", "--registry",
                     str(reg), "--yes", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"+++ {reg} (with clusters.pc)" in res.stdout and "wrote clusters.pc" in res.stdout
    assert "review (the config cannot say these):\n  - clusters.pc.runtime: pyxis" in res.stdout
    return reg


def test_import_keeps_the_users_text_and_validates(imported):
    before = (REPO / "registry.yaml").read_text().splitlines()
    after = imported.read_text().splitlines()
    added = len(after) - len(before)
    i = next(n for n, (a, b) in enumerate(zip(before, after)) if a != b)
    assert after[:i] == before[:i] and after[i + added:] == before[i:]  # one block inserted, every other line kept
    assert "# yaml-language-server" in after[0] and any("registries:" == ln for ln in after[i + added:])
    cl = registry.load(imported).cluster("pc")
    assert cl.partitions == ("cpu", "a10", "h100") and cl.runtime == "pyxis"
    assert (cl.partition, cl.interactive_partition, cl.build_partition) == ("h100", "a10", "cpu")


def test_three_queues_launch_with_their_own_gpus_cpus_and_fabric(imported, tmp_path):
    reg = registry.load(imported)
    (tmp_path / "train.py").write_text("")
    got = {}
    for part in ("cpu", "a10", "h100"):
        l = build_launcher(reg, cluster="pc", partition=part, command=("train.py",), workdir=tmp_path)
        text = launch.render(l)
        got[part] = (l.gpus_per_node, l.cpus_per_task, l.fabric, l.exclusive, "FI_PROVIDER" in text,
                     "#SBATCH --exclusive" in text, f"#SBATCH --partition={part}" in text)
    assert got == {
        "cpu": (0, 36, "socket", False, False, False, True),
        "a10": (1, 8, "socket", False, False, False, True),
        "h100": (8, 192, "efa", True, True, True, True),
    }
    # a 4-GPU job on the p5 queue still gets whole nodes (JobExclusiveAllocation); nccl-test follows the fabric
    half = build_launcher(reg, cluster="pc", partition="h100", gpus_per_node=4, command=("train.py",), workdir=tmp_path)
    assert (half.cpus_per_task, half.exclusive, half.mem) == (192, True, None)
    nccl = build_launcher(reg, cluster="pc", partition="a10", kind="nccl-test")
    assert nccl.fabric == "socket" and not any(v.name.startswith("FI_") for v in nccl.env)


def test_check_uses_each_partitions_gpus_and_keys_the_partition():
    text = """
environments:
  old: {torch: "2.3.1", cuda: "12.1", python: "3.11", os: ubuntu22.04}
clusters:
  mixed:
    runtime: pyxis
    fabric: socket
    gpus_per_node: 4
    gpus: [{model: A100, arch: sm_80}]
    driver: "580.95.05"
    scheduler:
      partition: a100
      partitions:
        a100:
        b200: {gpus: [{model: B200, arch: sm_100}], fabric: efa}
"""

    problems = compat.check_all(registry.load_text(text))
    errors = {(p.key, p.severity) for p in problems if p.severity == compat.ERROR}
    assert ("clusters.mixed.scheduler.partitions.b200.gpus", compat.ERROR) in errors
    assert not any(k.startswith("clusters.mixed.gpus") for k, _ in errors)  # A100 runs torch 2.3.1


def test_blackwell_instances_p6_and_g7e_are_known():
    """P6 (B200/B300) and G7e (RTX PRO 6000) queues import with their GPUs, arch, CPUs and EFA."""
    queues = "".join(
        f"    - Name: {name}\n      Networking: {{SubnetIds: [subnet-12345678]}}\n      ComputeResources:\n"
        f"        - Name: {name}-cr\n          InstanceType: {itype}\n          Efa: {{Enabled: true}}\n"
        for name, itype in (("b200", "p6-b200.48xlarge"), ("b300", "p6-b300.48xlarge"), ("g7e", "g7e.48xlarge")))
    text = ("HeadNode:\n  InstanceType: c5.xlarge\n  Networking: {SubnetId: subnet-12345678}\n"
            "Scheduling:\n  Scheduler: slurm\n  SlurmQueues:\n" + queues)
    got = {n: (q["gpus_per_node"], q["gpus"], q["cpus_per_node"], q["fabric"], q["line_rate_gbps"])
           for n, q in parts(pcluster.profile(text, "c.yaml", "pyxis")).items()}
    assert got == {
        "b200": (8, [{"model": "B200", "arch": "sm_100"}], 192, "efa", 3200),
        "b300": (8, [{"model": "B300", "arch": "sm_103"}], 192, "efa", 6400),
        "g7e": (8, [{"model": "RTX PRO 6000", "arch": "sm_120"}], 192, "efa", 1600),
    }


def test_g7_queues_import_with_the_rtx_pro_4500_and_their_network():
    """AWS's G7 (What's New 2026-06 and the G7 page, secondary copy): RTX PRO 4500 Blackwell (sm_120), 8 GPUs, 192
    vCPUs and 700 Gbps EFA on g7.48xlarge; 2 GPUs and 175 Gbps on g7.12xlarge."""
    queues = "".join(
        f"    - Name: {name}\n      Networking: {{SubnetIds: [subnet-12345678]}}\n      ComputeResources:\n"
        f"        - Name: {name}-cr\n          InstanceType: {itype}\n          Efa: {{Enabled: true}}\n"
        for name, itype in (("big", "g7.48xlarge"), ("mid", "g7.12xlarge")))
    text = ("HeadNode:\n  InstanceType: c5.xlarge\n  Networking: {SubnetId: subnet-12345678}\n"
            "Scheduling:\n  Scheduler: slurm\n  SlurmQueues:\n" + queues)
    got = {n: (q["gpus_per_node"], q["gpus"], q["cpus_per_node"], q["fabric"], q["line_rate_gbps"])
           for n, q in parts(pcluster.profile(text, "c.yaml", "pyxis")).items()}
    g = [{"model": "RTX PRO 4500", "arch": "sm_120"}]
    assert got == {"big": (8, g, 192, "efa", 700), "mid": (2, g, 48, "efa", 175)}
    assert "RTX PRO 4500" in compat.facts()["arches"][120]["gpus"]
