"""`invoke launch`, `invoke nccl-test` and `invoke sweep-status`: the batch job that runs on the cluster, from the image.

Each command resolves the environment and cluster once, runs the checks of `invoke check ENV --cluster C` through
:meth:`Context.gate` (``--force`` goes on, and the launcher's header names what it overrode), hands the objects and
the flags to the stage (:mod:`shipyard.launch.launcher`), prints on ``ctx.out`` and returns an exit code. The launch
flags arrive as one :class:`~shipyard.launch.options.Options`, built by tasks.py from the task's parameters and
passed down unchanged. What else runs the image has its own command module: :mod:`shipyard.commands.shell`,
:mod:`shipyard.commands.modules`, :mod:`shipyard.commands.snakemake`.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Sequence

from shipyard import slurm
from shipyard.commands import remote as remote_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.files import table
from shipyard.launch import launcher, sweep as sweeps
from shipyard.launch.options import NCCL_TEST, TORCHRUN, Options
from shipyard.remote import transport


def require_current_spec(ctx: Context, l, env, force: bool) -> None:
    """Refuse a launcher (or handout) whose image was built from another spec than registry.yaml's today, in one
    line; with ``force`` go on and say so (on the error stream: a dry run's launcher is the output)."""
    drift = launcher.spec_drift(l, env, Path(ctx.registry.root))
    if not drift:
        return
    if not force:
        raise ShipyardError(f"{drift}; rebuild and stage it (`invoke build {env.name}`, `invoke stage {env.name} "
                            f"--cluster {l.cluster}`), or --force to run it anyway")
    print(f"WARNING: {drift}; going on (--force)", file=ctx.err)


def launch(ctx: Context, opts: Options, command: Sequence[str] = (), workdir: str | os.PathLike | None = None, *,
           kind: str = TORCHRUN) -> int:
    """`invoke launch` (``kind`` torchrun) and `invoke nccl-test`: build the launcher, write it (or print it with
    ``--dry-run``), and with ``--submit`` submit it. ``command``: the words after ``--``; ``workdir``: where the job
    runs (default: the working directory, as torchrun would resolve the script from there)."""
    if opts.dry_run and opts.submit:
        raise ShipyardError("--dry-run and --submit exclude each other")
    if opts.dry_run and opts.validate:
        raise ShipyardError("--dry-run and --validate exclude each other (--validate asks Slurm about the written "
                            "launcher)")
    if opts.image_has_nccl_tests and not opts.image:
        raise ShipyardError("--image-has-nccl-tests: only with --image (shipyard checks its own images itself)")
    env, cluster = ctx.environment(opts.environment), ctx.cluster(opts.cluster)
    if transport.is_remote(cluster):  # rendered, checked and submitted where the stage record is (docs/remote.md)
        return remote_commands.forward(ctx, cluster)
    forced = ctx.gate(env, cluster, what="launch", force=opts.force)
    l = launcher.build(ctx.registry, env, cluster, opts, command, workdir or Path.cwd(), forced, kind=kind)
    launcher.require_bound(l)
    if kind == NCCL_TEST:
        launcher.require_nccl_tests(l, env, opts.image_has_nccl_tests)
    else:
        require_current_spec(ctx, l, env, opts.force)
    if opts.dry_run:
        ctx.say(launcher.render(l).rstrip("\n") + ("\n" + launcher.chain_plan(l) if l.chain > 1 else ""))
        return 0
    path = launcher.write(l)
    lines = [f"wrote {os.path.relpath(path)}"]
    if l.combinations:  # a sweep: the combinations beside the launcher
        table = sweeps.write_table(l.root, l.name, l.combinations)
        lines.append(f"wrote {os.path.relpath(table)}: {l.combinations.count} combination(s), run directories under "
                     f"{os.path.relpath(sweeps.runs_dir(l.root, l.name))}/")
    how = "invoke sandbox.exec -- " if slurm.is_sandbox(cluster) else ""
    if opts.validate:  # Slurm's verdict (a rejection raises: one line, exit 2); nothing is queued
        lines.append(f"sbatch --test-only: accepted: {slurm.test_only(cluster, path)}")
    if opts.submit and l.combinations:
        mas = cluster.max_array_size or slurm.max_array_size(cluster)
        ids, finished = launcher.submit_sweep(l, path, mas)
        lines.append(f"{finished} of {l.combinations.count} done" + (f"; submitted {l.combinations.count - finished} as job "
                     f"array(s) {', '.join(ids)}" if ids else ": nothing to submit"))
        if ids:
            lines.append(f"logs: {l.log_dir}/{l.name}-<array job>_<task>.out; invoke sweep-status --name {l.name}")
    elif opts.submit:
        ids = launcher.submit(l, path)
        lines += [f"submitted job {ids[0]}"] + [f"submitted job {j} (afterany:{p})" for p, j in zip(ids, ids[1:])]
        lines.append(f"log: {l.log_dir}/{l.name}-{ids[0]}.out")
    elif l.chain > 1:
        script = launcher.write_chain(l)
        lines.append(f"wrote {os.path.relpath(script)}: submits the {l.chain} segments, each after the previous one")
        lines.append(f"submit with: {how}bash {shlex.quote(str(script))}   (or rerun with --submit)")
    elif l.combinations:
        lines.append("submit with: rerun with --submit (it skips finished combinations and splits the sweep at the "
                     "cluster's MaxArraySize)")
    else:
        lines.append(f"submit with: {how}sbatch {shlex.quote(str(path))}   (or rerun with --submit)")
    ctx.say("\n".join(lines))
    return 0


def sweep_status(ctx: Context, name: str | None) -> int:
    """`invoke sweep-status --name NAME`: one row per combination of launcher NAME's sweep (index, run directory, done or
    not, the values) and how many are done; exit 0."""
    if not name:
        raise ShipyardError("sweep-status: give the sweep's launcher name with --name NAME (see launch/*.sweep.tsv)")
    sw, dirs = sweeps.read_table(ctx.registry.root, name)
    finished = sweeps.done(ctx.registry.root, name, dirs)
    rows = [(i, "done" if f else "-", d, *vals) for i, (f, d, vals) in enumerate(zip(finished, dirs, sw.rows))]
    ctx.say(table(("index", "state", "dir", *sw.names), rows))
    ctx.say(f"{sum(finished)} of {sw.count} done")
    return 0
