"""`--validate` (sbatch --test-only) with `--sbatch` options on the real sandbox: Slurm's verdict, a
rejection as one line with Slurm's message and exit 2, nothing queued."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fixtures_launch import REPO, run_launch

pytestmark = pytest.mark.slurm

TRAIN = str(REPO / "examples" / "train.py")


def _queue(sandbox) -> set[str]:
    """The job ids in the queue. "Nothing queued" is checked as "no id that was not there before": an earlier
    test's job may still be leaving the queue while this one runs (a job may be gone by the second look)."""
    return set(sandbox.run(["squeue", "--noheader", "--format=%i"]).stdout.split())


def test_validate_accepts_mail_options_and_queues_nothing(sandbox, sandbox_project):
    before = _queue(sandbox)
    out = run_launch([TRAIN, "--steps", "1"], cluster="sandbox", validate=True, name="validate",
                     sbatch=["mail-type=END", "mail-user=a@example.org"])
    assert re.search(r"sbatch --test-only: accepted: Job \d+ to start at \S+", out), out
    text = (sandbox_project / "launch" / "validate.sbatch").read_text()
    assert "#SBATCH --mail-type=END\n#SBATCH --mail-user=a@example.org\n" in text
    assert _queue(sandbox) <= before


def test_validate_on_a_partition_slurm_does_not_have_exits_2_with_its_message(sandbox, sandbox_project, invoke):
    reg = sandbox_project / "registry.yaml"
    reg.write_text(reg.read_text().replace("partitions: [debug]", "partitions: [debug, nosuch]", 1))
    before = _queue(sandbox)
    res = invoke("launch", "--cluster", "sandbox", "--partition", "nosuch", "--name", "nosuch", "--validate", "--",
                 TRAIN, cwd=Path.cwd())
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "sbatch --test-only nosuch.sbatch on cluster sandbox: " in res.stderr
    assert re.search(r"(?i)invalid partition", res.stderr), res.stderr
    assert _queue(sandbox) <= before


def test_max_array_size_is_read_from_scontrol(sandbox, sandbox_project):
    from shipyard import slurm

    assert slurm.max_array_size(slurm.SANDBOX, sandbox.directory) >= 2
