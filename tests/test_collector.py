"""The collector while a command starts (shipyard/collector.py): held from the program's first line, frozen and back on
once the task's command module is loaded, and left alone in any process that is not the program."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures_projects import shipped_project
from shipyard import collector

ROOT = Path(__file__).resolve().parent.parent

# Runs a program file as that program (sys.argv[0] its path) and reports, at exit, each automatic collection that
# started (whether shipyard's task table had begun to load by then, and whether the task's command module had), whether
# the collector was on at exit and how many objects were frozen.
PROBE = """\
import atexit, gc, json, runpy, sys
started = []
gc.callbacks.append(lambda phase, info: phase == "start" and started.append(
    ["shipyard.tasks" in sys.modules, any(m.startswith("shipyard.commands.") for m in sys.modules)]))
atexit.register(lambda: print("PROBE " + json.dumps({"started": started, "enabled": gc.isenabled(),
                                                     "frozen": gc.get_freeze_count()}), file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture
def collector_state():
    """The test process's collector as it was, whatever the test held or froze."""
    was_on, was_held = gc.isenabled(), collector._held
    yield
    gc.unfreeze()
    collector._held = was_held
    (gc.enable if was_on else gc.disable)()


def probe(program: Path, args: list[str], cwd: Path, timeout: int = 120) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
    res = subprocess.run([sys.executable, "-c", PROBE, str(program), *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    line = [x for x in res.stderr.splitlines() if x.startswith("PROBE ")]
    assert line, res.stderr[-2000:]
    return res, json.loads(line[-1][len("PROBE "):])


@pytest.fixture
def project(tmp_path):
    return shipped_project(tmp_path / "proj")


def test_settle_after_hold_freezes_and_turns_the_collector_back_on(collector_state):
    gc.enable()
    collector.hold()
    assert not gc.isenabled()
    frozen = gc.get_freeze_count()
    collector.settle()
    assert gc.isenabled() and gc.get_freeze_count() > frozen
    frozen = gc.get_freeze_count()
    junk = [[] for _ in range(1000)]  # new objects: a second freeze would take them (a frozen one may die meanwhile)
    collector.settle()
    assert gc.get_freeze_count() <= frozen, len(junk)


def test_settle_without_hold_changes_nothing(collector_state):
    gc.enable()
    frozen = gc.get_freeze_count()
    collector.settle()
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_a_collector_someone_else_turned_off_stays_off(collector_state):
    gc.disable()
    frozen = gc.get_freeze_count()
    collector.hold()
    collector.settle()
    assert not gc.isenabled() and gc.get_freeze_count() == frozen


@pytest.mark.parametrize("argv0, held", [
    ("/opt/venv/bin/invoke", True),
    ("/opt/venv/bin/inv", True),  # invoke's short name
    ("/opt/venv/lib/python3.11/site-packages/invoke/__main__.py", True),  # python -m invoke
    ("/opt/venv/bin/pytest", False),
    ("/opt/venv/lib/python3.11/site-packages/pytest/__main__.py", False),
    ("/opt/venv/lib/python3.11/site-packages/shipyard/__main__.py", False),
    ("/home/me/invoke-helper", False),
    ("-c", False),
    ("", False),
])
def test_hold_in_holds_only_in_that_program(collector_state, monkeypatch, argv0, held):
    gc.enable()
    monkeypatch.setattr(sys, "argv", [argv0, "--list"])
    collector.hold_in("invoke", "inv")
    assert gc.isenabled() is not held
    collector.settle()
    assert gc.isenabled()


@pytest.mark.slow
def test_the_shipyard_program_starts_without_collections_and_runs_its_command_collected(project):
    """`python -m shipyard launch --dry-run` (the `shipyard` command's entry): no automatic collection while invoke,
    the tasks and the command module load, and the collector is on for the command, with the start frozen."""
    res, seen = probe(ROOT / "shipyard" / "__main__.py",
                      ["launch", "--dry-run", "--force", "--", "examples/train.py"], project)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("#!/bin/bash")
    assert seen["enabled"] and seen["frozen"] > 10_000, seen
    assert started_while_loading(seen) == 0, seen


def started_while_loading(seen: dict) -> int:
    """Automatic collections after shipyard's task table began to load and before the command module was loaded
    (without the hold: dozens)."""
    return sum(1 for tasks, command in seen["started"] if tasks and not command)


@pytest.mark.slow
def test_the_invoke_program_in_the_checkout_holds_it_and_a_test_importing_tasks_does_not(project):
    invoke_script = Path(sys.executable).parent / "invoke"
    res, seen = probe(invoke_script, ["-r", str(ROOT), "launch", "--dry-run", "--force", "--", "examples/train.py"],
                      project)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("#!/bin/bash")
    assert seen["enabled"] and seen["frozen"] > 10_000, seen
    assert started_while_loading(seen) == 0, seen
    imported = subprocess.run([sys.executable, "-c", f"import gc, sys; sys.path.insert(0, {str(ROOT)!r}); "
                               "import tasks; print(gc.isenabled(), gc.get_freeze_count())"],
                              capture_output=True, text=True, timeout=120, cwd=project)
    assert imported.stdout.split() == ["True", "0"], imported.stderr


@pytest.mark.slow
def test_a_command_that_never_runs_a_task_keeps_its_exit_collection(project):
    """`--list` loads no command module: nothing is frozen, so the exit's full collection still walks everything (the
    policy does not make a listing cheaper than invoke's own)."""
    res, seen = probe(ROOT / "shipyard" / "__main__.py", ["--list"], project)
    assert res.returncode == 0, res.stderr[-2000:]
    assert seen["frozen"] == 0 and not seen["enabled"], seen
