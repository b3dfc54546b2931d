"""`invoke test`: install what the tests need (Debian packages), then run pytest.

The tests start their own services (a real 2-node Slurm sandbox, dockerd, an OCI registry) through fixtures and
stop them again; this module only makes sure the programs exist. pytest's exit 5 ("no tests ran") counts as a
failure, so a suite that silently collects nothing cannot pass CI.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.sandbox import runtimes

CHECKOUT = Path(__file__).resolve().parents[2]
# Where each run's plugin (tests/run_counts.py) writes how many tests it selected and ran.
COUNTS_ENV = "SHIPYARD_TEST_COUNTS"


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


SERVICES = "slurm or docker"  # the marks of tests that use a Slurm sandbox or dockerd
# The tests that use the machine-wide real enroot + pyxis install (tests/needs.py): one process for them.
REAL_RUNTIMES = "real_runtimes"
# xdist workers for the tests without services: one more than this 2-core machine's cores, because many of those
# tests wait (subprocesses, deadlines, sockets): the quick loop took 87 s on 2 workers, 68 s on 3, 78 s on 4.
REST_WORKERS = 3

def choose_workers(pytest_args: list[str]) -> bool:
    """True when the arguments already say how to run (``-n``, ``--numprocesses``, ``--dist``, ``-p no:xdist``)."""
    return any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in pytest_args)


def _mark_options(pytest_args: list[str]) -> list[tuple[int, int, str]]:
    """Each ``-m`` option: (its index, how many arguments it takes: 2 for ``-m EXPR``, 1 for ``-mEXPR``/``-m=EXPR``,
    its expression)."""
    out, i = [], 0
    while i < len(pytest_args):
        a = pytest_args[i]
        if a == "-m" and i + 1 < len(pytest_args):
            out.append((i, 2, pytest_args[i + 1]))
            i += 2
            continue
        if a.startswith("-m") and len(a) > 2:
            out.append((i, 1, a[2:].removeprefix("=")))
        i += 1
    return out


def with_marks(pytest_args: list[str], phase: str) -> list[str]:
    """``pytest_args`` with its ``-m`` expression narrowed to ``phase`` (``-m EXPR`` -> ``-m '(EXPR) and PHASE'``);
    without one, ``-m PHASE`` is added."""
    options = _mark_options(pytest_args)
    if not options:
        return ["-m", phase, *pytest_args]
    out, i = [], 0
    for at, width, expr in options:
        out += [*pytest_args[i:at], "-m", f"({expr}) and ({phase})"]
        i = at + width
    return out + pytest_args[i:]


def _truth(node: ast.AST, marks: dict[str, bool]) -> bool:
    """A marker expression (pytest's -m grammar: names, and, or, not, parentheses) under ``marks``."""
    if isinstance(node, ast.Expression):
        return _truth(node.body, marks)
    if isinstance(node, ast.BoolOp):
        values = [_truth(v, marks) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _truth(node.operand, marks)
    if isinstance(node, ast.Name):
        return marks.get(node.id, False)
    raise ValueError(f"not a plain marker expression: {ast.dump(node)}")


def selects_no_service(pytest_args: list[str]) -> bool:
    """True when the ``-m`` expression cannot select a test marked slurm or docker, whatever other marks it has
    (the quick loop's ``not slurm and not docker and ...``): then `invoke test` starts the last run only, without
    collecting the suite once more to find out. Anything it cannot read (mark arguments, odd syntax) is False: the
    collection decides."""
    options = _mark_options(pytest_args)
    if not options:
        return False
    try:
        tree = ast.parse(options[-1][2], mode="eval")  # pytest's -m: the last one given is the one it applies
        names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {"slurm", "docker"})
        if len(names) > 12:
            return False
        for combo in itertools.product((False, True), repeat=len(names)):
            marks = dict(zip(names, combo))
            if (marks["slurm"] or marks["docker"]) and _truth(tree, marks):
                return False
    except (SyntaxError, ValueError):
        return False
    return True


def phases(pytest_args: list[str]) -> list[list[str]]:
    """The pytest runs of `invoke test`, side by side: ``[real runtimes, docker, slurm, rest]``, or one run when the
    arguments choose the workers.

    A service is a session fixture, so the tests that use one run serially in a process of their own, and the
    service tests are split in three such processes because their time is spent differently: docker builds compute,
    the real image mostly moves bytes, Slurm tests mostly wait on jobs and Slurm's delays. Each process starts its
    own services (a sandbox lives in its own network namespaces and folder, a dockerd on its own socket and data
    root, so they coexist). What cannot be split: ``real_pyxis`` installs enroot machine-wide for one sandbox, so
    every test that uses it (``real_runtimes``, whatever else it needs) runs in one process, first in the list and
    shown as it goes (the longest). The tests that need no service run on three pytest-xdist workers, whole files per
    worker (module fixtures and per-file bookkeeping hold as in a serial run). (xdist's ``--dist loadgroup`` could
    do this in one run, but it cannot rename pytest 9's node ids, so it groups nothing.)"""
    if choose_workers(pytest_args):
        return [list(pytest_args)]
    # Short tracebacks (one line per frame, then the E lines): CI keeps the start of the output, where the first
    # run's failures are printed, and pytest's long form spends it on the failing test's whole source. A --tb in
    # the arguments comes later and wins.
    short = "--tb=short"
    serial = [short, "-p", "no:xdist"]
    return [[*serial, *with_marks(pytest_args, REAL_RUNTIMES)],
            [*serial, *with_marks(pytest_args, f"docker and not {REAL_RUNTIMES}")],
            [*serial, *with_marks(pytest_args, f"slurm and not (docker or {REAL_RUNTIMES})")],
            [short, "-n", str(REST_WORKERS), "--dist", "loadfile", *with_marks(pytest_args, f"not ({SERVICES})")]]


_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped)")


