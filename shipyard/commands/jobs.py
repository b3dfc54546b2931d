"""`invoke status`, `logs`, `usage`, `nccl-report` and `doctor`: what runs, ran, and can run on a cluster.

The stages (:mod:`shipyard.jobs`) ask Slurm and read files with the objects given; here the names of the flags are
resolved once, the results printed and the exit code chosen (a job that did not succeed, or a FAIL of the doctor,
is 1; bad input is 2, raised as :class:`~shipyard.errors.ShipyardError`).
"""

from __future__ import annotations

import getpass
import sys

from shipyard import project, registry, slurm
from shipyard.commands import remote as remote_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.files import output_to
from shipyard.jobs import doctor as doctor_stage
from shipyard.jobs import nccl_report as nccl
from shipyard.jobs import status as jobs
from shipyard.jobs import usage as usage_stage
from shipyard.remote import transport


def status(ctx: Context, cluster: str | None = None, since: str = "now-2days", user: str | None = None) -> int:
    """`invoke status`: the table of the user's shipyard jobs on the cluster."""
    where = ctx.cluster(cluster)
    if transport.is_remote(where):  # the launchers that name shipyard's jobs are there (docs/remote.md)
        return remote_commands.forward(ctx, where)
    found, note = jobs.shipyard_jobs(ctx.registry, where, user or getpass.getuser(), since)
    ctx.write(jobs.render_status(where.name, found, ctx.root, note))
    return 0


def logs(ctx: Context, jobid: str, follow: bool = False, lines: int | str = 20, cluster: str | None = None) -> int:
    """`invoke logs JOBID [-f]`: the tail of the job's output, then (``follow``) what it appends until the job ends.

    A followed job that did not succeed is exit 1 (a failed job, not bad input), so `logs -f JOBID && next-step`
    stops; its state comes from :class:`shipyard.slurm.Job`.
    """
    try:
        n = int(lines)
    except (TypeError, ValueError):
        raise ShipyardError(f"--num-lines {lines!r}: expected a whole number of lines (0 or more)") from None
    if n < 0:
        raise ShipyardError(f"--num-lines {n}: expected 0 or more")
    where = ctx.cluster(cluster)
    if transport.is_remote(where):  # the log is on the cluster's storage
        return remote_commands.forward(ctx, where)
    path = jobs.find_log(ctx.registry, where, str(jobid), wait=follow)
    last, size = jobs.tail(path, n)
    ctx.write("".join(last))
    ctx.out.flush()
    if follow:
        job = slurm.Job(where, str(jobid))
        state = job.follow(path, ctx.out, offset=size)
        stuck = job.stuck()
        if stuck:  # requeued, and now it cannot start again
            raise ShipyardError(f"job {jobid} cannot start ({stuck}): it stays PENDING until that changes",
                                exit_code=1)
        if state is not None and not slurm.succeeded(state):
            raise ShipyardError(f"job {jobid} ended {state}", exit_code=1)
    return 0


def usage(ctx: Context, jobid: str, out: str | None = None, cluster: str | None = None) -> int:
    """`invoke usage JOBID [--cluster C]`: the per-node summary of the job's --monitor CSVs (those of the cluster's
    launchers: job ids repeat across clusters), and the plot written."""
    where = ctx.cluster(cluster)
    if transport.is_remote(where):  # the samples are on the cluster's storage, beside the job log
        return remote_commands.forward(ctx, where)
    with output_to("--out", out):
        text, png = usage_stage.write_report(
            project.launch_logs_dir(ctx.registry), str(jobid), out, where.name,
            lambda name: project.launcher_cluster(project.launcher_path(ctx.registry, name)))
    ctx.write(text)
    ctx.say(f"plot: {png}")
    return 0


def nccl_report(log: str, out: str | None = None, cluster: str | None = None, ctx: Context | None = None, *,
                partition: str | None = None) -> int:
    """`invoke nccl-report LOG`: the bus-bandwidth table and plot.

    A log can be read anywhere: the registry (for the cluster's line rate and the transport verdict) is loaded only
    when ``cluster`` names one or a registry file is there. A log without result rows still prints its transport
    and verdict before the one error line (exit 2).
    """
    if ctx is None and (cluster is not None or registry.registry_path().exists()):
        ctx = Context.load()
    stdout = ctx.out if ctx is not None else sys.stdout
    where = ctx.cluster(cluster) if ctx is not None else None
    if partition is not None:
        if where is None:
            raise ShipyardError("--partition: needs a cluster (--cluster, or a registry.yaml here)")
        if partition not in where.partitions:
            raise ShipyardError(f"--partition {partition!r}: not a partition of cluster {where.name} "
                                f"(valid: {', '.join(where.partitions)})")
    if where is not None:
        where = where.on(partition)  # the partition's line rate (it may differ from the cluster-wide one)
    try:
        with output_to("--out", out):
            text, png = nccl.write_report(log, out, where)
    except nccl.NoRows as exc:
        stdout.write(exc.text)
        raise
    stdout.write(text)
    print(f"plot: {png}", file=stdout)
    return 0


def doctor(ctx: Context, cluster: str | None = None, env: str | None = None, partition: str | None = None,
           time_start: bool = False) -> int:
    """`invoke doctor`: the preflight report; 1 when anything FAILs. The compute node is probed on ``partition``
    (default: scheduler.partition) and judged by that partition's GPUs. ``time_start``: then the staged image's cold
    and warm start per container runtime (shipyard/jobs/start_time.py), 1 when a start fails."""
    where = ctx.cluster(cluster)
    if partition and partition not in where.partitions:
        raise ShipyardError(f"--partition {partition!r}: not a partition of cluster {where.name} "
                            f"(valid: {', '.join(where.partitions)})")
    if transport.is_remote(where):
        return remote_commands.forward(ctx, where)
    where = where.on(partition)
    environment = ctx.environment(env)
    findings, node = doctor_stage.diagnose(ctx.registry, where, environment)
    ctx.write(doctor_stage.render(where, environment, findings))
    failed = any(f.status == doctor_stage.FAIL for f in findings)
    if time_start:
        from shipyard.jobs import start_time  # lazy: only this flag needs it

        timings = start_time.time_starts(ctx.registry, where, environment.name, node)
        ctx.write("\n" + start_time.render(timings, environment.name))
        failed = failed or any(t.failed for t in timings)
    return 1 if failed else 0
