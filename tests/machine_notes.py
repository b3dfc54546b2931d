"""A failed service test (marked slurm or docker) carries a line on the machine at that moment: free space where the
tests write (/tmp, /var/tmp), available memory and the load. Those tests move gigabytes (the real image, its
SquashFS, each node's unpacked copy) beside three other test runs, and a CI machine differs from ours; the line
lands in the failure's E lines, which `invoke test`'s closing digest keeps (tests/suite_runner.py)."""

from __future__ import annotations

import os
import shutil

import pytest


def machine_line() -> str:
    gib = 1024 ** 3
    parts = []
    for path in ("/tmp", "/var/tmp"):
        try:
            parts.append(f"{path} {shutil.disk_usage(path).free / gib:.1f} GiB free")
        except OSError as e:
            parts.append(f"{path}: {e.strerror}")
    try:
        mem = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines() if ":" in line)
        kib = {k: int(v.split()[0]) for k, v in mem.items() if k in ("MemTotal", "MemAvailable")}
        parts.append(f"memory {kib['MemAvailable'] / 1024 ** 2:.1f} of {kib['MemTotal'] / 1024 ** 2:.1f} GiB "
                     "available")
    except (OSError, KeyError, ValueError):
        pass
    parts.append("load %.1f %.1f %.1f" % os.getloadavg())
    return "machine at the failure: " + ", ".join(parts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    try:
        return (yield)
    except Exception as e:
        if hasattr(e, "add_note") and (item.get_closest_marker("slurm") or item.get_closest_marker("docker")):
            e.add_note(machine_line())
        raise
