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

from shipyard import slurm
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.files import output_to
from shipyard.launch import launcher, modules as module_files, shell as shells
from shipyard.launch.options import TORCHRUN, Options


def launch(ctx: Context, opts: Options, command: Sequence[str] = (), workdir: str | os.PathLike | None = None, *,
           kind: str = TORCHRUN) -> int:
    """`invoke launch` (``kind`` torchrun) and `invoke nccl-test`: build the launcher, write it (or print it with
    ``--dry-run``), and with ``--submit`` submit it. ``command``: the words after ``--``; ``workdir``: where the job
    runs (default: the working directory, as torchrun would resolve the script from there)."""
    if opts.dry_run and opts.submit:
        raise ShipyardError("--dry-run and --submit exclude each other")
    env, cluster = ctx.environment(opts.environment), ctx.cluster(opts.cluster)
    forced = ctx.gate(env, cluster, what="launch", force=opts.force)
    l = launcher.build(ctx.registry, env, cluster, opts, command, workdir or Path.cwd(), forced, kind=kind)
    launcher.require_bound(l)
    if opts.dry_run:
        ctx.say(launcher.render(l).rstrip("\n") + ("\n" + launcher.chain_plan(l) if l.chain > 1 else ""))
        return 0
    path = launcher.write(l)
    lines = [f"wrote {os.path.relpath(path)}"]
    how = "invoke sandbox.exec -- " if slurm.is_sandbox(l.cluster) else ""
    if opts.submit:
        ids = launcher.submit(l, path)
        lines += [f"submitted job {ids[0]}"] + [f"submitted job {j} (afterany:{p})" for p, j in zip(ids, ids[1:])]
        lines.append(f"log: {l.log_dir}/{l.name}-{ids[0]}.out")
    elif l.chain > 1:
        script = launcher.write_chain(l)
        lines.append(f"wrote {os.path.relpath(script)}: submits the {l.chain} segments, each after the previous one")
        lines.append(f"submit with: {how}bash {shlex.quote(str(script))}   (or rerun with --submit)")
    else:
        lines.append(f"submit with: {how}sbatch {shlex.quote(str(path))}   (or rerun with --submit)")
    ctx.say("\n".join(lines))
    return 0


def shell(ctx: Context, env: str | None = None, cluster: str | None = None, *, dry_run: bool = False,
          command: str | None = None, gpus: int | str | None = None, time: str | None = None,
          runtime: str | None = None, force: bool = False, partition: str | None = None) -> int:
    """`invoke shell`: print (``dry_run``) or run the srun command; returns srun's exit code. The environment on the
    cluster passes `invoke check` first (``force``: go on with a warning)."""
    environment, cl = ctx.environment(env), ctx.cluster(cluster)
    ctx.gate(environment, cl, what="shell", force=force)
    plan = shells.build(ctx.registry, environment, cl, command=command, gpus=gpus, time=time, runtime=runtime,
                        partition=partition)
    if not dry_run:
        return shells.run(plan)
    ctx.say(shells.command_line(plan))
    if plan.interactive:
        ctx.say()
        ctx.say(plan.snippet.replace(shells.NODE_MARK, "<the node srun allocates; the shell prints it when it starts>"))
    return 0


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
    ctx.say(f"wrote {len(mods)} modulefile(s) and {len(paths) - len(mods)} wrapper(s)")
    if mods:
        ctx.say(f"  module use {shlex.quote(str(mods[0].parent.parent))}")
        for m in mods:
            ctx.say(f"  module load shipyard/{m.stem}")
    return 0
