"""`invoke test`: install what the tests need (Debian packages), run pytest in processes side by side, and judge the
runs from pytest's own machine-readable results (JUnit XML), not from the text it prints for people.

The tests start their own services (a real 2-node Slurm sandbox, dockerd, an OCI registry) through fixtures and
stop them again; this module only makes sure the programs exist. It lives beside the tests, not in the shipyard
package: an installed shipyard has no suite to run. The task itself is in the checkout's tasks.py.

A run fails when its process exits non-zero or is killed by a signal, when it wrote no JUnit XML, or when the XML
holds fewer tests than the run selected (tests/suite_counts.py says how many). pytest's exit 5 ("no tests
collected") fails only when no run had a test, so a suite that silently collects nothing cannot pass CI.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.sandbox import runtimes
from handoff import HANDOFF_ENV
from suite_counts import SELECTED_ENV

TESTS = Path(__file__).resolve().parent
CHECKOUT = TESTS.parent
# pytest as `python -m pytest` runs it, with tests/ last on sys.path so that `-p suite_counts` finds the plugin; the
# path is set in this process only (PYTHONPATH would reach every program the tests start, containers included)
PYTEST = [sys.executable, "-c", f"import sys; sys.path.append({str(TESTS)!r}); import pytest; "
          "sys.exit(int(pytest.main()))", "-p", "suite_counts"]


def debian_packages() -> list[str]:
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
    packages = packages if packages is not None else debian_packages()
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
    without one, ``-m PHASE`` is added. pytest itself evaluates the expression."""
    options = _mark_options(pytest_args)
    if not options:
        return ["-m", phase, *pytest_args]
    out, i = [], 0
    for at, width, expr in options:
        out += [*pytest_args[i:at], "-m", f"({expr}) and ({phase})"]
        i = at + width
    return out + pytest_args[i:]


# An -m expression over more marks than this is not enumerated (2**n truth tables); the collection decides instead.
MAX_ENUMERATED_MARKS = 12


def _truth(node: ast.expr, marks: dict[str, bool]) -> bool:
    if isinstance(node, ast.BoolOp):
        values = (_truth(v, marks) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        return not _truth(node.operand, marks)
    return marks[node.id]


# What a plain -m expression parses to: ``and``, ``or``, ``not``, parentheses (no node of their own) and mark names.
# pytest also reads ``mark(key=value)`` and names Python would not parse; those are left to pytest's collection.
_PLAIN = (ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Name, ast.Load)


def may_select(pytest_args: list[str], phase: str) -> bool:
    """False when no test, whatever its marks, can match both the arguments' ``-m`` expression and ``phase``: the
    quick loop's ``not slurm and not docker`` can never select a ``slurm or docker`` test, so no collection is needed
    to know that. True whenever that cannot be decided from the expression alone (a ``-k`` or a path still narrows
    what pytest selects; this only rules out)."""
    options = _mark_options(pytest_args)
    if not options:
        return True
    expression = f"({options[-1][2]}) and ({phase})"  # pytest reads the last -m; with_marks narrows it so
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return True
    if not all(isinstance(n, _PLAIN) for n in ast.walk(tree)):
        return True
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if len(names) > MAX_ENUMERATED_MARKS:
        return True
    order = sorted(names)
    return any(_truth(tree, dict(zip(order, values))) for values in itertools.product((False, True), repeat=len(order)))


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


# ------------------------------------------------------------------------------------------------ a run's results


@dataclass
class Problem:
    """A failed or errored test case of a JUnit XML report: its node id, failure or error, and pytest's report."""
    nodeid: str
    kind: str  # "failure" or "error"
    message: str
    text: str


@dataclass
class Results:
    """One run's JUnit XML, read: how many test cases passed, failed (failures and errors) and were skipped, and the
    failures themselves. A case counts once, however many reports (call, teardown) it has."""
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ran(self) -> int:
        return self.passed + self.failed + self.skipped


def _nodeid(case: ET.Element) -> str:
    """``file.py::Class::test`` from a test case's ``file``, ``classname`` and ``name`` (pytest's junit_family
    xunit1, which the runs ask for, writes the file); ``classname.name`` when there is no file."""
    name, classname, file = case.get("name", ""), case.get("classname", ""), case.get("file")
    if not file:
        return f"{classname}.{name}" if classname else name
    module = file.removesuffix(".py").replace("/", ".")
    classes = classname[len(module) + 1:].split(".") if classname.startswith(module + ".") else []
    return "::".join([file, *classes, name])


def read_results(path: Path) -> Results | None:
    """The results in a JUnit XML file pytest wrote; None when there is none or it cannot be read (a process killed
    before its session ended writes nothing)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    out = Results()
    for case in root.iter("testcase"):
        bad = [child for child in case if child.tag in ("failure", "error")]
        if bad:
            out.failed += 1
            out.problems += [Problem(_nodeid(case), child.tag, child.get("message", ""), child.text or "")
                             for child in bad]
        elif case.find("skipped") is not None:
            out.skipped += 1
        else:
            out.passed += 1
    return out


def read_selected(path: Path) -> int | None:
    """How many tests the run selected (tests/suite_counts.py), None when it did not say."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data.get("selected") if isinstance(data, dict) and isinstance(data.get("selected"), int) else None


# ------------------------------------------------------------------------------------------------ the digest

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


def brief(problem: Problem, head: int = 3, tail: int = 8, width: int = 240) -> list[str]:
    """One failure in a few lines: its node id, where it was raised (the last ``file.py:N: Error`` line of pytest's
    report, or with ``--tb=short`` its last ``file.py:N: in f`` and the error named by its first E line) and a few
    of its ``E`` lines (:func:`_pick`), each cut to ``width``."""
    where, kind, errors = "", "", []
    for line in problem.text.splitlines():
        if line.startswith("E "):
            errors.append(line.rstrip())
        elif w := _WHERE.match(line):  # the last one is where it was raised
            where, kind = w.group(1), ("" if w.group(2).startswith("in ") else w.group(2))
    if not errors and problem.message:  # a collection error or a crashed worker: pytest's message is all there is
        errors = [f"E   {ln}" for ln in problem.message.splitlines()]
    raised = kind or ((m.group(1) or "AssertionError") if errors and (m := _RAISED.match(errors[0])) else "")
    at = f"{where}: {raised}" if where and raised else where
    title = ("ERROR " if problem.kind == "error" else "FAILED ") + problem.nodeid
    return [title + (f" at {at}" if at else ""), *(f"  {ln[:width]}" for ln in _pick(errors, head, tail))]


def digest(results: list[Results | None]) -> list[str]:
    """Every failure of every run in a few lines each. CI keeps only the start and the end of a long output: the
    closing lines must say what failed and why, since the full reports, printed run by run, may sit in the part
    that is cut."""
    return [ln for r in results if r for p in r.problems for ln in brief(p)]


def totals_line(results: list[Results | None]) -> str:
    passed, failed, skipped = (sum(getattr(r, k) for r in results if r) for k in ("passed", "failed", "skipped"))
    return f"tests: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")


