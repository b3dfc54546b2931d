"""A sweep on the real sandbox: 4 combinations, at most 2 at once, every task COMPLETED, each log naming
its combination, the values intact in argv; a resubmit submits nothing and says "4 of 4 done"."""

from __future__ import annotations

import io
import re
import time

import pytest
from fixtures_launch import probes, run_launch

from shipyard.commands import launch as launch_commands
from shipyard.commands.context import Context

pytestmark = pytest.mark.slurm

VALUES = ["two  words", "it's \"quoted\"", "$(touch /tmp/pwned-sweep)", "plain"]


def _tasks(sandbox, job: str, n: int, timeout: float = 180) -> list[dict]:
    """The array's task records (scontrol keeps ended ones for MinJobAge; the sandbox has no accounting daemon)."""
    from shipyard import slurm

    deadline = time.monotonic() + timeout
    while True:
        out = sandbox.run(["scontrol", "show", "job", "-o", job]).stdout
        tasks = [dict(re.findall(r"(\S+?)=(\S*)", l)) for l in out.splitlines() if l.strip()]
        if len(tasks) == n and all(t.get("JobState") in slurm.final_states() for t in tasks):
            return tasks
        if time.monotonic() > deadline:
            sandbox.run(["scancel", job])
            raise AssertionError(f"array {job} did not finish: {[(t.get('ArrayTaskId'), t.get('JobState')) for t in tasks]}")
        time.sleep(1)


def test_four_combinations_two_at_a_time(sandbox, sandbox_project):
    table = sandbox_project / "combos.tsv"
    table.write_text("msg\tseed\n" + "".join(f"{v}\t{i}\n" for i, v in enumerate(VALUES)))
    flags = dict(cluster="sandbox", gpus_per_node=1, name="sweep", sweep_file=str(table), max_concurrent=2,
                 submit=True)
    out = run_launch([str(sandbox_project / "probe.py")], **flags)
    job = re.search(r"0 of 4 done; submitted 4 as job array\(s\) (\d+)", out).group(1)
    tasks = _tasks(sandbox, job, 4, timeout=90)
    assert sorted(t["ArrayTaskId"] for t in tasks) == ["0", "1", "2", "3"]
    assert {t["JobState"] for t in tasks} == {"COMPLETED"}, tasks
    spans = [(t["StartTime"], t["EndTime"]) for t in tasks]
    assert max(sum(s2 <= s < e2 for s2, e2 in spans) for s, _ in spans) <= 2, spans  # running at each start
    recs = [r for r in probes(sandbox_project, "*") if r["env"].get("SHIPYARD_SWEEP_INDEX")]
    assert sorted(int(r["env"]["SHIPYARD_SWEEP_INDEX"]) for r in recs) == [0, 1, 2, 3]
    for rec in recs:
        i = int(rec["env"]["SHIPYARD_SWEEP_INDEX"])
        assert rec["argv"] == ["--msg", VALUES[i], "--seed", str(i)]
    logs = sandbox_project / "launch" / "logs"
    for i in range(4):
        assert re.search(rf"sweep combination {i} of 4: msg=\S+_seed={i}", (logs / f"sweep-{job}_{i}.out").read_text())
    assert not __import__("pathlib").Path("/tmp/pwned-sweep").exists()
    assert "4 of 4 done: nothing to submit" in run_launch([str(sandbox_project / "probe.py")], **flags)
    ctx = Context.load(out=io.StringIO())
    assert launch_commands.sweep_status(ctx, "sweep") == 0
    status = ctx.out.getvalue().splitlines()
    assert len(status) == 2 + 4 + 1 and all(" done " in l for l in status[2:6]) and status[-1] == "4 of 4 done"


def test_beyond_max_array_size_two_arrays_with_the_same_mapping(sandbox, sandbox_project):
    reg = sandbox_project / "registry.yaml"
    reg.write_text(reg.read_text().replace("      partitions: [debug]\n",
                                           "      partitions: [debug]\n      max_array_size: 3\n", 1))
    _two_arrays_same_mapping(sandbox, sandbox_project, "split")


def _two_arrays_same_mapping(sandbox, project, name: str) -> None:
    """A 4-combination sweep under MaxArraySize 3: arrays of 3 and 1 tasks, every combination run once with its
    values and its run directory (the mapping does not depend on the split)."""
    out = run_launch([str(project / "probe.py")], cluster="sandbox", gpus_per_node=1, name=name,
                     sweep="lr=1e-3,1e-4 seed=0,1", submit=True)
    first, second = re.search(r"0 of 4 done; submitted 4 as job array\(s\) (\d+), (\d+)", out).groups()
    assert sorted(t["ArrayTaskId"] for t in _tasks(sandbox, first, 3, timeout=90)) == ["0", "1", "2"]
    assert [t["ArrayTaskId"] for t in _tasks(sandbox, second, 1, timeout=90)] == ["0"]
    rows = [("1e-3", "0"), ("1e-3", "1"), ("1e-4", "0"), ("1e-4", "1")]
    recs = [r for r in probes(project, "*") if r["env"].get("SHIPYARD_SWEEP_INDEX")]
    assert sorted(int(r["env"]["SHIPYARD_SWEEP_INDEX"]) for r in recs) == [0, 1, 2, 3]
    for rec in recs:
        i = int(rec["env"]["SHIPYARD_SWEEP_INDEX"])
        assert rec["argv"] == ["--lr", rows[i][0], "--seed", rows[i][1]]
        assert rec["env"]["SHIPYARD_SWEEP_DIR"].endswith(f"/launch/sweeps/{name}/lr={rows[i][0]}_seed={rows[i][1]}")


def _max_array_size(sandbox) -> int:
    out = sandbox.run(["scontrol", "show", "config"]).stdout
    return int(re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.M).group(1))


@pytest.fixture
def max_array_size_3(sandbox):
    """The session sandbox's slurm.conf with ``MaxArraySize=3`` for one test (`scontrol reconfigure` applies it in
    place: Slurm 22.05's slurmctld re-reads its configuration under the same pid), then the file as it was and
    reconfigured again. Not for the whole session: 3 would split every other test's sweeps, and the Snakemake plugin
    refuses array submission below 2 and warns below 11."""
    conf = sandbox.directory / "etc" / "slurm.conf"
    before = conf.read_text()
    assert "MaxArraySize" not in before  # the sandbox keeps Slurm's default (1001)
    conf.write_text(before + "MaxArraySize=3\n")
    try:
        assert sandbox.run(["scontrol", "reconfigure"]).returncode == 0
        assert _max_array_size(sandbox) == 3
        yield
    finally:
        conf.write_text(before)
        sandbox.run(["scontrol", "reconfigure"])
        assert _max_array_size(sandbox) == 1001


def test_max_array_size_from_slurm_conf_splits_with_the_same_mapping(sandbox, sandbox_project, max_array_size_3):
    """No ``scheduler.max_array_size`` in the registry: the launch command asks ``scontrol show config``."""
    assert "max_array_size" not in (sandbox_project / "registry.yaml").read_text()
    _two_arrays_same_mapping(sandbox, sandbox_project, "conf")
