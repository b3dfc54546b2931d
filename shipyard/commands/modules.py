"""`invoke modules`: Lmod modulefiles and wrappers that run the staged image of each environment on a cluster (a
course's students load them; :mod:`shipyard.launch.modules` writes them), each wrapper checking the image first.
"""

from __future__ import annotations

import os
import shlex

from shipyard.commands.context import Context
from shipyard.files import output_to
from shipyard.launch import image_check, modules as module_files


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
