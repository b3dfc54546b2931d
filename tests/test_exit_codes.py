"""Exit codes mean one thing (README, "Exit codes"): 0 success, 1 a check or job that failed, 2 bad input or an
unusable environment, for every task, with one line on stderr and never a traceback."""

from __future__ import annotations

import os

import pytest
from fixtures_invoke import invoke_cli

import tasks

# the required positionals, given, so that what is tested is the bad registry, not invoke's own parser
ARGS = {"logs": ["1"], "usage": ["1"], "nccl-report": ["nccl.log"]}
# `invoke test` runs pytest on this checkout and does not read a project's registry
TASKS = [t for t in sorted(tasks.ns.task_names) if t != "test"]


def test_every_task_is_listed():
    assert set(TASKS) | {"test"} == set(tasks.ns.task_names) and len(TASKS) >= 20


def test_bad_input_is_exit_2_with_one_line_for_every_task(tmp_path):
    """A registry that does not exist is bad input for every task that reads one: exit 2, one stderr line."""
    env = dict(os.environ, SHIPYARD_REGISTRY=str(tmp_path / "missing" / "registry.yaml"))
    procs = invoke_cli.run_all([[t, *ARGS.get(t, [])] for t in TASKS], cwd=tmp_path, env=env, timeout=120)
    for name, proc in zip(TASKS, procs):
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr[-500:])
        assert proc.stderr.startswith("shipyard: error: ") and len(proc.stderr.strip().splitlines()) == 1, name
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, code", [
    (["show", "pytorch-2.3"], 0),
    (["render", "--all", "--check"], 1),
])
def test_success_is_0_and_a_failed_check_is_1(args, code, tmp_path):
    """`render --check` on a project whose definitions/ is missing is a failed check (1), not bad input."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "registry.yaml").write_text(open(os.path.join(root, "registry.yaml")).read())
    env = dict(os.environ, SHIPYARD_REGISTRY=str(tmp_path / "registry.yaml"))
    proc = invoke_cli(*args, cwd=tmp_path, env=env)
    assert proc.returncode == code, proc.stderr
