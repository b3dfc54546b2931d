"""Processes recorded by PID *and* kernel start time, so that stopping one never signals a look-alike that reused
its PID. Used by the sandbox (its daemons and namespace holders) and by the Slurm client (is the sandbox's
controller still the process that was started?)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Sequence


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def alive(proc: dict) -> bool:
    """Is this exactly the recorded process (``{"pid", "start"}``: same PID and start time) and not a zombie?"""
    st = proc_stat(proc["pid"])
    return st is not None and st[0] not in ("Z", "X") and st[1] == proc["start"]


def netns_inode(pid: int) -> int | None:
    """The inode of the network namespace ``pid`` lives in (None when it is gone)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def reap(pid: int) -> None:
    """Collect a child we started (the test fixture's process) so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def wait_gone(pids: Sequence[int], seconds: float) -> list[int]:
    """Wait up to ``seconds`` for ``pids`` to end; return those still running."""
    deadline = time.monotonic() + seconds
    left = list(pids)
    while left and time.monotonic() < deadline:
        for p in left:
            reap(p)
        left = [p for p in left if (st := proc_stat(p)) is not None and st[0] not in ("Z", "X")]
        if left:
            time.sleep(0.05)
    return left


def kill(pids: Sequence[int], stop_s: float) -> None:
    """SIGTERM, then SIGKILL whatever is left after ``stop_s``."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    left = wait_gone(pids, stop_s)
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    wait_gone(left, stop_s)
