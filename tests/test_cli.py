"""shipyard.cli's task wrapper: what every task gets before it runs."""

from __future__ import annotations

import copy
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


def _parsed(argv: list[str]):
    from invoke import Program

    from shipyard import tasks

    # a copy: invoke takes each flag's help out of its task while it builds the parser, once per process
    program = Program(namespace=copy.deepcopy(tasks.ns), name="shipyard", binary="shipyard")
    program.create_config()
    program.parse_core(["shipyard", *argv])
    program.parse_collection()
    program.parse_tasks()
    return program


@pytest.mark.parametrize("argv", [
    ["show", "check"],  # a task's name as show's environment
    ["show", "pytorch-2.3", "check", "--cluster", "sandbox"],  # two tasks
    ["render", "--all", "check"],
    ["launch", "--nodes", "2", "--dry-run", "--", "train.py"],
    ["sandbox.up", "--directory", "check"],  # a task's name as a flag's value
])
def test_the_task_parser_holds_the_named_tasks_and_parses_as_with_every_task(argv, monkeypatch):
    import invoke.program

    from shipyard import cli

    named = _parsed(argv)
    assert set(named.parser.contexts) <= set(argv)
    cli.install_parser_hooks()  # the hooks are in place; parse once more with every task in the parser
    with monkeypatch.context() as m:
        m.setattr(invoke.program.Program, "_make_parser", lambda self: invoke.parser.Parser(
            initial=self.initial_context, contexts=self.collection.to_contexts()))
        every = _parsed(argv)
    assert len(every.parser.contexts) > len(named.parser.contexts)

    def shown(program):
        return [(t.name, {k: a.value for k, a in t.args.items()}) for t in program.tasks], program.core.remainder

    assert shown(named) == shown(every)


def test_help_for_a_task_still_finds_it(capsys):
    program = _parsed(["--help", "show"])
    assert set(program.parser.contexts) == {"show"}
