"""The sandbox's record of what it started (``state.json``: each process by PID and start time), the lock that
serialises ``up``/``down`` on one directory, and stopping exactly the recorded processes. Reading the record is the
Slurm client's part (:func:`shipyard.slurm.read_sandbox_state`): it routes clients into the sandbox with it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Iterator

from shipyard import procs
from shipyard.files import atomic_write
from shipyard.sandbox.plan import facts


def write_state(root: Path, state: dict) -> None:
    atomic_write(root / "state.json", json.dumps(state, indent=2) + "\n")


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Serialise up/down on one directory (two test sessions or two shells)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _inside(inodes: set, exclude: set[int]) -> list[int]:
    """Every process in one of the network namespaces ``inodes``, but ``exclude``."""
    if not inodes:
        return []
    out = []
    for entry in Path("/proc").iterdir():
        pid = int(entry.name) if entry.name.isdigit() else None
        if pid is not None and pid not in exclude and procs.netns_inode(pid) in inodes:
            out.append(pid)
    return out


def _wait_link_gone(link: str | None, seconds: float) -> None:
    """The host's leg on the sandbox network goes with the controller's namespace, but the kernel frees a namespace
    after its last process, not with it: wait, so that a sandbox started next finds the name and network free."""
    deadline = time.monotonic() + seconds
    while link and Path("/sys/class/net", link).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def stop(state: dict, root: Path) -> None:
    """Stop the sandbox's processes: first everything inside its namespaces (daemons and job steps), then munged,
    then the namespace holders. Only processes whose PID *and* start time match the record are signalled."""
    stop_s = facts()["timeouts"]["stop_s"]
    live = [p for p in state.get("processes", []) if procs.alive(p)]
    holders = [p for p in live if p["role"].startswith("ns:")]
    # The sandbox's namespaces, found through any live process that ran in one (a holder may have died while its
    # slurmd lives on). Never this process's own namespace: munged, for one, runs in the host's.
    inodes = {procs.netns_inode(p["pid"]) for p in live if p["role"] != "munged"}
    inodes -= {None, procs.netns_inode(os.getpid())}
    holder_pids = {p["pid"] for p in holders}
    procs.kill(_inside(inodes, holder_pids), stop_s)
    # What started in there while the first ones were stopping (slurmd runs the epilog of a job it kills, a dying
    # step may fork): again, until nothing but the holders is left, or for at most stop_s more
    deadline = time.monotonic() + stop_s
    while (late := _inside(inodes, holder_pids)) and time.monotonic() < deadline:
        procs.kill(late, 1.0)
    procs.kill([p["pid"] for p in live if not p["role"].startswith("ns:") and procs.alive(p)], stop_s)
    procs.kill([p["pid"] for p in holders if procs.alive(p)], stop_s)
    _wait_link_gone(state.get("info", {}).get("host_link"), stop_s)
    state["status"] = "down"
    write_state(root, state)
