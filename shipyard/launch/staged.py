"""The record beside a staged image, ``<storage>/<env>.sif.json`` (or ``.sqsh.json``), and what binds a launcher to it.

Why a record: a launcher names a path, and a path says nothing about what lies there today. `invoke stage` writes,
beside every image it puts into a cluster's storage, the image's sha256, the input hash of the build that made it,
the spec sha256, where it came from and the digest it was pushed under, plus the size and mtime the image had when
it was staged. A launcher names the sha256 and input hash it was written for; before ``srun`` its job compares them
with the record and the image's size and mtime with the record's (two ``stat`` calls: a job must not re-hash
gigabytes before it starts). Anything else -- another image staged since, an image changed in place, no record at
all -- stops the job with one line naming both hashes.

The record is JSON written with one key per line (sorted, two-space indent), so that the batch script can read a
field with ``sed`` on a node without Python. It lives in the launch package because the launchers, ``doctor`` and
`invoke stage` (which writes it) all read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shipyard import project

RECORD_SUFFIX = ".json"
# the fields the batch script reads with sed (each is a string or an integer on its own line)
SHELL_FIELDS = ("sha256", "input_hash", "size", "mtime")


def record_path(image: str | Path) -> Path:
    """``<storage>/<env>.sif`` -> ``<storage>/<env>.sif.json``."""
    return Path(str(image) + RECORD_SUFFIX)


def render_record(data: dict) -> str:
    """The record's text: sorted keys, one per line (the batch script's ``sed`` relies on it)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def read_record(image: str | Path) -> tuple[dict | None, str]:
    """(record, "") when the record beside ``image`` is readable JSON; else (None, why not)."""
    path = record_path(image)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except PermissionError:
        return None, f"{path} is not readable"
    except (OSError, ValueError) as exc:
        return None, f"{path}: unreadable ({exc})"
    if not isinstance(data, dict) or not all(k in data for k in SHELL_FIELDS):
        return None, f"{path}: not a shipyard stage record (needs {', '.join(SHELL_FIELDS)})"
    return data, ""


def image_changed(image: str | Path, record: dict) -> str | None:
    """None when ``image`` still has the size and mtime its record says (a stat, no read); else why not."""
    try:
        st = Path(image).stat()
    except OSError as exc:
        return f"{image}: {exc.strerror or exc}"
    if st.st_size != record.get("size") or int(st.st_mtime) != record.get("mtime"):
        return (f"{image} changed after it was staged (size {st.st_size}, mtime {int(st.st_mtime)}; the record says "
                f"{record.get('size')}, {record.get('mtime')})")
    return None


@dataclass(frozen=True)
class Binding:
    """The image a launcher is written for: its sha256 and input hash, and where they were read."""

    sha256: str
    input_hash: str
    source: str  # "stage record <path>" | "build manifest <path>"


def binding(root: Path, env_name: str, image: str | None, fmt: str) -> Binding | None:
    """What ``image`` should be: its stage record when this machine can read it (the login node of the cluster),
    else the local build manifest's artifact of that format (the image `invoke stage` would put there); None when
    neither is known (``image`` None: the build manifest only)."""
    rec, _ = read_record(image) if image else (None, "")
    if rec and rec.get("sha256") and rec.get("input_hash"):
        return Binding(str(rec["sha256"]), str(rec["input_hash"]), f"stage record {record_path(image)}")
    mpath = project.manifest_path(root, env_name)
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    art = (m.get("artifacts") or {}).get(fmt) if isinstance(m, dict) else None
    if m.get("status") == "ok" and art and art.get("sha256") and m.get("input_hash"):
        return Binding(art["sha256"], m["input_hash"], f"build manifest {mpath}")
    return None
