"""Mounts: host paths made visible in the container, parsed once from ``--mounts`` and ``clusters.<name>.binds``.

Why a module of its own: the launchers, ``invoke shell`` and every runtime (which spells a mount its own way) need the
same parsed value, and the runtimes must not depend on the launcher that uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from shipyard.errors import ShipyardError


@dataclass(frozen=True)
class Mount:
    """A host path made visible in the container: ``src`` on the node, ``dst`` inside, read-only or not."""

    src: str
    dst: str
    ro: bool = False


def spec(m: Mount) -> str:
    """``SRC:DST[:ro]``: the ``--mounts`` syntax (what the regenerate line repeats). A function, not a method: a mount
    is plain data, which a launcher's kept render needs (shipyard/rendered.py)."""
    return f"{m.src}:{m.dst}" + (":ro" if m.ro else "")


def parse_mounts(text: str | Sequence[str] | None, root: Path, flag: str = "--mounts") -> tuple[Mount, ...]:
    """``SRC:DST[:ro|rw],...`` (or ``SRC`` alone: same path inside) -> mounts; a relative SRC is under the project."""
    if not text:
        return ()
    items = text.split(",") if isinstance(text, str) else [i for t in text for i in t.split(",")]
    out = []
    for item in items:
        parts = item.split(":")
        if not item or len(parts) > 3 or not parts[0]:
            raise ShipyardError(f"{flag} {item!r}: expected SRC:DST[:ro], comma-separated (e.g. /data:/data:ro)")
        src = parts[0]
        dst = parts[1] if len(parts) > 1 and parts[1] else src
        flags = parts[2] if len(parts) > 2 else "rw"
        if flags not in ("ro", "rw"):
            raise ShipyardError(f"{flag} {item!r}: mount flag {flags!r} is not valid (valid: ro, rw)")
        if not dst.startswith("/"):
            raise ShipyardError(f"{flag} {item!r}: the destination {dst!r} must be an absolute path")
        if not src.startswith("/"):
            src = str((root / src).resolve())
        for p in (src, dst):
            if any(c.isspace() or not c.isprintable() for c in p):
                raise ShipyardError(f"{flag} {item!r}: paths with spaces or control characters cannot be mounted "
                                    "by pyxis or apptainer")
        out.append(Mount(src, dst, flags == "ro"))
    return tuple(out)


def job_mounts(root: Path, cluster, user: Sequence[Mount] = ()) -> tuple[Mount, ...]:
    """The project directory, then the cluster's binds, then the user's mounts; a later mount of the same
    destination wins (so a user can replace a site bind). Launchers and ``invoke shell`` mount exactly this."""
    site = parse_mounts(list(cluster.binds), root, f"clusters.{cluster.name}.binds")
    # fabric_options.host_injection: the host's fabric userspace, read-only at the same path (images need not carry it)
    injected = [Mount(b, b, ro=True) for b in ((cluster.host_injection or {}).get("binds") or ())]
    out: dict[str, Mount] = {}
    for m in (Mount(str(root), str(root)), *site, *injected, *user):
        out[m.dst] = m
    return tuple(out.values())
