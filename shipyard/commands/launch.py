"""`invoke launch`, `invoke nccl-test`, `invoke shell` and `invoke modules`: what runs on the cluster, from the image.

Each command resolves the environment and cluster once, runs the checks of `invoke check ENV --cluster C` through
:meth:`Context.gate` (``--force`` goes on, and the launcher's header names what it overrode), hands the objects and
the flags to the stage (:mod:`shipyard.launch.launcher`, :mod:`shipyard.launch.shell`,
:mod:`shipyard.launch.modules`), prints on ``ctx.out`` and returns an exit code. The launch flags arrive as one
:class:`~shipyard.launch.options.Options`, built by tasks.py from the task's parameters and passed down unchanged.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Sequence

from shipyard import project, runtimes, slurm
from shipyard.commands import remote as remote_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, output_to, table
from shipyard.launch import image_check, launcher, modules as module_files, shell as shells, snakemake, sweep as sweeps
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


def shell(ctx: Context, env: str | None = None, cluster: str | None = None, *, dry_run: bool = False,
          command: str | None = None, gpus: int | str | None = None, time: str | None = None,
          runtime: str | None = None, force: bool = False, partition: str | None = None,
          sbatch: Sequence[str] | None = None) -> int:
    """`invoke shell`: print (``dry_run``) or run the srun command; returns srun's exit code. The environment on the
    cluster passes `invoke check` first (``force``: go on with a warning)."""
    environment, cl = ctx.environment(env), ctx.cluster(cluster)
    if transport.is_remote(cl):
        return remote_commands.forward(ctx, cl, tty=not dry_run and command is None)
    ctx.gate(environment, cl, what="shell", force=force)
    note = None
    try:
        check = shell_check(ctx, environment, cl, runtime)
    except ShipyardError as exc:
        if not dry_run:
            raise
        # a preview before anything is built or staged: the line is shown, and what running it needs is said
        note, check = f"note: {exc}; until then `invoke shell` (without --dry-run) refuses to start it", None
    plan = shells.build(ctx.registry, environment, cl, command=command, gpus=gpus, time=time, runtime=runtime,
                        partition=partition, sbatch=sbatch, check=check)
    if not dry_run:
        return shells.run(plan)
    ctx.say(shells.command_line(plan))
    if note:
        ctx.say(note)
    if plan.interactive:
        ctx.say()
        ctx.say(plan.snippet.replace(shells.NODE_MARK, "<the node srun allocates; the shell prints it when it starts>"))
    return 0


def shell_check(ctx: Context, env, cl, runtime: str | None) -> Path | None:
    """The image check `invoke shell` runs before srun: ``launch/ENV-SHA.check-image.sh``, written for the staged
    image (its stage record, else the build manifest) as the batch launcher would bind it; None for the host runtime
    (no image). An image with nothing to check it against is refused, as `invoke launch` refuses it. Written in a
    --dry-run too: the printed line runs it."""
    rt = runtimes.get(runtime or cl.runtime)
    if not rt.containerised:
        return None
    image = rt.image(ctx.registry.root, env.name, cl)
    check = image_check.require(image_check.bound(ctx.registry.root, env.name, image, rt.suffix), image, env.name,
                                cl.name, "the shell's image")
    path = project.launchers_dir(ctx.registry.root) / image_check.script_name(check, env.name)
    by = f"invoke shell {env.name} --cluster {cl.name}" + (f" --runtime {rt.name}" if runtime else "")
    atomic_write(path, image_check.render(check, env.name, by, "`invoke shell` (and --command) runs"), mode=0o755)
    return path


def modules(ctx: Context, env: str | None = None, cluster: str | None = None, prefix: str | os.PathLike | None = None,
            *, force: bool = False) -> int:
    """`invoke modules`: run `invoke check` for each environment on the cluster (refusing on an ERROR unless
    ``force``), write the modulefiles and wrappers, and say how to use them."""
    cl = ctx.cluster(cluster)
    envs = [ctx.environment(env)] if env else module_files.environments_on(ctx.registry, cl)
    for e in envs:
        ctx.gate(e, cl, what=f"modules for {e.name}", force=force)
    with output_to("--prefix", prefix or ctx.registry.root / "modules"):
        paths = module_files.write_modules(ctx.registry, envs, cl, prefix)
    mods = sorted(p for p in paths if p.suffix == ".lua")
    checks = [p for p in paths if p.name == image_check.SCRIPT]
    ctx.say(f"wrote {len(mods)} modulefile(s) and {len(paths) - len(mods) - len(checks)} wrapper(s), which run "
            f"{len(checks)} image check(s) first")
    for e in envs:  # written all the same: the wrappers name the image's place, which a stage fills later
        image = module_files.image_path(ctx.registry, cl, e)
        if image and not os.path.exists(image):
            ctx.say(f"note: {image} is not staged yet: the wrappers of {e.name} fail until `invoke stage {e.name} "
                    f"--cluster {cl.name}`")
    if mods:
        ctx.say(f"  module use {shlex.quote(str(mods[0].parent.parent))}")
        for m in mods:
            ctx.say(f"  module load shipyard/{m.stem}")
    return 0


def snakemake_profile(ctx: Context, cluster: str | None = None, env: str | None = None, *, check: bool = False) -> int:
    """`invoke snakemake.profile --cluster C [--env E] [--check]`: write the Snakemake profile and the Slurm plugin's
    partition file for the cluster; ``check``: exit 1 naming the stale files, write nothing."""
    cl, environment = ctx.cluster(cluster), ctx.environment(env)
    rt = runtimes.get(cl.runtime)
    staged = None
    if rt.name == "apptainer":  # Snakemake runs images with apptainer only: the profile names the staged one
        image = rt.image(ctx.registry.root, environment.name, cl)
        staged = image_check.require(image_check.bound(ctx.registry.root, environment.name, image, rt.suffix),
                                     image, environment.name, cl.name, "the Snakemake profile's image")
    files = snakemake.render(ctx.registry, environment, cl, staged)
    if check:
        old = snakemake.stale(files)
        if old:
            raise ShipyardError(f"{', '.join(os.path.relpath(p) for p in old)}: stale; regenerate with invoke "
                                f"snakemake.profile --cluster {cl.name}", exit_code=1)
        ctx.say(f"{len(files)} file(s) up to date")
        return 0
    for p in snakemake.write(files):
        ctx.say(f"wrote {os.path.relpath(p)}")
    ctx.say(f"use with: snakemake --profile {shlex.quote(os.path.relpath(snakemake.directory(ctx.registry.root, cl.name)))}")
    return 0
