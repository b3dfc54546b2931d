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
from pathlib import Path

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.sandbox import runtimes

CHECKOUT = Path(__file__).resolve().parents[2]


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


SERVICES = "slurm or docker"  # the marks of tests that use the machine's one Slurm sandbox or dockerd


def choose_workers(pytest_args: list[str]) -> bool:
    """True when the arguments already say how to run (``-n``, ``--numprocesses``, ``--dist``, ``-p no:xdist``)."""
    return any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in pytest_args)


def with_marks(pytest_args: list[str], phase: str) -> list[str]:
    """``pytest_args`` with its ``-m`` expression narrowed to ``phase`` (``-m EXPR`` -> ``-m '(EXPR) and PHASE'``);
    without one, ``-m PHASE`` is added."""
    args, out, found = list(pytest_args), [], False
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            out += ["-m", f"({args[i + 1]}) and ({phase})"]
            found, i = True, i + 2
            continue
        if a.startswith("-m") and len(a) > 2:
            expr = a[2:].removeprefix("=")
            out += ["-m", f"({expr}) and ({phase})"]
            found = True
        else:
            out.append(a)
        i += 1
    return out if found else ["-m", phase, *out]


def phases(pytest_args: list[str]) -> list[list[str]]:
    """The pytest runs of `invoke test`.

    Two, one after the other: every test that needs no service on two pytest-xdist workers (whole files per worker,
    so module fixtures and per-file bookkeeping hold as in a serial run), then the Slurm and docker tests in one
    process, because the sandbox and dockerd are one per machine and a session fixture would start one per worker.
    (xdist's ``--dist loadgroup`` would do both in one run, but it cannot rename pytest 9's node ids and groups
    nothing.) Arguments that choose the workers themselves get one run, as given."""
    if choose_workers(pytest_args):
        return [list(pytest_args)]
    return [["-n", "2", "--dist", "loadfile", *with_marks(pytest_args, f"not ({SERVICES})")],
            ["-p", "no:xdist", *with_marks(pytest_args, SERVICES)]]


def run_tests(pytest_args: list[str], install: bool = True) -> int:
    """Run the phases; pytest's exit 5 (no tests) fails only when no phase ran a test. ``-x`` stops after a failed
    phase."""
    if install:
        ensure_packages()
    note = runtimes.tests_left_out_line(CHECKOUT)
    if note and os.environ.get("CI", "").lower() not in ("true", "1"):
        print(f"shipyard: {note}", flush=True)  # in CI those tests fail instead (tests/fixtures_runtimes.py)
    codes = []
    for args in phases(pytest_args):
        codes.append(subprocess.run([sys.executable, "-m", "pytest", *args]).returncode)
        if codes[-1] not in (0, 5) and ("-x" in pytest_args or "--exitfirst" in pytest_args):
            break
    ran = [c for c in codes if c != 5]
    if not ran:
        print("shipyard: pytest collected no tests: failing", file=sys.stderr)
        return 1
    return max(ran)