# ------------------------------------------------------------------------------------------------ running


def _relay(proc: subprocess.Popen) -> int:
    """Copy ``proc``'s output to ours as it comes (pytest's progress dots included)."""
    while chunk := proc.stdout.read1(4096):
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
    return proc.wait()


def bytecode_env(environ) -> dict[str, str]:
    """The test runs' environment: ``environ`` without PYTHONDONTWRITEBYTECODE. pytest rewrites every test module's
    asserts when it imports it and keeps the result as bytecode beside it (``__pycache__``, git-ignored); with
    writing turned off every pytest process (and every nested one) redoes it: the collection took 7.4 s instead of
    3.4 s here. Nothing else of the environment changes."""
    return {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_tests(pytest_args: list[str], install: bool = True) -> int:
    """Run the tests: the runs of :func:`phases` side by side, the first (the longest) shown as it goes, the
    others' reports when all are done, then the digest of failures and one closing line with the totals."""
    if install:
        ensure_packages()
    note = runtimes.tests_left_out_line(CHECKOUT)
    if note and os.environ.get("CI", "").lower() not in ("true", "1"):
        print(f"shipyard: {note}", flush=True)  # in CI those tests fail instead (tests/fixtures_runtimes.py)
    runs = phases(pytest_args)
    env = bytecode_env(os.environ)
    with tempfile.TemporaryDirectory(prefix="shipyard-test-results-") as tmp:
        # ours last: a --junitxml among the caller's arguments is overridden, not the source of the verdict
        argvs = [[*PYTEST, *args, f"--junitxml={tmp}/run-{i}.xml", "-o", "junit_family=xunit1"]
                 for i, args in enumerate(runs)]
        # one folder where a run leaves what another run of this `invoke test` takes (tests/handoff.py)
        Path(tmp, "handoff").mkdir()
        envs = [{**env, SELECTED_ENV: f"{tmp}/run-{i}.selected", HANDOFF_ENV: f"{tmp}/handoff"}
                for i in range(len(runs))]
        probe = ([*PYTEST, "--collect-only", "-q", "-p", "no:xdist", *with_marks(pytest_args, SERVICES)]
                 if may_select(pytest_args, SERVICES) else None)
        started, codes = _side_by_side(argvs, runs, envs, Path(tmp), probe, env)
        results = [read_results(Path(tmp, f"run-{i}.xml")) for i in started]
        selected = [read_selected(Path(tmp, f"run-{i}.selected")) for i in started]
    if len(started) > 1:
        briefs = digest(results)
        if briefs:
            print("\n" + "=" * 20 + " what failed, in short (the full reports are above) " + "=" * 20)
            print("\n".join(briefs))
    print(totals_line(results), flush=True)
    return verdict(codes, results, selected)


def verdict(codes: list[int], results: list[Results | None], selected: list[int | None]) -> int:
    """`invoke test`'s exit status from its runs' exit statuses and results: 0 only when every run that had tests
    exited 0, wrote its results and ran every test it selected. A run killed by a signal has a negative status (and
    wrote no results); pytest's 5 ("no tests collected") is no failure unless no run had a test."""
    bad = 0
    for i, (code, seen, chosen) in enumerate(zip(codes, results, selected)):
        if code == 5:
            continue
        if code < 0:
            print(f"shipyard: test run {i + 1} was killed by signal {-code}: failing", file=sys.stderr)
            bad = bad or 1
        elif code:
            bad = bad or code
        elif seen is None or chosen is None:
            print(f"shipyard: test run {i + 1} ended without its results: failing", file=sys.stderr)
            bad = bad or 1
        elif seen.ran < chosen:
            print(f"shipyard: test run {i + 1} ran {seen.ran} of the {chosen} tests it selected: failing",
                  file=sys.stderr)
            bad = bad or 1
    if all(c == 5 for c in codes):
        print("shipyard: pytest collected no tests: failing", file=sys.stderr)
        return 1
    return bad


def _follow(proc: subprocess.Popen, path: Path) -> int:
    """Copy what ``proc`` writes to ``path`` to our output as it comes, until it ends. The file is read through a
    descriptor of its own: the child's shares no offset with it."""
    with open(path, "rb") as fh:
        while True:
            ended = proc.poll() is not None
            if chunk := fh.read():
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            if ended:
                return proc.returncode
            time.sleep(0.2)


def _side_by_side(argvs: list[list[str]], runs: list[list[str]], envs: list[dict], tmp: Path,
                  probe: list[str] | None, env: dict) -> tuple[list[int], list[int]]:
    """Start the runs; (the indexes of those started, their exit statuses).

    The run without services starts at once, and beside it one collection of the service tests (``probe``): when
    the selection holds none, that run is the only one, shown as it goes, and the collection cost no time of its own.
    When the ``-m`` expression alone rules out every service test (``probe`` is None: the quick loop), there is no
    collection at all; else the service runs start too, the first shown as it goes, the others' reports after it."""
    if len(argvs) == 1:
        return [0], [subprocess.run(argvs[0], env=envs[0]).returncode]
    last = len(argvs) - 1
    outs = [tmp / f"run-{i}.out" for i in range(len(argvs))]
    with open(outs[last], "wb") as fh:
        rest = subprocess.Popen(argvs[last], stdout=fh, stderr=subprocess.STDOUT, env=envs[last])
    try:
        collected = 5 if probe is None else subprocess.run(probe, env=env, stdout=subprocess.DEVNULL,
                                                             stderr=subprocess.DEVNULL).returncode
        if collected == 5:  # pytest: no tests collected
            return [last], [_follow(rest, outs[last])]
        others = []
        for i in range(1, last):
            with open(outs[i], "wb") as fh:
                others.append(subprocess.Popen(argvs[i], stdout=fh, stderr=subprocess.STDOUT, env=envs[i]))
        try:
            first = subprocess.Popen(argvs[0], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=envs[0])
            codes = [_relay(first)]
        finally:
            codes += [p.wait() for p in others]
    finally:
        rest_code = rest.wait()
    for args, out in zip(runs[1:], outs[1:]):
        title = f" tests marked {args[args.index('-m') + 1]} (run beside the above) "
        print("\n" + "=" * 20 + title + "=" * 20)
        sys.stdout.write(out.read_bytes().decode(errors="replace"))
    return list(range(len(argvs))), [*codes, rest_code]


def main(pytest_args: str = "", k: str | None = None, install: bool = True) -> int:
    """`invoke test [-k EXPR] [--pytest-args '...'] [--no-install]`: the exit status of the whole suite."""
    return run_tests(shlex.split(pytest_args) + (["-k", k] if k else []), install=install)
