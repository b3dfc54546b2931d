"""The launcher's hints for errors that name the wrong thing (shipyard/launch/hints.py), read from real job logs
(tests/data/torchrun/README.md) by the awk program the launcher runs, under mawk, gawk and busybox awk."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures_launch import AWKS

from shipyard.launch import hints

DATA = Path(__file__).resolve().parents[1] / "data" / "torchrun"


def _run(awk: list[str], text: str) -> str:
    res = subprocess.run(awk + [hints.awk_program(hints.failure_hints())], input=text, capture_output=True, text=True,
                         timeout=30)
    assert (res.returncode, res.stderr) == (0, ""), awk
    return res.stdout


@pytest.mark.parametrize("awk", AWKS, ids=lambda a: a[0])
def test_a_lost_c10d_store_gets_one_hint_that_points_at_the_rank_that_never_exited(awk):
    out = _run(awk, (DATA / "c10d-store-lost.out").read_text())
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("shipyard: hint: a torchrun lost the c10d store"), out
    assert "never exited" in lines[0] and "300 s exit barrier" in lines[0] and "rule 12" in lines[0]


@pytest.mark.parametrize("awk", AWKS, ids=lambda a: a[0])
def test_a_job_that_ended_well_gets_no_hint(awk):
    assert _run(awk, (DATA / "finished.out").read_text()) == ""


@pytest.mark.parametrize("awk", AWKS, ids=lambda a: a[0])
def test_every_awk_the_launchers_are_checked_with_is_installed(awk):
    assert shutil.which(awk[0]), f"{awk[0]} is missing: `invoke test` installs it (shipyard/data/test-packages.txt)"


def test_data_that_would_break_the_launchers_quoting_is_refused():
    with pytest.raises(ValueError, match="cannot be rendered"):
        hints.awk_program([{"match": "it's", "hint": "x"}])
    with pytest.raises(ValueError, match="cannot be rendered"):
        hints.awk_program([{"match": "x", "hint": 'a "quoted" word'}])


@pytest.mark.parametrize("rc,name,hinted", [(1, "c10d-store-lost.out", 1), (0, "c10d-store-lost.out", 0),
                                            (1, "finished.out", 0)])
def test_the_launchers_own_block_hints_after_a_failed_step_from_this_runs_part_of_the_log(launch_registry, tmp_path,
                                                                                          rc, name, hinted):
    """Run the torchrun launcher's hint block in bash over a real log appended after an earlier run's part that had
    the signature (a requeued job's log): a hint only when this run's step failed and this run's part has it."""
    from fixtures_launch import build_launcher

    from shipyard.launch import launcher as launch

    t = launch.render(build_launcher(launch_registry, command=("t.py",), cluster="lab-socket", nodes=2))
    start = t.index('if [ "$rc" != 0 ]; then\n  # Errors that name the wrong thing')
    block = t[start: t.index("\nfi\n", start) + len("\nfi\n")]
    log = tmp_path / "job.out"
    log.write_text("old run: The connection to the C10d store has failed.\n")
    sample = DATA / name
    script = f'log={log}\nlog_start=$(stat -c %s "$log")\ncat {sample} >> "$log"\nrc={rc}\n{block}'
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert (res.returncode, res.stderr) == (0, "")
    lines = res.stdout.splitlines()
    assert len(lines) == hinted and all(ln.startswith("shipyard: hint: a torchrun lost") for ln in lines)


def test_the_nccl_test_launcher_has_no_torchrun_hint(launch_registry):
    from fixtures_launch import build_launcher

    from shipyard.launch import launcher as launch
    from shipyard.launch.options import NCCL_TEST

    t = launch.render(build_launcher(launch_registry, cluster="lab-socket", nodes=2, kind=NCCL_TEST))
    assert "C10d" not in t and "hint" not in t
