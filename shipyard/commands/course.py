"""`invoke course.handout`: a student folder from the course registry (shipyard/launch/handout.py).

The use case: resolve the environment and cluster, run `invoke check`'s gate, build the course launcher exactly as
`invoke launch` would from this folder, turn it into a student launcher with no instructor path, and write it with
the training script and a one-page STUDENTS.md into ``--out``.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Sequence

from shipyard import runtimes, slurm
from shipyard.commands import launch as launch_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.launch import handout, image_check, launcher
from shipyard.launch.options import Options
from shipyard.containers import contents
from shipyard.staging import kept_contents, versions


def sandbox_conf(cluster) -> str | None:
    """The sandbox's slurm.conf, which students' own clients read (the host is on the sandbox's network); None for
    a real cluster, whose login node's clients find their configuration themselves."""
    return str(slurm.sandbox_directory() / "etc" / "slurm.conf") if slurm.is_sandbox(cluster) else None


def remember(ctx: Context, env, cluster, dest: Path) -> None:
    """List the handout beside the staged image, so that `stage --list` shows and `stage --prune` keeps the version
    its launcher is written for."""
    rt = runtimes.get(cluster.runtime)
    if not rt.containerised:
        return
    pointer = Path(rt.image(ctx.registry.root, env.name, cluster))
    if not versions.is_pointer(pointer):
        return
    try:
        versions.add_handout(pointer, dest)
    except OSError as exc:
        ctx.say(f"note: cannot list this handout in {versions.handouts_file(pointer)} ({exc.strerror or exc}); "
                f"`stage --prune` will not know that it runs {versions.current(pointer).name}")


def changes_since(ctx: Context, env, cluster, dest: Path, image: str) -> str | None:
    """What changed between the staged version the handout in ``dest`` binds today and ``image``, the version the
    new handout binds, in `invoke diff`'s words, for STUDENTS.md's update step; None for a first handout, the same
    version again, or a cluster without versioned staging. A version staged without a contents record is named,
    with what could not be compared."""
    rt = runtimes.get(cluster.runtime)
    if not rt.containerised:
        return None
    pointer = Path(rt.image(ctx.registry.root, env.name, cluster))
    if not versions.is_pointer(pointer):
        return None
    new = Path(image)
    old = next((pointer.parent / name for name, folders in versions.binders(pointer).items()
                if dest in folders and name != new.name), None)
    if old is None:
        return None
    before, after = kept_contents.read(old), kept_contents.read(new)
    if before is None or after is None:
        missing = old if before is None else new
        return (f"the course image is now {new.name} (it was {old.name}); {missing.name} was staged without a record "
                "of its contents, so the two cannot be compared package by package\n")
    return contents.render_diff(contents.diff(before, after), f"{env.name}: {old.name}", f"{env.name}: {new.name}")


def preview(ctx: Context, name: str, text: str, md: str, dest: Path, unbound: str | None) -> int:
    """--dry-run: the launcher and STUDENTS.md as they would be written into ``dest``; nothing is written."""
    ctx.say(f"--- {dest / (name + '.sbatch')} (dry run: not written)")
    ctx.say(text.rstrip("\n"))
    ctx.say(f"--- {dest / 'STUDENTS.md'} (dry run: not written)")
    ctx.say(md.rstrip("\n"))
    ctx.say("dry run: nothing written" + (f"; NOT READY: {unbound}" if unbound else
                                          "; the launcher is bound to the staged image it names"))
    return 0


def handout_folder(ctx: Context, opts: Options, out: str, command: Sequence[str] = (),
                   workdir: str | os.PathLike | None = None, *, replace: bool = False, dry_run: bool = False) -> int:
    """Write the handout into ``out``; 0, or a ShipyardError line. ``replace`` (``--replace``) writes over the
    handout files of a non-empty ``out``; ``--force`` (in ``opts``) means only "go on despite check ERRORs"."""
    if not out:
        raise ShipyardError("--out: name the folder to write the handout into (students copy it from there)")
    if not command:
        raise ShipyardError("course.handout: give the training script and its arguments after `--`, as for "
                            "invoke launch (e.g. -- train.py --steps 200)")
    env, cluster = ctx.environment(opts.environment), ctx.cluster(opts.cluster)
    forced = ctx.gate(env, cluster, what="handout", force=opts.force)
    here = Path(workdir or Path.cwd())
    l = launcher.build(ctx.registry, env, cluster, opts, command, here, forced)
    unbound = None
    if runtimes.get(l.runtime).containerised and not (l.image_bound_from or "").startswith("stage record"):
        # students cannot read the instructor's containers/: only a staged image (its record) binds a handout
        unbound = (f"{l.image}: no staged image to bind the handout to; run `stage {env.name} --cluster "
                   f"{cluster.name}` first (--dry-run shows the handout before that)")
        if not dry_run:
            raise ShipyardError(f"course.handout: {unbound}")
    launch_commands.require_current_spec(ctx, l, env, opts.force)
    student = handout.student_launcher(l)
    text = handout.render(student, str(ctx.registry.root), preview=dry_run)
    shell_part = cluster.interactive_partition or l.partition
    check = (image_check.Check(l.image, l.image_sha256, l.image_input_hash, l.image_bound_from)
             if l.image_sha256 else None)  # the launcher's own binding; --image opts out, as in the launcher
    interactive = handout.shell_line(student, shell_part, l.time, l.modules,
                                     image_check.SCRIPT if check else None)
    extra = {image_check.SCRIPT: (image_check.render(check, env.name, "invoke course.handout",
                                                     "STUDENTS.md's interactive srun line runs"), 0o755)} \
        if check else None
    dest = Path(out).absolute()
    md = handout.students_md(student, env.name, shlex.join(command), interactive, str(dest),
                             cluster.host_requirements, image_check.SCRIPT if check else None,
                             sandbox_conf(cluster), changes_since(ctx, env, cluster, dest, l.image))
    script = handout.copy_source(Path(ctx.registry.root), here, command)
    if dry_run:
        return preview(ctx, l.name, text, md, dest, unbound)
    written = handout.write(dest, l.name, text, md, script, force=replace, extra=extra)
    remember(ctx, env, cluster, dest)
    ctx.say(f"wrote the handout for {env.name} on {cluster.name} into {dest}:")
    for p in written:
        ctx.say(f"  {os.path.relpath(p, dest)}{'/' if p.is_dir() else ''}")
    ctx.say(f"students: mkdir -p ~/{env.name} && cp -r {shlex.quote(str(dest))}/. ~/{env.name}/ && cd ~/{env.name} "
            f"&& sbatch {l.name}.sbatch (see STUDENTS.md; the same copy line updates a copy)")
    return 0
