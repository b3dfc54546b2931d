"""File helpers every stage shares: atomic writes, content hashes, UTC timestamps, plain-text tables.

Why one place: a generated file must never be seen half-written (temp file in the same directory, then rename),
and hashes and timestamps must be spelled the same in every manifest, record and launcher header.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
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


def exclusive_temp(target: str | os.PathLike, mode: int, tag: str = "tmp",
                   readable: bool = False) -> tuple[int, Path]:
    """A new file beside ``target`` for writing it: created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name
    (``.NAME.TAG.HOST.PID.RANDOM``: whose it is, and unguessable) with ``mode`` from the start (the umask cannot widen
    it; fchmod makes it exact). A symlink, directory or file planted at that name is an error, never written through.
    Returns the open descriptor (write-only, or read-write when ``readable``) and the path."""
    target = Path(target)
    name = f".{target.name}.{tag}.{os.uname().nodename}.{os.getpid()}.{os.urandom(8).hex()}"
    tmp = target.with_name(name)
    access = os.O_RDWR if readable else os.O_WRONLY
    fd = os.open(tmp, access | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def exclusive_write(path: str | os.PathLike, text: str | bytes, mode: int = 0o644) -> Path:
    """Like :func:`atomic_write`, for a file in a configured directory others can write in (a stage record in the
    storage): written by :class:`SharedFolder` (an exclusive temp file, never through a planted link, the final mode
    from the start, renamed over ``path``: a link at ``path`` itself is replaced, not followed)."""
    path = Path(path)
    with SharedFolder(path.parent, str(path.parent), configured=True) as folder:
        return folder.write(path.name, text, mode)


class SharedFolder:
    """A writer for a folder others can write in (a handout ``--out``, shared storage): every entry is created or
    replaced through the folder's own descriptor (``dir_fd``), never through a path that a planted link could steer.

    Why through a descriptor: a path like ``OUT/logs/x`` is resolved afresh at each use, so a link someone puts at
    ``logs`` (or at a sub-folder of a copied script's path) sends the write, or a chmod, wherever it points. Here a
    directory is opened with ``O_NOFOLLOW`` one name at a time, a file is written to an exclusive temp name beside its
    target and renamed over it (a link at the target's name is replaced, not followed), and a mode is set only on
    what this writer created (``fchmod`` on its own descriptor). A link found where a directory must be is refused in
    one line: it is someone else's, and shipping it would ship whatever it points to."""

    _DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

    def __init__(self, path: str | os.PathLike, what: str, mode: int = 0o755, *, configured: bool = False):
        """Open (or create, with ``mode``) the folder ``path`` itself; ``what`` names it in errors (``--out X``).
        ``configured``: the folder is named by the site's configuration (a cluster's storage, which an admin may
        have made a link to the real filesystem): followed when it is a link, never created; its entries are still
        written as above."""
        self.path = Path(path)
        self.what = what
        created = False
        if configured:
            self.fd = os.open(self.path, self._DIR & ~os.O_NOFOLLOW)
            self.created = False
            return
        if not self.path.is_symlink() and not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.path, 0o700)  # private until its mode is set on our own descriptor
                created = True
            except FileExistsError:
                pass
        self.fd = self._open_dir(None, str(self.path), self.what)
        self.created = created
        if created:
            os.fchmod(self.fd, mode)

    def _open_dir(self, dir_fd: int | None, name: str, label: str) -> int:
        try:
            fd = os.open(name, self._DIR, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and self._is_link(dir_fd, name):
                raise ShipyardError(f"{label}: is a symbolic link, which this writer did not make (someone else "
                                    "put it there); remove it or name another folder") from None
            if exc.errno == errno.ENOTDIR:
                raise ShipyardError(f"{label}: exists and is not a directory") from None
            raise
        return fd

    @staticmethod
    def _is_link(dir_fd: int | None, name: str) -> bool:
        try:
            return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            return False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "SharedFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _label(self, rel: PurePosixPath | str) -> str:
        return f"{self.what}: {rel}"

    def _parts(self, rel: str | os.PathLike) -> list[str]:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{rel}: expected a relative path of plain names inside the folder")
        return list(parts)

    def _walk(self, parts: Sequence[str], mode: int) -> int:
        """A descriptor of the directory ``parts`` below the folder, each missing one created with ``mode``; a link
        at any of them is refused. The caller closes it."""
        fd = os.dup(self.fd)
        done: list[str] = []
        try:
            for name in parts:
                done.append(name)
                made = False
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
                sub = self._open_dir(fd, name, self._label("/".join(done)))
                os.close(fd)
                fd = sub
                if made:
                    os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def mkdir(self, rel: str | os.PathLike, mode: int = 0o755) -> Path:
        """The directory ``rel`` (created with ``mode`` when missing; an existing one keeps its mode)."""
        os.close(self._walk(self._parts(rel), mode))
        return self.path / rel

    def write(self, rel: str | os.PathLike, data: str | bytes, mode: int = 0o644, dir_mode: int = 0o755) -> Path:
        """Create or replace the file ``rel`` with ``data`` and ``mode`` (its directories made as :meth:`mkdir`)."""
        parts = self._parts(rel)
        fd = self._walk(parts[:-1], dir_mode)
        name = parts[-1]
        tmp = f".{name}.tmp.{os.uname().nodename}.{os.getpid()}.{os.urandom(8).hex()}"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                          mode, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as fh:
                    os.fchmod(fh.fileno(), mode)
                    fh.write(data.encode() if isinstance(data, str) else data)
                    fh.flush()
                    os.fsync(fh.fileno())
                if self._is_dir(fd, name):
                    raise ShipyardError(f"{self._label(rel)}: is a directory where this writer puts a file; "
                                        "remove it")
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=fd)
                raise
        finally:
            os.close(fd)
        return self.path / rel

    @staticmethod
    def _is_dir(dir_fd: int, name: str) -> bool:
        try:
            return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return False


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