def counts(output: str) -> dict[str, int]:
    """passed/failed/skipped from pytest's closing line (errors count as failed); {} when it printed none."""
    lines = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped)|no tests ran", ln)]
    found: dict[str, int] = {}
    for n, word in _COUNT.findall(lines[-1] if lines else ""):
        key = "failed" if word.startswith("error") else word
        found[key] = found.get(key, 0) + int(n)
    return found


_SECTION = re.compile(r"^=+ (FAILURES|ERRORS) =+$")
_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
_WHERE = re.compile(r"^(\S+\.py:\d+): (in \S+|\w+)$")  # long form: "f.py:8: AssertionError"; short: "f.py:8: in test"
_RAISED = re.compile(r"^E\s+(?:(\w+(?:Error|Exception|Exit|Interrupt))\b|(assert)\b)")


_TELLING = re.compile(r"\w(Error|Exception)\b:|(?i:\berror\b|\bfatal\b|\bkilled\b|timed out|\brefused\b|"
                      r"\bdenied\b|\bsignal\b|exit(ed with)? code [1-9])")


def _pick(errors: list[str], head: int, tail: int) -> list[str]:
    """The first ``head`` E lines (the exception and its message's start), then of the rest the first ``tail`` that
    name an error, a signal or a non-zero exit (in a job log quoted in the message, the first error is the cause and
    the rest its consequences: "RuntimeError: Broken pipe" before "srun: error: node2: task 1: Exited with exit code
    1"), or the last ``tail`` lines when none does (pytest's own explanation ends the message); a cut is marked."""
    if len(errors) <= head + tail:
        return errors
    rest = errors[head:]
    telling = [i for i, ln in enumerate(rest) if _TELLING.search(ln)]
    keep = telling[:tail] if telling else list(range(len(rest)))[-tail:]
    out, last = list(errors[:head]), -1
    for i in keep:
        if i != last + 1:
            out.append("E   [...]")
        out.append(rest[i])
        last = i
    if last != len(rest) - 1:
        out.append("E   [...]")
    return out


def digest(output: str, head: int = 3, tail: int = 8, width: int = 240) -> list[str]:
    """Each failure of a pytest report in a few lines: its name, where it was raised (the last ``file.py:N: Error``
    line of its section, or with ``--tb=short`` its last ``file.py:N: in f`` and the error named by its first E
    line) and a few of its ``E`` lines (:func:`_pick`), each cut to ``width``.

    CI keeps only the start and the end of a long output: the closing lines must say what failed and why, since the
    full sections, printed run by run, may sit in the part that is cut."""
    out: list[str] = []
    name, where, kind, errors, inside = None, "", "", [], False

    def close():
        if name is not None:
            shown = _pick(errors, head, tail)
            title = name if name.startswith("ERROR ") else f"FAILED {name}"
            raised = kind or ((m.group(1) or "AssertionError") if errors and (m := _RAISED.match(errors[0])) else "")
            at = f"{where}: {raised}" if where and raised else where
            out.extend([title + (f" at {at}" if at else ""),
                        *(f"  {ln[:width]}" for ln in shown)])

    for line in output.splitlines():
        if _SECTION.match(line):
            close()
            name, inside = None, True
            continue
        if inside and line.startswith("=") and line.endswith("="):
            close()
            name, inside = None, False
            continue
        if not inside:
            continue
        if m := _HEADER.match(line):
            close()
            name, where, kind, errors = m.group(1), "", "", []
        elif line.startswith("E "):
            errors.append(line.rstrip())
        elif w := _WHERE.match(line):  # the last one is where it was raised
            where, kind = w.group(1), ("" if w.group(2).startswith("in ") else w.group(2))
    close()
    return out


def _relay(proc: subprocess.Popen, keep: list[str]) -> int:
    """Copy ``proc``'s output to ours as it comes (pytest's progress dots included), keeping it for :func:`counts`."""
    while chunk := proc.stdout.read1(4096):
        text = chunk.decode(errors="replace")
        keep.append(text)
        sys.stdout.write(text)
        sys.stdout.flush()
    return proc.wait()


