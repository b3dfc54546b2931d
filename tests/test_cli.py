"""shipyard.cli's task wrapper: what every task gets before it runs."""

from __future__ import annotations

import sys

import pytest

from shipyard.cli import task_guard


@pytest.mark.parametrize("interpreter_flag", [0, 1])
def test_a_task_writes_bytecode_as_the_interpreter_says_not_as_invoke_left_it(interpreter_flag, monkeypatch):
    seen = []

    @task_guard
    def body(c):
        seen.append(sys.dont_write_bytecode)

    monkeypatch.setattr(sys, "flags", type("Flags", (), {"dont_write_bytecode": interpreter_flag})())
    monkeypatch.setattr(sys, "dont_write_bytecode", not interpreter_flag)  # what invoke's Program sets, or the opposite
    body(None)
    assert seen == [bool(interpreter_flag)]
