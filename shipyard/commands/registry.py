"""`invoke list`, `show`, `check`, `compat.refresh` and `cluster.import-pcluster`: the registry as tables, one
environment's pins, every problem; the compatibility facts refreshed; a cluster profile added.

The pattern every command module follows: flags in (names, booleans), a :class:`Context` loaded once, names resolved
once, the stage's pure functions called with objects, the result printed on ``ctx.out``, an exit code returned.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import IO, Callable

import yaml

from shipyard import registry
from shipyard.commands import gate
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, read_capped_text
from shipyard.registry import compat, pcluster, refresh, report


def list_(ctx: Context) -> int:
    """`invoke list`."""
    ctx.say(report.list_tables(ctx.registry))
    return 0


def show(ctx: Context, env: str | None, contents: bool = False) -> int:
    """`invoke show [ENV] [--contents]`: the resolved pins, or with ``contents`` what the last build's image holds."""
    if contents:
        from shipyard.commands import containers as container_commands  # lazy: the build backends cost ~0.1 s

        return container_commands.show_contents(ctx, env)
    ctx.say(report.show(ctx.environment(env)))
    ctx.say(report.facts_line())
    return 0


def check(ctx: Context, env: str | None = None, cluster: str | None = None) -> int:
    """`invoke check [ENV] [--cluster C]`: compatibility and lock problems as one table; 1 on any ERROR."""
    reg = ctx.registry
    env_name = ctx.environment(env).name if env else None  # unknown names fail with a did-you-mean
    cluster_name = ctx.cluster(cluster).name if cluster else None
    problems = report.select(compat.check_all(reg) + gate.lock_problems(reg), env_name, cluster_name)
    n_env = 1 if env_name else len(reg.environments)
    n_clusters = 1 if cluster_name else len(reg.clusters)
    text, errors = report.table_text(reg, problems, n_env, n_clusters)
    ctx.write(text + report.facts_line() + "\n")
    return 1 if errors else 0


def compat_refresh(torch: str | None = None, write: bool = False, companions: bool = True, path: Path | None = None,
                   out: IO[str] | None = None) -> int:
    """`invoke compat.refresh`: print the diff between compat.yaml and what the metadata says; write it only with
    ``write``; 1 when it differs and was not written.

    No :class:`Context`: the facts it refreshes ship with shipyard, so it runs without a registry.yaml.
    """
    out = out or sys.stdout
    path = path or refresh.COMPAT_PATH
    text = path.read_text(encoding="utf-8")
    committed = yaml.safe_load(text)  # the committed file as it is on disk (facts.load caches the package copy)
    patches = [p.strip() for p in torch.split(",")] if torch else compat.known_torch_versions()
    uv = refresh.Uv.default()
    print(f"compat refresh: reading PyPI metadata of {len(patches)} torch release(s) with uv "
          f"({uv.platform}; files uploaded before {refresh.cutoff()}, compat.yaml review.date)", file=out)
    derived = refresh.derive(patches, uv, companions=companions)
    coverage = refresh.variant_coverage(uv, patches, derived)
    if not torch:  # the release lists are about the data as a whole, not about the torch releases asked for
        refresh.derive_releases(uv, committed, derived)
    new = refresh.refreshed_text(text, derived, committed)
    for note in derived.notes + coverage:
        print(f"note: {note}", file=out)
    if not derived.wheels:
        raise ShipyardError(f"compat refresh: the index listed no wheel of the {len(patches)} torch release(s) asked "
                            f"for ({uv.platform}): nothing was compared and {path.name} is unchanged; check the "
                            "network and the index uv reads (UV_DEFAULT_INDEX, UV_INDEX_URL, UV_OFFLINE)")
    read = f"{len(derived.wheels)} of {len(patches)} release(s) read" if len(derived.wheels) < len(patches) \
        else f"{len(patches)} release(s) read"
    d = refresh.diff(text, new)
    if not d:
        print(f"compat refresh: {path.name} agrees with the metadata ({read}, {uv.runs} uv runs)", file=out)
        return 0
    print(d, end="", file=out)
    if not write:
        print(f"compat refresh: {path.name} NOT written; review the diff above, then rerun with --write", file=out)
        return 1
    atomic_write(path, new)
    print(f"compat refresh: wrote {path}", file=out)
    return 0


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
