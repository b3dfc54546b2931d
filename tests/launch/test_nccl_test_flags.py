"""`invoke nccl-test`'s own flags: --binary, --sizes, --iters, --check (defaults in shipyard/data/launch.yaml), and
the cluster's MPI plugin (clusters.NAME.mpi: pmix, pmi2, none), in golden launchers; bad values refused in one line."""

from __future__ import annotations

import pytest
from fixtures_launch import FAKE_ROOT, LAUNCH_REGISTRY, build_launcher
from helpers_registry import GOLDEN, golden

from shipyard import registry
from shipyard.errors import ShipyardError
from shipyard.launch import launcher


def _reg(mpi: str | None = None):
    text = LAUNCH_REGISTRY
    if mpi:
        text = text.replace("  lab-socket:\n    runtime: host\n", f"  lab-socket:\n    runtime: host\n    mpi: {mpi}\n")
    return registry.load_text(text, "registry.yaml", path=FAKE_ROOT / "registry.yaml")


def test_golden_nccl_test_with_the_course_flags():
    l = build_launcher(_reg(), cluster="lab-socket", nodes=2, kind="nccl-test", binary="all_gather_perf",
                       sizes="128M:4G", iters="20", check="0")
    text = launcher.render(l)
    assert "  all_gather_perf -b 128M -e 4G -f 2 -g 1 -c 0 -n 20 &" in text
    assert "--binary all_gather_perf --sizes 128M:4G --iters 20 --check 0" in text  # the "regenerate with" line
    golden(GOLDEN / "launch" / "nccl-test-flags.sbatch", text)


@pytest.mark.parametrize("mpi", ["pmi2", "none"])
def test_golden_nccl_test_per_cluster_mpi(mpi):
    text = launcher.render(build_launcher(_reg(mpi), cluster="lab-socket", nodes=2, kind="nccl-test"))
    assert f"srun --mpi={mpi} " in text
    if mpi == "none":  # one process per node drives both GPUs
        assert "#SBATCH --ntasks-per-node=1" in text and " -g 2 " in text
    golden(GOLDEN / "launch" / f"nccl-test-mpi-{mpi}.sbatch", text)


@pytest.mark.parametrize("flags,message", [
    (dict(binary="rm -rf /"), r"^--binary 'rm -rf /': not an nccl-tests binary \(valid: all_gather_perf, "),
    (dict(sizes="128M-4G"), r"^--sizes '128M-4G': expected MIN:MAX sizes like 128M:4G"),
    (dict(sizes="1G:$(id)"), r"^--sizes '1G:\$\(id\)': expected MIN:MAX"),
    (dict(iters="0"), r"^--iters 0: must be at least 1"),
    (dict(check="yes"), r"^--check 'yes': expected 1"),
])
def test_bad_values_are_refused_in_one_line(flags, message):
    with pytest.raises(ShipyardError, match=message) as e:
        build_launcher(_reg(), cluster="lab-socket", nodes=2, kind="nccl-test", **flags)
    assert "\n" not in str(e.value)


def test_a_cluster_mpi_outside_the_schema_is_refused():
    with pytest.raises(ShipyardError, match=r"clusters\.lab-socket\.mpi: 'openmpi' is not one of: pmix, pmi2, none"):
        _reg("openmpi")


def test_ring_on_two_or_more_nodes_unless_given():
    """Tree's busbw on 2 nodes can exceed the link rate: a fabric measurement on 2+ nodes runs Ring
    (launch.yaml nccl_test.multi_node_env); one node, a torchrun launcher or a value of the user's is left alone."""
    want = launcher.launch_data()["nccl_test"]["multi_node_env"]
    assert want == {"NCCL_ALGO": "Ring"}

    def algo(**kw):
        l = build_launcher(_reg(), cluster="lab-socket", **kw)
        return [(v.value, v.origin) for v in l.env if v.name == "NCCL_ALGO"], launcher.render(l)

    got, text = algo(nodes=2, kind="nccl-test")
    assert got == [("Ring", "nccl-test on 2 nodes: busbw against the link rate")]
    assert "export NCCL_ALGO=Ring  # nccl-test on 2 nodes" in text
    assert algo(nodes=1, kind="nccl-test")[0] == []
    assert algo(nodes=2, command=("train.py",))[0] == []
    assert algo(nodes=2, kind="nccl-test", env=["NCCL_ALGO=Tree"])[0] == [("Tree", "--env")]


def _task_script(text: str) -> str:
    """The script the nccl-test step's tasks run their binary through (``/bin/sh -c SCRIPT nccl-tests BINARY ...``)."""
    import shlex

    line = next(x for x in text.splitlines() if x.lstrip().startswith("/bin/sh -c "))
    words = shlex.split(line.strip().rstrip("\\"))
    assert words[:2] == ["/bin/sh", "-c"] and words[3] == "nccl-tests", words
    return words[2]


@pytest.mark.parametrize("status", [0, 2])
def test_a_failed_task_waits_before_exiting_so_its_last_lines_reach_the_log(status):
    """nccl-tests exits 2 after printing why (a CUDA or NCCL error); srun's --kill-on-bad-exit ends the step when a
    task exits non-zero, and under load the failed task's last line was lost. The task's script keeps a failed task
    alive ``failure_grace_s`` (shipyard/data/launch.yaml) before it exits with the binary's status; a task that
    succeeds exits at once. Run here in the real /bin/sh, with a grace of 1 s."""
    import subprocess
    import time

    from shipyard.launch.launcher import _nccl_test_script

    l = build_launcher(_reg(), cluster="lab-socket", nodes=2, kind="nccl-test")
    assert l.nccl_test_grace == launcher.launch_data()["nccl_test"]["failure_grace_s"] == 5
    script = _task_script(launcher.render(l))
    assert script == _nccl_test_script(l, "")
    script = _nccl_test_script(l.replace(nccl_test_grace=1), "")
    t0 = time.monotonic()
    res = subprocess.run(["/bin/sh", "-c", script, "nccl-tests", "/bin/sh", "-c", f"echo why; exit {status}"],
                         capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    assert (res.returncode, res.stdout) == (status, "why\n")
    assert (took >= 1.0) if status else (took < 0.9), took
