"""`invoke test`: install what the tests need (Debian packages), then run pytest.

The tests start their own services (a real 2-node Slurm sandbox, dockerd, an OCI registry) through fixtures and
stop them again; this module only makes sure the programs exist. pytest's exit 5 ("no tests ran") counts as a
failure, so a suite that silently collects nothing cannot pass CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from shipyard import facts
from shipyard.errors import ShipyardError


def test_packages() -> list[str]:
    text = facts.text("test-packages.txt")
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def missing_packages(packages: list[str]) -> list[str]:
    if not shutil.which("dpkg-query"):
        return []
    out = []
    for pkg in packages:
        res = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
        if "install ok installed" not in res.stdout:
            out.append(pkg)
    return out


def ensure_packages(packages: list[str] | None = None) -> None:
    """apt-get install the missing packages (root on Debian/Ubuntu); otherwise say what is missing."""
    packages = packages if packages is not None else test_packages()
    missing = missing_packages(packages)
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ShipyardError(f"missing Debian packages {' '.join(missing)}: run as root on Debian/Ubuntu, or "
                            f"install them and rerun with --no-install")
    print(f"shipyard: installing {' '.join(missing)}", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
    res = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)
    if res.returncode:
        raise ShipyardError(f"apt-get install {' '.join(missing)} failed (exit {res.returncode})")


def parallel_args(pytest_args: list[str]) -> list[str]:
    """Two pytest-xdist workers grouped by tests/needs.py (service tests on one worker, every other file whole on
    either), unless the arguments choose (``-n``, ``--numprocesses``, ``-p no:xdist``). Why two: the suite is
    written for two cores, and most of its wall time is one worker waiting on Slurm jobs while the other runs the
    CPU-bound rest."""
    chosen = any(a == "-n" or a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist"
                 for a in pytest_args)
    return [] if chosen else ["-n", "2", "--dist", "loadgroup"]


def run_tests(pytest_args: list[str], install: bool = True) -> int:
    if install:
        ensure_packages()
    res = subprocess.run([sys.executable, "-m", "pytest", *parallel_args(pytest_args), *pytest_args])
    if res.returncode == 5:
        print("shipyard: pytest collected no tests: failing", file=sys.stderr)
        return 1
    return res.returncode
