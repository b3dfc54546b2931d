"""Helpers shared by every invoke task: error boundary, tables, atomic writes.

Kept here so that ``tasks.py`` stays a thin layer of flags -> package calls.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Sequence

from shipyard.errors import ShipyardError


def task_guard(fn: Callable) -> Callable:
    """Turn a :class:`ShipyardError` into one line on stderr and its exit code (2 by default), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ShipyardError as exc:
            print(f"shipyard: error: {exc}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        except KeyboardInterrupt:
            print("shipyard: interrupted", file=sys.stderr)
            raise SystemExit(130) from None

    return wrapper


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


def atomic_write(path: str | os.PathLike, text: str | bytes, mode: int | None = None) -> Path:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``os.replace``.

    A reader never sees a half-written file, and an interrupted write leaves the old file intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is None:
            try:
                mode = path.stat().st_mode & 0o7777  # keep the mode of the file we replace
            except FileNotFoundError:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


OPTIONAL_POSITIONALS = {"env", "environment"}


def allow_optional_positionals(names=OPTIONAL_POSITIONALS) -> None:
    """Let `invoke build pytorch-2.3` and `invoke launch --nodes 2` share one task signature.

    invoke treats every positional argument as required. Tasks here declare ``positional=["env"]`` with a None
    default; this hook fills a missing one with "" just before invoke checks for missing positionals, and the task
    treats "" as "use defaults.environment". Called once from tasks.py, before any parsing happens.
    """
    from invoke.parser.parser import ParseMachine

    if getattr(ParseMachine, "_shipyard_optional", False):
        return
    original = ParseMachine.complete_context

    def complete_context(self):
        if self.context:
            for arg in self.context.positional_args:
                if arg.value is None and arg.name in names:
                    arg.value = ""
        return original(self)

    ParseMachine.complete_context = complete_context
    ParseMachine._shipyard_optional = True
