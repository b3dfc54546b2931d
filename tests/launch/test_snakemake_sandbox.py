"""The example workflow (examples/snakemake) on the real sandbox through Snakemake's Slurm executor plugin:
prepare and evaluate are plugin jobs, train is shipyard's 2-node launcher submitted with ``sbatch --wait``; a
rerun has nothing to do; the plugin picks the partition the registry's partition file implies.

Two things the plugin needs of Slurm, and how the sandbox meets them for real:
- Job states: the plugin asks ``sacct`` by default, and the sandbox keeps no accounting database
  (AccountingStorageType=accounting_storage/none: ``sacct`` refuses, checked below). ``--slurm-status-command squeue``
  is the plugin's own alternative, which it recommends when MinJobAge is at least 120 s (the sandbox's is 600): a
  user of a cluster without slurmdbd passes the same flag (docs/sweeps.md). The account is not guessed either
  (``sacct``), so jobs go without ``-A``, as on a cluster that needs none.
- A plugin job runs its rule with ``srun`` inside the job after dropping every SLURM_* variable but a few
  (snakemake-executor-plugin-slurm-jobstep 0.6.1), $SLURM_CONF included: the sandbox's nodes have its slurm.conf at
  Slurm's default path, /etc/slurm, as a real compute node does (shipyard/sandbox/start.py).
"""

from __future__ import annotations

import io
import json
import re
import sys

import pytest

from shipyard.commands import snakemake as snakemake_commands
from shipyard.commands.context import Context

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SNAKEFILE = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "snakemake" / "Snakefile"


def _snakemake(sandbox, project, *args: str):
    pytest.importorskip("snakemake_executor_plugin_slurm")  # the test extras (Python >= 3.11)
    argv = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "--profile", str(project / "snakemake" /
            "sandbox"), "--directory", str(project), "--config", "gpus_per_node=1", "steps=10", "--slurm-status-command", "squeue",
            "--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2", *args]
    return sandbox.run(argv, client_timeout=900, cwd=project)


def _why(project, res) -> str:
    """Snakemake's output and each plugin job's Slurm log (where a failed job's reason is)."""
    logs = sorted((project / ".snakemake" / "slurm_logs").rglob("*.log"))
    return "\n".join([(res.stdout + res.stderr)[-5000:], *(f"== {p}\n{p.read_text()[-3000:]}" for p in logs)])


def _job(sandbox, job_id) -> dict:
    out = sandbox.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
    return dict(re.findall(r"(\S+?)=(\S*)", out))


def test_example_workflow_through_the_plugin(sandbox, sandbox_project):
    acct = sandbox.run(["sacct", "-X", "--noheader"])
    assert acct.returncode != 0 and "accounting storage is disabled" in acct.stderr, acct  # why squeue, above
    ctx = Context.load(out=io.StringIO())
    assert snakemake_commands.snakemake_profile(ctx, "sandbox") == 0
    res = _snakemake(sandbox, sandbox_project)
    log = res.stdout + res.stderr
    assert res.returncode == 0, _why(sandbox_project, res)
    out = sandbox_project / "results" / "snakemake"
    spec, result = (json.loads((out / n).read_text()) for n in ("prepare.json", "eval.json"))
    # prepare and evaluate ran as their own Slurm jobs, in the partition the partition file implies
    assert spec["slurm_job_id"] and result["slurm_job_id"] and spec["slurm_job_id"] != result["slurm_job_id"]
    for rule in ("prepare", "evaluate"):
        assert re.search(rf"Auto-selected partition 'debug' for job {rule}\b", log), log[-6000:]
    for rec in (spec, result):
        job = _job(sandbox, rec["slurm_job_id"])
        assert (job["Partition"], job["JobState"], job["NumNodes"]) == ("debug", "COMPLETED", "1"), job
    # train was shipyard's launcher: one torchrun job on 2 nodes, submitted by the local rule
    launcher = sandbox_project / "launch" / "snakemake-train.sbatch"
    assert "#SBATCH --nodes=2" in launcher.read_text()
    [train_log] = (sandbox_project / "launch" / "logs").glob("snakemake-train-*.out")
    train_job = _job(sandbox, train_log.stem.rsplit("-", 1)[1])
    assert (train_job["JobState"], train_job["NumNodes"]) == ("COMPLETED", "2"), train_job
    assert re.search(r"result: world_size=2 start_step=0 end_step=10 ", train_log.read_text())
    assert result["step"] == 10 and result["heldout_mse"] < result["predict_zero_mse"], result
    # a rerun has nothing to do
    again = _snakemake(sandbox, sandbox_project)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]