def bytecode_env(environ) -> dict[str, str]:
    """The test runs' environment: ``environ`` without PYTHONDONTWRITEBYTECODE. pytest rewrites every test module's
    asserts when it imports it and keeps the result as bytecode beside it (``__pycache__``, git-ignored); with
    writing turned off every pytest process (and every nested one) redoes it: the collection took 7.4 s instead of
    3.4 s here. Nothing else of the environment changes."""
    return {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_tests(pytest_args: list[str], install: bool = True) -> int:
    """Run the tests; pytest's exit 5 (no tests) fails only when no run had a test.

    The runs of :func:`phases` go side by side: the first (the longest) is shown as it goes; the others' reports
    follow when all are done, then one closing line with the totals."""
    if install:
        ensure_packages()
    note = runtimes.tests_left_out_line(CHECKOUT)
    if note and os.environ.get("CI", "").lower() not in ("true", "1"):
        print(f"shipyard: {note}", flush=True)  # in CI those tests fail instead (tests/fixtures_runtimes.py)
    runs = phases(pytest_args)
    pytest = [sys.executable, "-m", "pytest", "-p", "shipyard.dev.run_counts"]
    env = bytecode_env(os.environ)
    if len(runs) > 1 and selects_no_service(pytest_args):
        runs = runs[-1:]
    if len(runs) > 1:
        # One collection of the service tests first: when the selection holds none (the quick loop), only the last
        # run is started (each service run would collect the whole suite for nothing); and it writes the rewritten
        # test modules that every later process reads (about 4 s of CPU each, seven processes with the workers).
        probe = subprocess.run([*pytest, "--collect-only", "-q", "-p", "no:xdist", *with_marks(pytest_args, SERVICES)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if probe.returncode == 5:  # pytest: no tests collected
            runs = runs[-1:]
    counts_dir = Path(tempfile.mkdtemp(prefix="shipyard-test-counts-"))
    envs = [{**env, COUNTS_ENV: str(counts_dir / f"run-{i}.json")} for i in range(len(runs))]
    try:
        if len(runs) == 1:
            codes = [subprocess.run([*pytest, *runs[0]], env=envs[0]).returncode]
        else:
            codes = _side_by_side(pytest, runs, envs)
        return verdict(codes, [_read_counts(Path(e[COUNTS_ENV])) for e in envs])
    finally:
        shutil.rmtree(counts_dir, ignore_errors=True)


def _read_counts(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def verdict(codes: list[int], counts_of_runs: list[dict | None]) -> int:
    """`invoke test`'s exit status from its runs' exit statuses and counts: 0 only when every run that had tests
    exited 0 and ran every test it selected. A run killed by a signal has a negative status (and wrote no counts);
    pytest's 5 ("no tests collected") is no failure unless no run had a test."""
    bad = 0
    for i, (code, seen) in enumerate(zip(codes, counts_of_runs)):
        if code == 5:
            continue
        if code < 0:
            print(f"shipyard: test run {i + 1} was killed by signal {-code}: failing", file=sys.stderr)
            bad = bad or 1
        elif code:
            bad = bad or code
        elif seen is None:
            print(f"shipyard: test run {i + 1} ended without its counts: failing", file=sys.stderr)
            bad = bad or 1
        elif seen.get("ran", 0) < seen.get("selected", 0):
            print(f"shipyard: test run {i + 1} ran {seen['ran']} of the {seen['selected']} tests it selected: "
                  "failing", file=sys.stderr)
            bad = bad or 1
    if all(c == 5 for c in codes):
        print("shipyard: pytest collected no tests: failing", file=sys.stderr)
        return 1
    return bad


def _side_by_side(pytest: list[str], runs: list[list[str]], envs: list[dict]) -> list[int]:
    """The first run shown as it goes, the others' reports after it, then the digest of failures and the totals."""
    shown: list[str] = []
    reports: list[str] = []
    with contextlib.ExitStack() as stack:
        outs = [stack.enter_context(tempfile.TemporaryFile()) for _ in runs[1:]]
        others = [subprocess.Popen([*pytest, *args], stdout=out, stderr=subprocess.STDOUT, env=e)
                  for args, out, e in zip(runs[1:], outs, envs[1:])]
        try:
            first = subprocess.Popen([*pytest, *runs[0]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=envs[0])
            codes = [_relay(first, shown)]
        finally:
            codes += [p.wait() for p in others]
        for out in outs:
            out.seek(0)
            reports.append(out.read().decode(errors="replace"))
    for args, report in zip(runs[1:], reports):
        title = f" tests marked {args[args.index('-m') + 1]} (run beside the above) "
        print("\n" + "=" * 20 + title + "=" * 20)
        sys.stdout.write(report)
    totals: dict[str, int] = {}
    for part in ("".join(shown), *reports):
        for key, n in counts(part).items():
            totals[key] = totals.get(key, 0) + n
    briefs = [ln for part in ("".join(shown), *reports) for ln in digest(part)]
    if briefs:
        print("\n" + "=" * 20 + " what failed, in short (the full reports are above) " + "=" * 20)
        print("\n".join(briefs))
    line = f"{totals.get('passed', 0)} passed, {totals.get('failed', 0)} failed"
    print(f"tests: {line}" + (f", {totals['skipped']} skipped" if totals.get("skipped") else ""))
    return codes
