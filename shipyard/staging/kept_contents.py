"""The contents record kept with a staged version: ``<storage>/ENV.<sha12>.sif.contents.json`` beside the version
and its stage record, so `invoke diff ENV --staged A --staged B` compares two versions students ran, long after
containers/ENV.json moved on to other builds.

Why a file of its own and not a field of the stage record: the record is read by every job's ``sed`` and capped at
64 KiB; a contents record (every Python and Debian package of the image) is larger, and no job needs it. Why only
from a build in containers/: that build's manifest recorded what its image holds, and the stage verified the staged
bytes are that image's; an image pulled from a registry comes with no record (it is kept when containers/ holds the
very same image). Written with the version's mode, created exclusively (never through a symlink), before the
pointer moves; read capped, never through a symlink.

A version is named on the command line as ``current`` (what ``ENV.sif`` names now), its file name, or a prefix of
its sha256 (at least 4 hex digits, as ``stage --list`` prints them).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from shipyard.containers.contents import Contents
from shipyard.errors import ShipyardError
from shipyard.files import exclusive_write, read_capped_text
from shipyard.staging import versions

SUFFIX = ".contents.json"
_PREFIX = re.compile(r"\A[0-9a-f]{4,64}\Z")


def path(version: Path) -> Path:
    """``<storage>/ENV.<sha12>.sif`` -> ``<storage>/ENV.<sha12>.sif.contents.json``."""
    return Path(str(version) + SUFFIX)


def keep(version: Path, contents: Contents, mode: int) -> Path:
    """Write ``contents`` beside ``version`` (replacing one a stage of the same bytes left)."""
    return exclusive_write(path(version), json.dumps(contents.to_dict(), indent=2, sort_keys=True) + "\n", mode=mode)


def read(version: Path) -> Contents | None:
    """The contents kept with ``version``; None when it has none (staged from a registry, or by a shipyard that
    kept none). Anything else at that name (a symlink, a FIFO, corrupt JSON) is one error line naming it."""
    p = path(version)
    try:
        text = read_capped_text(p, "staged_contents", "a staged version's contents record", regular=True)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ShipyardError(f"{p}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShipyardError(f"{p}: corrupt contents record ({exc.msg} at line {exc.lineno})") from None
    return Contents.from_dict(data, str(p))


def remove(version: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path(version).unlink()


def find(dest: Path, name: str) -> Path:
    """The staged version of the image ``dest`` (its pointer, ``<storage>/ENV.sif``) that ``name`` names."""
    staged = versions.listed(dest)
    if name == "current":
        now = versions.current(dest)
        if now == dest or now not in staged:
            raise ShipyardError(f"--staged current: {dest} names no staged version (run `invoke stage` first)")
        return now
    hits = [v for v in staged if v.name == name]
    if not hits and _PREFIX.match(name):
        hits = [v for v in staged if _sha12(v).startswith(name[:versions.DIGITS])]
    known = ", ".join(v.name for v in staged) or "none"
    if not hits:
        raise ShipyardError(f"--staged {name}: no staged version of {dest.name} by that name or sha256 prefix in "
                            f"{dest.parent} (staged: {known}; or `current`)")
    if len(hits) > 1:
        raise ShipyardError(f"--staged {name}: names {len(hits)} staged versions ({', '.join(v.name for v in hits)});"
                            " give more of the sha256")
    return hits[0]


def _sha12(version: Path) -> str:
    return version.name.rsplit(".", 2)[-2]
