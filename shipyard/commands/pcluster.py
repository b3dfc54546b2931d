"""`invoke cluster.import-pcluster CONFIG`: a cluster profile in registry.yaml from an AWS ParallelCluster config
(:mod:`shipyard.registry.pcluster`), shown as a diff first.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import IO, Callable

from shipyard import registry
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, read_capped_text
from shipyard.registry import pcluster


def import_pcluster(config: str, name: str | None = None, registry_path=None, *, dry_run: bool = False,
                    yes: bool = False, runtime: str | None = None, update: str | None = None,
                    out: IO[str] | None = None, ask: Callable[[str], str] = input) -> int:
    """`invoke cluster.import-pcluster CONFIG`: show the diff of registry.yaml with the new cluster profile, and
    (unless ``dry_run`` or the user says no on a terminal) write it; 1 when the user said no.

    With ``update`` (a profile's name) the edited config is re-read into that existing profile: the keys the user
    added stay, what the config says is updated, and nothing is written without ``yes`` (a re-import replaces
    values the user may have reviewed, so it is never written on a question's default).

    No :class:`Context`: the registry is changed as text (the user's comments and layout stay), and the result is
    validated as a whole before anything is written.
    """
    out = out or sys.stdout
    cpath = Path(config)
    if update is not None:
        update = pcluster.check_name(update, "--update")
        if name and name != update:
            raise ShipyardError(f"--name {name!r} and --update {update!r}: --update names the profile to re-read; "
                                "give one of them")
    try:
        ctext = read_capped_text(cpath, "pcluster_config", "a ParallelCluster config")
    except (OSError, UnicodeDecodeError) as exc:
        raise ShipyardError(f"{cpath}: cannot read the ParallelCluster config: {exc}") from None
    name = update or pcluster.check_name(name or cpath.stem)
    chosen = runtime or None
    if update is None:
        prof = pcluster.profile(ctext, str(cpath), chosen)  # a bad config is named before the registry is read
    rpath = registry.registry_path(registry_path)
    try:
        before = read_capped_text(rpath, "registry", "a registry")
    except (OSError, UnicodeDecodeError) as exc:
        raise ShipyardError(f"{rpath}: cannot read the registry: {exc}") from None
    if update is not None:
        old = pcluster.existing(before, str(rpath), name)
        chosen = runtime or str(old.get("runtime") or "") or None  # the profile's runtime stands unless --runtime
        prof = pcluster.profile(ctext, str(cpath), chosen)
        after, kept = pcluster.updated(before, rpath, name, prof)
    else:
        after, kept = pcluster.added(before, rpath, name, prof, cpath.name), []
    diff = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                str(rpath), f"{rpath} ({'updated' if update else 'with'} clusters.{name})")
    out.write("".join(diff))
    if update is not None and after == before:
        print(f"clusters.{name} already says what {cpath.name} says: nothing to write", file=out)
        return 0
    if kept:
        print("kept as you wrote them (not from the config):", file=out)
        for key in kept:
            print(f"  - {key}", file=out)
    print("review (the config cannot say these):", file=out)
    why = "the profile's, kept; --runtime chooses another" if update is not None and not runtime else None
    kept_keys = {k.split(" ", 1)[0] for k in kept}
    for note in pcluster.review(ctext, str(cpath), name, prof, chosen, why):
        if note.split(":", 1)[0] not in kept_keys:  # what the user already set is not asked for again
            print(f"  - {note}", file=out)
    if dry_run:
        print(f"dry run: {rpath} not changed", file=out)
        return 0
    if update is not None and not yes:
        print(f"nothing written; add --yes to write clusters.{name} into {rpath}", file=out)
        return 0
    if not yes and sys.stdin.isatty():
        if ask(f"write clusters.{name} into {rpath}? [y/N] ").strip().lower() not in ("y", "yes"):
            print(f"{rpath} not changed", file=out)
            return 1
    # a symlinked registry.yaml is written through to its target (the user's own link stays a link)
    atomic_write(Path(os.path.realpath(rpath)), after)
    print(f"wrote clusters.{name} into {rpath} ({len(prof['scheduler']['partitions'])} partitions); "
          f"check it with: invoke check --cluster {name}", file=out)
    return 0
