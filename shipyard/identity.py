"""The one rule for "is this still the same file?" without reading it: the same size, mtime to the nanosecond, inode
number and ctime to the nanosecond.

Why one rule: the build cache (a recorded artifact is still current), `invoke stage` (the image in the storage is
already the one asked for), the record check in Python (``doctor``, the launcher binding) and the job's pre-srun
check in the batch script all ask this question about multi-gigabyte images, where re-hashing costs minutes. Here is
the only definition, in Python (:func:`stamp`, :func:`changed`) and for the shell (:data:`SHELL_STAT`,
:data:`SHELL_FIELDS`, which the launcher template uses).

Why inode and ctime as well as size and mtime: the mtime is whatever the file's owner says it is (``touch -d``,
``os.utime``), so a different file of the same size with its mtime set back looked unchanged. The ctime ("status
change time") is set by the kernel to the current time on every write, chmod, link or rename and no system call sets
it back; the inode number says it is still the same file and not another one renamed to its name. GNU ``stat -c
'%i %.9Z'`` prints the same values on a compute node as Python here (on a shared filesystem the server's), so the
job applies the rule without Python.

What it is not: a content check. A recorded stamp is only as good as the record that holds it; a record that someone
else can rewrite names whatever stamp they like. The job therefore also verifies the image's sha256 itself, once per
image file: the launcher (and :func:`shipyard.staging.record.content_differs`) caches "this stamp had this sha256"
in the user's own 0700 cache directory, keyed by this stamp (which the file's writer cannot reproduce for other
content).

A recorded stamp without inode/ctime (a build manifest written before they were recorded) never equals a stamp now:
callers that may meet one fall back to the content (the build cache re-hashes and re-records).
"""

from __future__ import annotations

import os
import stat as stat_module
from dataclasses import dataclass
from pathlib import Path

# `stat -c` format printing "SIZE SECONDS.NANOSECONDS INODE SECONDS.NANOSECONDS"; with the dots removed (`tr -d .`)
# it reads "SIZE MTIME_NS INO CTIME_NS", the values of SHELL_FIELDS in a record, joined by one space
SHELL_STAT = "%s %.9Y %i %.9Z"
SHELL_FIELDS = ("size", "mtime_ns", "ino", "ctime_ns")


def shell_rule() -> dict[str, object]:
    """The shell's half of the rule as a template reads it (``identity.SHELL_STAT``, ``identity.SHELL_FIELDS``): plain
    data, so that a render holding it can be kept (shipyard/rendered.py)."""
    return {"SHELL_STAT": SHELL_STAT, "SHELL_FIELDS": SHELL_FIELDS}


@dataclass(frozen=True)
class Stamp:
    """What a record keeps to recognise a file later: size in bytes, mtime in ns, inode number, ctime in ns."""

    size: int
    mtime_ns: int
    ino: int | None = None
    ctime_ns: int | None = None

    def describe(self) -> str:
        return f"size {self.size}, mtime_ns {self.mtime_ns}, inode {self.ino}, ctime_ns {self.ctime_ns}"


def of_stat(st: os.stat_result) -> Stamp:
    return Stamp(st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def stamp(path: str | os.PathLike) -> Stamp:
    """The stamp of ``path`` now (one stat, never through a symlink at ``path`` itself: a link is "changed", its
    target's stamp is not the link's; OSError when it cannot be stat'ed)."""
    st = Path(path).lstat()
    if not _regular(st):
        raise OSError(0, "not a regular file (a symlink or something else)")
    return of_stat(st)


def fstamp(fd: int) -> Stamp:
    """The stamp of the open file ``fd`` (the file this process wrote, whatever is at its name now)."""
    return of_stat(os.fstat(fd))


def _regular(st: os.stat_result) -> bool:
    return stat_module.S_ISREG(st.st_mode)


def changed(path: str | os.PathLike, recorded: Stamp) -> str | None:
    """None when ``path`` still has the ``recorded`` stamp; else why not, in one line (no read of its content)."""
    try:
        now = stamp(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if now != recorded:
        return f"{path} changed ({now.describe()}; the record says {recorded.describe()})"
    return None
