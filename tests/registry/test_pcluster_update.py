"""`invoke cluster.import-pcluster CONFIG --update NAME`, and the EFA review of an import: a published
ParallelCluster config (tests/data/pcluster/, sources in SOURCES.md) imported, the profile edited by hand, the config
edited, and the config re-read into the profile: the user's keys, comments and quoting stay, queues, instance types
and EFA follow the config, and nothing is written without --yes. An EFA-capable instance on a queue that does not
enable EFA gets a review line at import and a WARN from `check`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from helpers_registry import GOLDEN, golden

from shipyard import registry
from shipyard.commands import pcluster as pcluster_commands
from shipyard.errors import ShipyardError
from shipyard.registry import compat, fabric_checks, pcluster

DATA = Path(__file__).resolve().parents[1] / "data" / "pcluster"
COURSE = """\
# The course's registry (a comment of the user's: kept byte for byte)
environments:
  course: {torch: "2.5.1", cuda: "12.4", python: "3.11", os: ubuntu22.04}

clusters:
  lab:
    runtime: host
    fabric: socket
    gpus_per_node: 0
    scheduler: {partition: cpu, partitions: [cpu]}

defaults:
  environment: course
"""
P4DE = (DATA / "awsome-p4de-g5.yaml").read_text()
EFA_ON = "          Efa:\n            Enabled: true\n"


def run(config: str, tmp: Path, **kw) -> tuple[int, str]:
    out = io.StringIO()
    rc = pcluster_commands.import_pcluster(config, registry_path="registry.yaml", out=out, **kw)
    return rc, out.getvalue()


def edited_config() -> str:
    """awsome-p4de-g5.yaml as an instructor edits it mid-term: the inference queue on bigger g5 nodes, a new
    training queue, and EFA dropped from the p4de queue."""
    assert P4DE.count(EFA_ON) == 1 and P4DE.count("InstanceType: g5.12xlarge") == 1
    text = P4DE.replace(EFA_ON, "").replace("InstanceType: g5.12xlarge", "InstanceType: g5.24xlarge")
    new_queue = ("    - Name: train-l40s\n      ComputeResources:\n        - Name: g6e\n          Instances:\n"
                 "            - InstanceType: g6e.48xlarge\n          Efa:\n            Enabled: true\n")
    return text.replace("SharedStorage:", new_queue + "SharedStorage:", 1)


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A course folder whose registry has awsome-p4de-g5.yaml imported as `pc`, then edited by hand: a driver with
    its comment, a Slurm account, a comment above the scheduler, a MIG profile and a quoted time limit on a queue,
    the storage moved."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "registry.yaml").write_text(COURSE)
    (tmp_path / "cluster-config.yaml").write_text(P4DE)
    assert run("cluster-config.yaml", tmp_path, name="pc", runtime="pyxis", yes=True)[0] == 0
    text = (tmp_path / "registry.yaml").read_text()
    for old, new in (
        ("    fabric: efa\n    gpus_per_node: 8\n",
         '    fabric: efa\n    driver: "580.95.05"   # nvidia-smi on a p4de node\n    gpus_per_node: 8\n'),
        ("    scheduler:\n      partition: compute-gpu\n",
         "    # queues as ParallelCluster has them\n    scheduler:\n      partition: compute-gpu\n"),
        ("      build_partition: compute-gpu\n", "      build_partition: compute-gpu\n      account: course42\n"),
        ("          exclusive: false\n", "          exclusive: false\n          max_time: '04:00:00'\n"
                                       "          mig: 1g.10gb\n"),
        ("    storage: /fsx/shipyard/images\n", "    storage: /fsx/gpu-course/images\n"),
        ("    binds: ['/fsx:/fsx', '/apps:/apps']\n", "    binds: ['/fsx:/fsx', '/apps:/apps', /scratch]\n"),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (tmp_path / "registry.yaml").write_text(text)
    (tmp_path / "cluster-config.yaml").write_text(edited_config())
    return tmp_path


def test_update_shows_the_diff_and_writes_nothing_without_yes(course):
    before = (course / "registry.yaml").read_bytes()
    rc, out = run("cluster-config.yaml", course, update="pc")
    assert rc == 0 and out.endswith("nothing written; add --yes to write clusters.pc into registry.yaml\n")
    assert (course / "registry.yaml").read_bytes() == before
    assert sorted(p.name for p in course.iterdir()) == ["cluster-config.yaml", "registry.yaml"]  # no temp left
    golden(GOLDEN / "pcluster" / "update.txt", out)


def test_update_with_yes_keeps_the_users_keys_and_follows_the_config(course):
    hand = (course / "registry.yaml").read_text()
    rc, out = run("cluster-config.yaml", course, update="pc", yes=True)
    assert rc == 0 and "wrote clusters.pc into registry.yaml (3 partitions)" in out
    text = (course / "registry.yaml").read_text()
    # the user's lines, byte for byte: comments, quoting, the keys the import would not write
    for line in ('    driver: "580.95.05"   # nvidia-smi on a p4de node\n',
                 "    # queues as ParallelCluster has them\n",
                 "      account: course42\n", "          max_time: '04:00:00'\n", "          mig: 1g.10gb\n",
                 "    storage: /fsx/gpu-course/images\n", "# The course's registry (a comment of the user's: kept "):
        assert line in text, line
    assert text.split("\nclusters:\n")[0] == hand.split("\nclusters:\n")[0]
    assert text.split("\ndefaults:\n")[1] == hand.split("\ndefaults:\n")[1]
    cl = registry.load("registry.yaml").cluster("pc")
    assert cl.partitions == ("compute-gpu", "inference-gpu", "train-l40s") and cl.driver == "580.95.05"
    assert cl.account == "course42" and cl.storage == "/fsx/gpu-course/images" and cl.runtime == "pyxis"
    assert cl.binds == ("/fsx:/fsx", "/apps:/apps", "/scratch")
    inf, gpu, l40s = (cl.partition_info(p) for p in ("inference-gpu", "compute-gpu", "train-l40s"))
    assert (inf.instance_type, inf.gpus_per_node, inf.cpus_per_node, inf.mig, inf.max_time) == \
        ("g5.24xlarge", 4, 96, "1g.10gb", "04:00:00")
    assert (gpu.fabric, l40s.fabric, l40s.gpus_per_node) == ("socket", "efa", 8)
    # a second update of the same config has nothing to do
    rc, again = run("cluster-config.yaml", course, update="pc", yes=True)
    assert rc == 0 and again.endswith("clusters.pc already says what cluster-config.yaml says: nothing to write\n")
    assert (course / "registry.yaml").read_text() == text


def test_a_queue_removed_from_the_config_goes_with_its_keys(course):
    text = (course / "cluster-config.yaml").read_text()
    start, end = text.index("    - Name: inference-gpu\n"), text.index("    - Name: train-l40s\n")
    (course / "cluster-config.yaml").write_text(text[:start] + text[end:])
    rc, out = run("cluster-config.yaml", course, update="pc", yes=True)
    assert rc == 0 and "-        inference-gpu:\n" in out and "mig" not in (course / "registry.yaml").read_text()
    assert registry.load("registry.yaml").cluster("pc").partitions == ("compute-gpu", "train-l40s")


def test_update_names_are_checked_in_one_line_and_nothing_is_written(course):
    before = (course / "registry.yaml").read_bytes()
    for update, msg in (("nope", "--update 'nope': registry.yaml has no clusters.nope (known: lab, pc); import "
                                 "without --update to add it"),
                        ("a b", "--update 'a b': use letters, digits, '.', '_' and '-'")):
        with pytest.raises(ShipyardError) as e:
            run("cluster-config.yaml", course, update=update, yes=True)
        assert str(e.value) == msg
    with pytest.raises(ShipyardError, match="--name 'x' and --update 'pc'"):
        run("cluster-config.yaml", course, update="pc", name="x", yes=True)
    assert (course / "registry.yaml").read_bytes() == before


def test_update_through_the_cli_exit_codes(course, invoke):
    bad = invoke("cluster.import-pcluster", "cluster-config.yaml", "--update", "nope", cwd=course)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--update 'nope'" in bad.stderr
    dry = invoke("cluster.import-pcluster", "cluster-config.yaml", "--update", "pc", cwd=course)
    assert dry.returncode == 0 and "nothing written; add --yes" in dry.stdout, dry.stderr


def test_an_existing_profile_is_refused_naming_update(course):
    with pytest.raises(ShipyardError) as e:
        run("cluster-config.yaml", course, name="pc", runtime="pyxis", yes=True)
    assert "clusters.pc already exists; pass --update pc to re-read the config into it" in str(e.value)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ EFA left off


def test_efa_capable_types_come_from_the_data():
    assert [fabric_checks.efa_capable(t) for t in ("p5.48xlarge", "p4de.24xlarge", "g5.48xlarge", "g6e.12xlarge",
                                                   "g5.2xlarge", "c5.2xlarge", "x9.mega", None)] == \
        [True, True, True, True, False, False, False, False]


def test_p5_queue_without_efa_gets_a_review_line_and_a_check_warn(tmp_path, monkeypatch):
    """awsome-p5-base.yaml (aws-samples, see SOURCES.md) with its `Efa: Enabled: true` dropped."""
    text = (DATA / "awsome-p5-base.yaml").read_text()
    assert text.count(EFA_ON) == 1
    monkeypatch.chdir(tmp_path)
    (tmp_path / "registry.yaml").write_text(COURSE)
    (tmp_path / "p5.yaml").write_text(text.replace(EFA_ON, ""))
    rc, out = run("p5.yaml", tmp_path, name="aws", yes=True)
    assert rc == 0
    assert ("  - clusters.aws.scheduler.partitions.compute-gpu.fabric: queue compute-gpu: p5.48xlarge supports EFA "
            "but the queue does not enable it; fabric set to socket (NCCL over TCP) - enable Efa in the cluster "
            "config (ComputeResources: Efa: Enabled: true) and import again, or confirm\n") in out
    problems = [p for p in compat.check_all(registry.load("registry.yaml")) if "supports EFA" in p.message]
    assert [(p.severity, p.key) for p in problems] == \
        [("WARN", "clusters.aws.scheduler.partitions.compute-gpu.fabric")]
    assert problems[0].message.startswith("partition compute-gpu: p5.48xlarge supports EFA but the fabric is socket")
    # the config as published enables EFA: no review line, no warning
    p = pcluster.profile(text, "p5.yaml")
    assert not [n for n in pcluster.review(text, "p5.yaml", "aws", p) if "supports EFA" in n]


def test_check_warns_once_for_a_cluster_wide_socket_fabric_on_an_efa_instance():
    reg = registry.load_text(COURSE.replace(
        "  lab:\n", "  cloud:\n    runtime: pyxis\n    fabric: socket\n    instance_type: p4d.24xlarge\n"
        "    gpus_per_node: 8\n    gpus: [{model: A100, arch: sm_80}]\n    driver: \"580.95.05\"\n"
        "    scheduler: {partition: a, partitions: [a, b]}\n  lab:\n"))
    got = [(p.severity, p.key) for p in compat.check_all(reg) if "supports EFA" in p.message]
    assert got == [("WARN", "clusters.cloud.fabric")]


# ------------------------------------------------------------------------------------------------ registry layouts


@pytest.mark.parametrize("layout", ["four-space", "last-in-file"])
def test_update_keeps_the_registry_layout(layout, tmp_path, monkeypatch):
    """A registry indented by four spaces, and one whose profile is the last thing in the file (no newline at its
    end): the profile is rewritten at its own indentation, every other line as it was."""
    monkeypatch.chdir(tmp_path)
    base = COURSE.replace("\n  ", "\n    ").replace("\n      ", "\n        ") if layout == "four-space" else \
        COURSE.split("\ndefaults:")[0].replace("environments:", "defaults: {environment: course}\nenvironments:")
    (tmp_path / "registry.yaml").write_text(base)
    (tmp_path / "c.yaml").write_text(P4DE)
    assert run("c.yaml", tmp_path, name="pc", runtime="pyxis", yes=True)[0] == 0
    text = (tmp_path / "registry.yaml").read_text()
    if layout == "last-in-file":
        text = text.rstrip("\n")
    text = text.replace("exclusive: false\n", "exclusive: false\n" + " " * (10 if layout == "last-in-file" else 20)
                        + "mig: 1g.10gb\n", 1)
    (tmp_path / "registry.yaml").write_text(text)
    (tmp_path / "c.yaml").write_text(edited_config())
    assert run("c.yaml", tmp_path, update="pc", yes=True)[0] == 0
    after = (tmp_path / "registry.yaml").read_text()
    head = text.split("  pc:\n")[0]
    assert after.startswith(head) and after.count("mig: 1g.10gb") == 1
    cl = registry.load("registry.yaml").cluster("pc")
    assert cl.partitions == ("compute-gpu", "inference-gpu", "train-l40s")
    assert cl.partition_info("inference-gpu").mig == "1g.10gb"
    if layout == "four-space":
        assert "\n    pc:\n        description:" in after and after.endswith(base.split("\ndefaults:")[1])


def test_a_flow_style_clusters_mapping_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "registry.yaml").write_text(
        'environments: {course: {torch: "2.5.1", cuda: "12.4", python: "3.11", os: ubuntu22.04}}\n'
        "clusters: {lab: {runtime: host, fabric: socket, gpus_per_node: 0, scheduler: {partition: cpu, partitions: "
        "[cpu]}}}\n")
    (tmp_path / "c.yaml").write_text(P4DE)
    assert run("c.yaml", tmp_path, name="pc", runtime="pyxis", yes=True)[0] == 0  # a flow entry is added
    before = (tmp_path / "registry.yaml").read_bytes()
    with pytest.raises(ShipyardError) as e:
        run("c.yaml", tmp_path, update="pc", yes=True)
    assert "write it in block style" in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "registry.yaml").read_bytes() == before
