"""`invoke shell`: an interactive shell (or one command) in the environment's image on a compute node, through srun.

The environment on the cluster passes `invoke check` first, as a launcher's does; the staged image is checked by its
own script (:mod:`shipyard.launch.image_check`) before srun starts it (:mod:`shipyard.launch.shell` builds the line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from shipyard import project, runtimes
from shipyard.commands import remote as remote_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write
from shipyard.launch import image_check, shell as shells
from shipyard.remote import transport


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
