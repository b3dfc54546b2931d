"""The build manifest ``containers/<env>.json``: what an image is, what made it, and where it went.

Several writers touch one manifest (build, sign, push), sometimes from different processes. Every change is
therefore a read-modify-write under an exclusive ``fcntl`` lock on a sidecar file, finished with an atomic rename
(``shipyard.files.atomic_write``): a reader never sees a half-written manifest, and two writers never lose each other's
fields.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Iterator

from shipyard.errors import ShipyardError
from shipyard.files import atomic_write


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest as a dict; ``{}`` when it does not exist yet. A corrupt manifest is a one-line user error."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShipyardError(f"{path}: corrupt build manifest ({exc.msg} at line {exc.lineno}); "
                            "delete it and rebuild with `invoke build ENV --force`") from None
    if not isinstance(data, dict):
        raise ShipyardError(f"{path}: corrupt build manifest (expected a JSON object)")
    return data


@contextlib.contextmanager
def _merge_lock(path: Path) -> Iterator[None]:
    """Exclusive lock for one read-modify-write of ``path`` (a sidecar ``.lock`` file: the manifest itself is
    replaced by rename, so it cannot carry the lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def render(data: dict) -> str:
    """Canonical text of a manifest: sorted keys, stable indentation, trailing newline (diff- and golden-friendly)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def update_manifest(path: str | os.PathLike, **fields) -> dict:
    """Merge ``fields`` into the manifest at ``path`` atomically and return the new content.

    A field set to ``None`` is removed. Top-level merge only: a caller that owns a nested dict (``signature``,
    ``push``) passes the whole dict.
    """
    path = Path(path)
    with _merge_lock(path):
        data = read_manifest(path)
        for key, value in fields.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        atomic_write(path, render(data))
    return data
