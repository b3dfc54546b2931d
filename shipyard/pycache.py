"""Derived data kept where Python keeps a package's own bytecode (its ``__pycache__``): compiled templates, parsed
data files, kept renders, the dataclasses' compiled methods.

Why there: the folder is written only where Python would write the package's .pyc files, and read only from a
regular file (never a symlink) owned by the owner of the package's ``__init__.py`` and writable by nobody else.
Whoever can write there can already change shipyard's code, so no shared folder can hand one user's data to another.
A file's name carries what it was derived from (a content hash, never a time); a missing, foreign or unreadable file
is no error: the caller derives the data again.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import marshal
import os
import stat
import sys
import tempfile
from pathlib import Path


def _places(package: str) -> tuple[Path, Path] | None:
    """The package's ``__init__.py`` and its bytecode folder (honouring ``sys.pycache_prefix``), or None."""
    init = getattr(importlib.import_module(package), "__file__", None)
    return _places_of(init, sys.pycache_prefix) if init else None


@functools.lru_cache(maxsize=None)
def _places_of(init: str, prefix: str | None) -> tuple[Path, Path]:
    return Path(init), Path(importlib.util.cache_from_source(init)).parent


@functools.lru_cache(maxsize=None)
def _owner(init: Path) -> int | None:
    """Who owns the package (its ``__init__.py``), once per process: every kept file must be theirs."""
    try:
        return os.stat(init).st_uid
    except OSError:
        return None


def read(package: str, name: str) -> bytes | None:
    """The bytes of ``name`` in ``package``'s bytecode folder, or None when absent or not to be trusted."""
    places = _places(package)
    if places is None:
        return None
    init, folder = places
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != _owner(init) or st.st_mode & 0o022:
            return None
        chunks = []
        while chunk := os.read(fd, max(st.st_size + 1, 65536)):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_marshal(package: str, name: str):
    """The value marshalled in ``name`` (:func:`read`), or None when absent, not to be trusted, or not marshal's."""
    data = read(package, name)
    if not data:
        return None
    try:
        return marshal.loads(data)
    except (EOFError, ValueError, TypeError):  # a truncated or foreign file
        return None


def read_mapping(package: str, name: str, value_type: type) -> dict:
    """The str -> ``value_type`` mapping marshalled in ``name``, its other entries dropped; {} for anything else."""
    kept = read_marshal(package, name)
    if not isinstance(kept, dict):
        return {}
    return {k: v for k, v in kept.items() if isinstance(k, str) and isinstance(v, value_type)}


def _folder_to_write(package: str) -> Path | None:
    """``package``'s bytecode folder where Python writes bytecode (not under -B or PYTHONDONTWRITEBYTECODE), else
    None: what keeps, lists or removes derived data there."""
    places = None if sys.dont_write_bytecode else _places(package)
    return places[1] if places else None


def write(package: str, name: str, data: bytes) -> None:
    """Keep ``data`` as ``name`` in ``package``'s bytecode folder where Python writes bytecode; else do nothing.

    Written to a temporary file, then renamed: a reader sees the old file or the whole new one."""
    folder = _folder_to_write(package)
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".shipyard-")
    except OSError:  # a read-only install: the caller derives the data in every process, as without a cache
        return
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
        os.replace(tmp, folder / name)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def listing(package: str, prefix: str) -> dict[str, int]:
    """The regular files in ``package``'s bytecode folder whose names start with ``prefix``, by name, with the time
    each was written (ns): what a bounded cache removes the oldest of. Empty where bytecode is not written."""
    folder = _folder_to_write(package)
    if folder is None:
        return {}
    try:
        with os.scandir(folder) as entries:
            return {e.name: e.stat(follow_symlinks=False).st_mtime_ns for e in entries
                    if e.name.startswith(prefix) and e.is_file(follow_symlinks=False)}
    except OSError:
        return {}


def remove(package: str, name: str) -> None:
    """Remove ``name`` from ``package``'s bytecode folder (a link itself, never what it points to); gone is fine."""
    folder = _folder_to_write(package)
    if folder is not None:
        try:
            os.unlink(folder / name)
        except OSError:
            pass
