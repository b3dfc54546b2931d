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

from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.launch import handout, image_check, launcher
from shipyard.launch.options import Options


def handout_folder(ctx: Context, opts: Options, out: str, command: Sequence[str] = (),
                   workdir: str | os.PathLike | None = None, *, force: bool = False) -> int:
    """Write the handout into ``out``; 0, or a ShipyardError line."""
    if not out:
        raise ShipyardError("--out: name the folder to write the handout into (students copy it from there)")
    if not command:
        raise ShipyardError("course.handout: give the training script and its arguments after `--`, as for "
                            "invoke launch (e.g. -- train.py --steps 200)")
    env, cluster = ctx.environment(opts.environment), ctx.cluster(opts.cluster)
    forced = ctx.gate(env, cluster, what="handout", force=opts.force)
    here = Path(workdir or Path.cwd())
    l = launcher.build(ctx.registry, env, cluster, opts, command, here, forced)
    launcher.require_bound(l)
    student = handout.student_launcher(l)
    text = handout.render(student, str(ctx.registry.root))
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
                             cluster.host_requirements, image_check.SCRIPT if check else None)
    script = handout.copy_source(Path(ctx.registry.root), here, command)
    written = handout.write(dest, l.name, text, md, script, force=force, extra=extra)
    ctx.say(f"wrote the handout for {env.name} on {cluster.name} into {dest}:")
    for p in written:
        ctx.say(f"  {os.path.relpath(p, dest)}{'/' if p.is_dir() else ''}")
    ctx.say(f"students: cp -r {shlex.quote(str(dest))} ~/{env.name} && cd ~/{env.name} && sbatch {l.name}.sbatch"
            " (see STUDENTS.md)")
    return 0
