"""`invoke stage --list | --rollback | --prune`: the staged versions of an image (:mod:`shipyard.staging.versions`),
the pointer moved back to the one staged before, and the versions no handout binds removed.

Each runs under the image's stage lock, so it never races a stage of the same image.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import IO

from shipyard.errors import ShipyardError
from shipyard.staging import kept_contents
from shipyard.staging import record as staged
from shipyard.staging import stage as staging
from shipyard.staging import versions


def _staged(version: Path) -> tuple[tuple[str, int], staged.StageRecord | None]:
    """(when it was staged, its record) for ordering; a version without a readable record sorts first. The record's
    time has whole seconds; the image's ctime at its rename (in the record too) orders two stages of one second."""
    rec, _ = staged.read_record(version)
    return (((rec.staged or ""), rec.ctime_ns or 0) if rec else ("", 0)), rec


def _all(dest: Path) -> list[tuple[Path, staged.StageRecord | None]]:
    """The versions, oldest stage first."""
    rows = [(v, *_staged(v)) for v in versions.listed(dest)]
    return [(v, rec) for v, _, rec in sorted(rows, key=lambda r: (r[1], r[0].name))]


def list_lines(dest: Path) -> list[str]:
    """One line per version: current or not, name, sha256, when and by whom, mode, and the handouts that bind it."""
    rows = _all(dest)
    if not rows:
        return [f"{dest}: no staged versions (run invoke stage first)"]
    now = versions.current(dest)
    bound = versions.binders(dest)
    out = []
    for v, rec in rows:
        mark = "*" if v == now else " "
        what = (f"sha256 {rec.sha256[:12]}, staged {rec.staged} by {rec.staged_by}, mode {rec.mode}" if rec else
                "no readable stage record")
        users = ", ".join(str(p) for p in bound.get(v.name, [])) or "none"
        out.append(f"{mark} {v.name}: {what}; handouts: {users}")
    out.append(f"(* = what {dest.name} names now: new launchers and handouts are written for it)")
    return out


def rollback(dest: Path, out: IO[str] | None = None) -> Path:
    """Point ``dest`` at the version staged just before the current one; that version."""
    with staging.locked(dest, 0o644, dest.parent, out):
        rows = _all(dest)
        now = versions.current(dest)
        names = [v for v, _ in rows]
        if now not in names:
            raise ShipyardError(f"{dest}: no current staged version to roll back from (stage the image first)")
        i = names.index(now)
        if i == 0:
            raise ShipyardError(f"{dest}: {now.name} is the oldest staged version; nothing to roll back to "
                                f"(invoke stage --list shows them)")
        before, rec = rows[i - 1]
        if rec is None or staged.image_changed(before, rec):
            raise ShipyardError(f"{before}: does not match its stage record; not rolling back to it (stage that "
                                "build again)")
        versions.point(dest, before)
    print(f"{dest.name} names {before.name} again (sha256 {rec.sha256[:12]}, staged {rec.staged}); launchers and "
          f"handouts written from now on run it, those written for {now.name} still run theirs", file=out)
    return before


def prune(dest: Path, force: bool = False, out: IO[str] | None = None) -> list[Path]:
    """Remove every version but the current one that no handout binds (``force``: bound ones too); the removed."""
    removed, kept = [], []
    with staging.locked(dest, 0o644, dest.parent, out):
        now = versions.current(dest)
        bound = versions.binders(dest)
        for v, _ in _all(dest):
            if v == now:
                continue
            users = bound.get(v.name, [])
            if users and not force:
                kept.append(f"{v.name} (handouts {', '.join(map(str, users))})")
                continue
            for p in (Path(str(v) + staged.RECORD_SUFFIX), kept_contents.path(v), v):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            removed.append(v)
            print(f"removed {v.name}" + (f" although handouts {', '.join(map(str, users))} bind it (--force)"
                                         if users else ""), file=out)
    if kept:
        print(f"kept {'; '.join(kept)}: their students' jobs run it; --force removes it anyway", file=out)
    if not removed and not kept:
        print(f"{dest.name}: nothing to prune (only the current version is staged)", file=out)
    return removed
