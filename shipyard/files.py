"""File helpers every stage shares: atomic writes, content hashes, UTC timestamps, plain-text tables.

Why one place: a generated file must never be seen half-written (temp file in the same directory, then rename),
and hashes and timestamps must be spelled the same in every manifest, record and launcher header.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from shipyard import facts
from shipyard.errors import ShipyardError

_CHUNK = 1 << 20


def read_capped(path: str | os.PathLike, kind: str, what: str | None = None, *, regular: bool = False) -> bytes:
    """The bytes of ``path``, reading at most the cap ``input_bytes.KIND`` of ``shipyard/data/limits.yaml`` plus one.

    Why a cap before reading: ``/dev/zero``, a FIFO nobody writes or a runaway log must be one line naming the file
    and the cap, not an OOM or a hang. A FIFO is opened without waiting for a writer (one without a writer reads
    empty; a pipe from bash's ``<(...)`` is read to its end); a larger input is a :class:`ShipyardError`. With
    ``regular`` (a file another user or host controls) anything but a regular file -- a FIFO, a device, a symlink
    at ``path`` itself -- is a :class:`ShipyardError` before a byte is read. OSError (missing, a directory, no
    permission) is left to the caller, who knows what the file is for."""

    cap = int(facts.load("limits")["input_bytes"][kind])
    nofollow = os.O_NOFOLLOW if regular else 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | nofollow | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if regular and os.path.islink(path):
            raise ShipyardError(f"{path}: {what or 'input'} is a symlink, never followed (someone else put it "
                                "there); remove it") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if regular and not stat.S_ISREG(mode):
            raise ShipyardError(f"{path}: {what or 'input'} is not a regular file (a FIFO or a device); remove it")
        os.set_blocking(fd, True)  # opened without waiting for a writer; now read what a writer sends (bash's <(...))
        chunks, got = [], 0
        while got <= cap:
            chunk = os.read(fd, min(_CHUNK, cap + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > cap:
        raise ShipyardError(f"{path}: {what or 'input'} larger than {cap} bytes; refused without reading further "
                            f"(input_bytes.{kind} in shipyard/data/limits.yaml)")
    return b"".join(chunks)


@contextlib.contextmanager
def output_to(flag: str, value: object):
    """Writing where the user said (``--out``, ``--prefix``): a path that cannot be written (a directory where a file
    goes, a parent that is a file, /proc, a full disk, no permission) is one line naming the flag, its value and the
    file, never a traceback."""
    try:
        yield
    except OSError as exc:
        what = exc.filename2 or exc.filename or value
        raise ShipyardError(f"{flag} {value}: cannot write {what}: {exc.strerror or exc}; give a writable path") \
            from None


def read_capped_text(path: str | os.PathLike, kind: str, what: str | None = None, errors: str = "strict", *,
                     regular: bool = False) -> str:
    """:func:`read_capped` decoded as UTF-8 (``errors`` as for ``bytes.decode``)."""
    return read_capped(path, kind, what, regular=regular).decode("utf-8", errors)


def atomic_write(path: str | os.PathLike, text: str | bytes, mode: int | None = None) -> Path:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``os.replace``.

    A reader never sees a half-written file, and an interrupted write leaves the old file intact. ``mode`` defaults
    to the mode of the file replaced, else 0666 less the umask.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777  # keep the mode of the file we replace
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    return _fill_and_replace(fd, Path(tmp), text, path, mode)


def _fill_and_replace(fd: int, tmp: Path, text: str | bytes, path: Path, mode: int | None = None) -> Path:
    """Write ``text`` through ``fd`` (the open temp file ``tmp``), fsync, set ``mode`` (when given), rename over
    ``path``; on any failure the temp file is removed and ``path`` is untouched."""
    data = text.encode() if isinstance(text, str) else text
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def exclusive_temp(target: str | os.PathLike, mode: int, tag: str = "tmp") -> tuple[int, Path]:
    """A new file beside ``target`` for writing it: created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name
    (``.NAME.TAG.HOST.PID.RANDOM``: whose it is, and unguessable) with ``mode`` from the start (the umask cannot widen
    it; fchmod makes it exact). A symlink, directory or file planted at that name is an error, never written through.
    Returns the open descriptor and the path."""
    target = Path(target)
    name = f".{target.name}.{tag}.{os.uname().nodename}.{os.getpid()}.{secrets.token_hex(8)}"
    tmp = target.with_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def exclusive_write(path: str | os.PathLike, text: str | bytes, mode: int = 0o644) -> Path:
    """Like :func:`atomic_write`, for a directory others can write in: the temp file is made by
    :func:`exclusive_temp` (never through a planted link, the final mode from the start), then renamed over ``path``
    (a link at ``path`` itself is replaced, not followed)."""
    path = Path(path)
    fd, tmp = exclusive_temp(path, mode)
    return _fill_and_replace(fd, tmp, text, path)


def sha256_fd(fd: int) -> str:
    """sha256 of an open file's content from its start (pread: the descriptor's offset is left alone)."""
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, _CHUNK, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 of a file's content, read in 1 MiB blocks (flat memory for multi-GB images)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def copied_tree(root: str | os.PathLike, rel: str) -> list[Path]:
    """The regular files a build copies for ``rel`` (a file or a directory, relative to ``root``), sorted.

    Refused with one line (:class:`ValueError`, the caller names the key): a symlink anywhere in it that leads outside
    the project, to a directory (Apptainer's copy follows it and docker's keeps it as a link, so the image would
    depend on the backend, and a link could bring in anything) or to nothing. A symlink to a regular file inside the
    project is kept and its target hashed. Directories are walked without following links."""
    root = Path(root)
    real_root = root.resolve()
    src = root / rel

    def check(p: Path) -> None:
        if not p.is_symlink():
            return
        target = p.resolve()
        if not target.is_relative_to(real_root):
            raise ValueError(f"{p.relative_to(root)} leads outside the project ({root}) through a symlink; "
                             "copy the file in instead")
        if target.is_dir():
            raise ValueError(f"{p.relative_to(root)} is a symlink to a directory ({target.relative_to(real_root)}); "
                             "copied directories may hold symlinks to files only: copy the directory in instead")
        if not target.is_file():
            raise ValueError(f"{p.relative_to(root)} is a symlink to no regular file; remove it or copy the file in")

    if not src.resolve().is_relative_to(real_root):
        raise ValueError(f"{rel} leads outside the project ({root}) once '..' and symlinks are resolved; "
                         "copy the file into the project")
    if not src.is_dir():
        check(src)
        return [src]
    out = []
    for d, dirs, names in os.walk(src, followlinks=False):
        for name in dirs + names:
            p = Path(d, name)
            check(p)
            if p.is_file():
                out.append(p)
    return sorted(out)


def now_iso() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SSZ`` (the one timestamp form in manifests and records)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Render a plain-text table (no dependency; output is stable for golden tests)."""
    rows = [["" if c is None else str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    fmt = "  ".join("{:<%d}" % w for w in widths)
    out = [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()]
    out += [fmt.format(*r).rstrip() for r in rows]
    return "\n".join(out)
