"""The one rule for "is this still the same file?" without reading it: the same size and the same modification time
to the nanosecond.

Why one rule: the build cache (a recorded artifact is still current), `invoke stage` (the image in the storage is
already the one asked for), the record check in Python (``doctor``, the launcher binding) and the job's pre-srun
check in the batch script all ask this question about multi-gigabyte images, where re-hashing costs minutes. They
used to answer it three ways (size + mtime_ns, size + whole-second mtime, ``stat -c %s``/``%Y``), so a file could be
"unchanged" for one and "changed" for another. Here is the only definition, in Python (:func:`stamp`,
:func:`changed`) and for the shell (:data:`SHELL_STAT`, :data:`SHELL_FIELDS`, which the launcher template uses).

Why size + mtime_ns: every writer of these files (a build, a copy, ``apptainer sign``) changes one of the two, a
stat costs nothing on a shared filesystem, and GNU ``stat -c %.9Y`` (coreutils 8.6 and later) prints the same
nanoseconds on a compute node, so the job can apply the rule without Python. Whole seconds were weaker: a file
rewritten in place within the same second with the same size passed. A later change may add the inode and ctime
(which a ``touch -d`` cannot forge); it belongs here, and only here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# `stat -c` format printing "SIZE SECONDS.NANOSECONDS"; with the dot removed (`tr -d .`) it reads "SIZE MTIME_NS",
# the values of SHELL_FIELDS in a record, joined by one space
SHELL_STAT = "%s %.9Y"
SHELL_FIELDS = ("size", "mtime_ns")


@dataclass(frozen=True)
class Stamp:
    """What a record keeps to recognise a file later: its size in bytes and its mtime in nanoseconds."""

    size: int
    mtime_ns: int

    def describe(self) -> str:
        return f"size {self.size}, mtime_ns {self.mtime_ns}"


def stamp(path: str | os.PathLike) -> Stamp:
    """The stamp of ``path`` now (one stat; OSError when it cannot be stat'ed)."""
    st = Path(path).stat()
    return Stamp(st.st_size, st.st_mtime_ns)


def changed(path: str | os.PathLike, recorded: Stamp) -> str | None:
    """None when ``path`` still has the ``recorded`` stamp; else why not, in one line (no read of its content)."""
    try:
        now = stamp(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if now != recorded:
        return f"{path} changed ({now.describe()}; the record says {recorded.describe()})"
    return None
