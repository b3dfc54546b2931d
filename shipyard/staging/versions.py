"""Staged versions of one image: each stage keeps its build as ``<storage>/ENV.<sha12>.sif`` (with its record
beside it), and ``<storage>/ENV.sif`` is the current pointer: a symlink that `invoke stage` makes, naming one such
file in the same folder.

Why versions: a launcher (a student's handout) names one image; when the next stage replaced that very file, every
job queued before the update, and every copy of the old handout, stopped on a record that no longer matched. Now a
launcher is written for the version the pointer names when it is written, so a stage moves the pointer and the jobs
bound to the old version still find it. ``--rollback`` moves the pointer back; ``--prune`` removes what no handout
binds.

The pointer is read, never followed blindly: only a symlink whose target is a bare name of this image's version form,
naming a regular file beside it, counts (:func:`current`); anything else at ``ENV.sif`` is what it was before (a
regular file staged by an older shipyard, or someone else's symlink, which stage replaces).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

DIGITS = 12  # of the sha256 in a version's name: unique among one image's builds, short enough to read


def _parts(dest: Path) -> tuple[str, str]:
    stem, _, suffix = dest.name.rpartition(".")
    return stem, suffix


def _pattern(dest: Path) -> re.Pattern:
    stem, suffix = _parts(dest)
    return re.compile(rf"{re.escape(stem)}\.[0-9a-f]{{{DIGITS}}}\.{re.escape(suffix)}")


def version_path(dest: str | Path, sha256: str) -> Path:
    """``<storage>/ENV.sif`` and a sha256 -> ``<storage>/ENV.<first 12 hex digits>.sif``."""
    dest = Path(dest)
    stem, suffix = _parts(dest)
    return dest.with_name(f"{stem}.{sha256[:DIGITS]}.{suffix}")


def current(image: str | Path) -> Path:
    """The version file the pointer ``image`` names; ``image`` itself when it is no pointer of stage's."""
    p = Path(image)
    try:
        if not p.is_symlink():
            return p
        target = os.readlink(p)
    except OSError:
        return p
    if "/" in target or not _pattern(p).fullmatch(target):
        return p
    version = p.with_name(target)
    try:
        return version if stat.S_ISREG(version.lstat().st_mode) else p
    except OSError:
        return p


def resolve(image: str | None) -> str | None:
    """:func:`current` for a launcher's image path (None, a registry reference or a plain path pass through)."""
    if not image or not image.startswith("/"):
        return image
    return str(current(image))


def is_pointer(dest: Path) -> bool:
    return current(dest) != dest


def point(dest: Path, version: Path) -> None:
    """Make ``dest`` name ``version`` in one step: a symlink made under a name of this process, renamed over it."""
    tmp = dest.with_name(f".{dest.name}.pointer.{os.uname().nodename}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(version.name, tmp)
    os.replace(tmp, dest)


def listed(dest: Path) -> list[Path]:
    """Every version of ``dest``'s image in its folder (regular files of the version form), by name."""
    pattern = _pattern(dest)
    out = []
    for p in sorted(dest.parent.glob(f"{_parts(dest)[0]}.*.{_parts(dest)[1]}")):
        with contextlib.suppress(OSError):
            if pattern.fullmatch(p.name) and stat.S_ISREG(p.lstat().st_mode):
                out.append(p)
    return out


# ------------------------------------------------------------------------------------------------ handouts


def handouts_file(dest: Path) -> Path:
    """Where `course.handout` lists the handout folders written for ``dest``'s image (``.ENV.sif.handouts``)."""
    return dest.with_name(f".{dest.name}.handouts")


def read_handouts(dest: Path) -> list[Path]:
    try:
        fd = os.open(handouts_file(dest), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    with os.fdopen(fd) as fh:
        return [Path(line.strip()) for line in fh.read(1 << 20).splitlines() if line.strip().startswith("/")]


def add_handout(dest: Path, out: Path) -> None:
    """Remember that the handout in ``out`` was written for a version of ``dest`` (one line, appended once)."""
    if out in read_handouts(dest):
        return
    fd = os.open(handouts_file(dest), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "a") as fh:
        fh.write(f"{out}\n")


def binders(dest: Path) -> dict[str, list[Path]]:
    """Version file name -> the handout folders whose launchers name it today (a handout replaced since binds only
    its new version)."""
    names = {v.name for v in listed(dest)}
    out: dict[str, list[Path]] = {}
    for folder in read_handouts(dest):
        for launcher in sorted(folder.glob("*.sbatch")) if folder.is_dir() and not folder.is_symlink() else []:
            try:
                text = launcher.read_text(errors="replace") if launcher.is_file() and not launcher.is_symlink() \
                    else ""
            except OSError:
                continue
            for name in names:
                if f"{dest.parent}/{name}" in text and folder not in out.setdefault(name, []):
                    out[name].append(folder)
    return out
