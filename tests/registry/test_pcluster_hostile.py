"""The ParallelCluster import under hostile or unusual input: YAML 1.2 scalars, "false"
strings, no anchors (a second and a third import), duplicate queues, 4-space and flow-style registries, a symlinked
registry.yaml, MountDirs with colons, and ten malformed configs each one line with its key path. Every test here
failed on e0c4781 (checked by running this file against that commit's shipyard/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard import registry
from shipyard.commands import pcluster as pcluster_commands
from shipyard.errors import ShipyardError
from shipyard.registry import pcluster

DATA = Path(__file__).resolve().parents[1] / "data" / "pcluster"
REPO = Path(__file__).resolve().parents[2]
BASE = """\
Scheduling:
  Scheduler: slurm
  SlurmQueues:
    - Name: gpu
      JobExclusiveAllocation: "false"
      CustomSlurmSettings:
        MaxTime: 24:00:00
      ComputeResources:
        - Name: g5
          Efa:
            Enabled: "false"
          Instances:
            - InstanceType: g5.2xlarge
"""


def _import(cfg_text: str, reg: Path, name: str) -> None:
    cfg = reg.parent / f"{name}.yaml"
    cfg.write_text(cfg_text)
    assert pcluster_commands.import_pcluster(str(cfg), name, str(reg), yes=True, runtime="pyxis",
                                             out=open("/dev/null", "w")) == 0


def test_times_stay_strings_and_false_strings_are_false():
    q = pcluster.profile(BASE, "c.yaml", "pyxis")["scheduler"]["partitions"]["gpu"]
    assert q["max_time"] == "24:00:00"  # not base-60 86400 (which Slurm reads as 60 days)
    assert q["exclusive"] is False and q["fabric"] == "socket"


def test_a_second_and_a_third_import_into_the_same_registry_both_work(tmp_path):
    reg = tmp_path / "registry.yaml"
    reg.write_text((REPO / "registry.yaml").read_text())
    for name in ("one", "two", "three"):
        _import((DATA / "three-queues.yaml").read_text(), reg, name)
    assert "&id" not in reg.read_text() and "*id" not in reg.read_text()
    assert {"one", "two", "three"} <= set(registry.load(reg).clusters)


def test_duplicate_queue_names_are_refused_not_merged():
    text = BASE + BASE.split("  SlurmQueues:\n", 1)[1]
    with pytest.raises(ShipyardError, match=r"c\.yaml:\d+: Scheduling\.SlurmQueues\[1\]\.Name: queue 'gpu' is "
                                            "defined twice"):
        pcluster.profile(text, "c.yaml")


def _four_spaces(text: str) -> str:
    return "\n".join((" " * (2 * (len(ln) - len(ln.lstrip(" "))))) + ln.lstrip(" ") for ln in text.splitlines()) + "\n"


def test_registries_indented_by_four_spaces_or_with_flow_clusters_are_accepted(tmp_path):
    reg = tmp_path / "registry.yaml"
    reg.write_text(_four_spaces((REPO / "registry.yaml").read_text()))
    registry.load(reg)  # still a valid registry
    _import(BASE, reg, "four")
    assert registry.load(reg).cluster("four").partitions == ("gpu",)
    flow = tmp_path / "flow" / "registry.yaml"
    flow.parent.mkdir()
    flow.write_text("environments:\n  e: {torch: '2.3.1', cuda: '12.1', python: '3.11', os: ubuntu22.04}\n"
                    "clusters: {c: {runtime: host, fabric: socket, gpus_per_node: 0, scheduler: {partition: p}}}\n")
    _import(BASE, flow, "fl")
    assert set(registry.load(flow).clusters) == {"c", "fl"}


def test_a_symlinked_registry_is_written_through_to_its_target(tmp_path):
    target = tmp_path / "real" / "registry.yaml"
    target.parent.mkdir()
    target.write_text((REPO / "registry.yaml").read_text())
    link = tmp_path / "registry.yaml"
    link.symlink_to(target)
    _import(BASE, link, "vialink")
    assert link.is_symlink() and "vialink:" in target.read_text()


def test_a_mount_dir_with_a_colon_is_refused():
    text = BASE + "SharedStorage:\n  - MountDir: /fsx:/etc\n    StorageType: FsxLustre\n"
    with pytest.raises(ShipyardError, match=r"c\.yaml:\d+: SharedStorage\[0\]\.MountDir: '/fsx:/etc': an absolute"):
        pcluster.profile(text, "c.yaml")


MALFORMED = [  # (replace in BASE, or append) -> the key path the one line names
    (("  SlurmQueues:\n", "  SlurmQueues:\n    - just-a-name\n"), "Scheduling.SlurmQueues[0]"),
    (("      ComputeResources:\n", "      ComputeResources: 3\n      X:\n"), "Scheduling.SlurmQueues[0].ComputeResources"),
    (("        - Name: g5\n", "        - g5\n        - Name: g5\n"), "Scheduling.SlurmQueues[0].ComputeResources[0]"),
    (("            - InstanceType: g5.2xlarge", "            - g5.2xlarge"),
     "Scheduling.SlurmQueues[0].ComputeResources[0].Instances[0]"),
    (("          Instances:", "          Instances: {}\n          X:"),
     "Scheduling.SlurmQueues[0].ComputeResources[0].Instances"),
    (("          Efa:\n            Enabled: \"false\"", "          Efa: yes-please"),
     "Scheduling.SlurmQueues[0].ComputeResources[0].Efa"),
    (('Enabled: "false"', "Enabled: maybe"), "Scheduling.SlurmQueues[0].ComputeResources[0].Efa.Enabled"),
    (("        - Name: g5\n", "        - Name: g5\n          SchedulableMemory: lots\n"),
     "Scheduling.SlurmQueues[0].ComputeResources[0].SchedulableMemory"),
    (("      CustomSlurmSettings:\n        MaxTime: 24:00:00", "      CustomSlurmSettings: [MaxTime]"),
     "Scheduling.SlurmQueues[0].CustomSlurmSettings"),
    (("", "SharedStorage: {MountDir: /fsx}\n"), "SharedStorage"),
    (("", "SharedStorage:\n  - [MountDir, /fsx]\n"), "SharedStorage[0]"),
    (("- Name: gpu", "- Name: [gpu]"), "Scheduling.SlurmQueues[0].Name"),
]


@pytest.mark.parametrize("edit,path", MALFORMED, ids=[p for _, p in MALFORMED])
def test_malformed_configs_are_one_line_with_the_key_path(edit, path):
    old, new = edit
    text = BASE.replace(old, new, 1) if old else BASE + new
    assert text != BASE
    with pytest.raises(ShipyardError) as exc:
        pcluster.profile(text, "c.yaml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("c.yaml:") and f" {path}:" in msg, msg
