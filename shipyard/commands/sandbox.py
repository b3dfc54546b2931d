"""`invoke sandbox.up`, `sandbox.down`, `sandbox.status` and `sandbox.exec`: this machine's local Slurm cluster.

Only `up` reads the registry (``clusters.sandbox`` gives the cluster's shape); `down`, `status` and `exec` act on
the sandbox directory alone, so they work from any folder, with or without a registry.yaml.
"""

from __future__ import annotations

import sys
from typing import IO, Sequence

from shipyard import sandbox, slurm
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError


def up(ctx: Context, nodes: int | None = None, gpus_per_node: int | None = None, directory=None,
       install: bool = True) -> int:
    """`invoke sandbox.up`: start the sandbox (idempotent) and say where it is."""
    ctx.say(sandbox.info_line(sandbox.up(nodes, gpus_per_node, directory, install=install,
                                         cluster=ctx.registry.sandbox_cluster())))
    return 0


def down(directory=None, keep: bool = False, out: IO[str] | None = None) -> int:
    """`invoke sandbox.down`: stop what `up` started; its files too unless ``keep``."""
    print(sandbox.down(directory, keep=keep), file=out or sys.stdout)
    return 0


def status(directory=None, out: IO[str] | None = None) -> int:
    """`invoke sandbox.status`: nodes, partitions and jobs of the sandbox (or that it is down)."""
    print(sandbox.status(directory), file=out or sys.stdout)
    return 0


def exec_(argv: Sequence[str], directory=None) -> int:
    """`invoke sandbox.exec -- CMD ...`: run CMD (the words after ``--``, exactly as typed) against the sandbox with
    the terminal attached; its exit code."""
    return slurm.run(slurm.SANDBOX, list(argv), timeout=0, directory=directory, capture=False).returncode


def runtimes(project_root, sources=None, directory=None, install: bool = True, out: IO[str] | None = None) -> int:
    """`invoke sandbox.runtimes [--sources DIR]`: build (cached) and install real enroot + pyxis and the real
    Apptainer for the running sandbox; the real pyxis goes into its plugstack.conf. ``sources`` defaults to ../shared/vendor of the project."""
    if sources is None:
        sources = sandbox.default_sources(project_root)
        if sources is None:
            raise ShipyardError("sandbox.runtimes: no source folder: pass --sources DIR (a folder holding the enroot "
                                "and pyxis archives named in shipyard/data/sandbox.yaml runtimes)")
    r = sandbox.install_runtimes(sources, directory, install=install)
    how = "built" if r["built_now"] else "cached"
    print(f"sandbox runtimes: enroot {r['enroot']} + pyxis {r['pyxis']} for Slurm {r['slurm']} ({how} in "
          f"{r['build']}, {r['seconds']:.1f} s); enroot installed under /usr and /etc, Apptainer {r['apptainer']} "
          f"in {r['apptainer_bin']} (the sandbox's env.sh puts it on PATH; sandbox.down removes both); "
          f"plugstack: {' '.join(r['plugstack'])}", file=out or sys.stdout)
    return 0
