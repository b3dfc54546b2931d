"""`invoke snakemake.profile`: the Snakemake profile and the Slurm plugin's partition file for a cluster
(:mod:`shipyard.launch.snakemake`), naming the staged image where the cluster runs Apptainer.
"""

from __future__ import annotations

import os
import shlex

from shipyard import runtimes
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.launch import image_check, snakemake


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
