"""Messages name the command the user runs: `shipyard TASK` under the installed `shipyard` command (and
`python -m shipyard`), `invoke TASK` in the checkout. One rule where messages are printed (shipyard/cli.py as_run:
the task guard's error line and the commands' say()), not in each message."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from fixtures_invoke import task_program
from invoke import Collection

import tasks
from shipyard import cli
from shipyard import tasks as shipyard_tasks
from shipyard.commands.context import Context
from shipyard.tasks import main

ROOT = Path(__file__).resolve().parents[1]


def _run(argv, capsys, *, installed, monkeypatch):
    with pytest.raises(SystemExit) as ei:
        if installed:  # on a copy of the tasks, as task_program() says why
            monkeypatch.setattr(shipyard_tasks, "ns", Collection.from_module(shipyard_tasks))
            main(argv)
        else:
            task_program().run(["invoke", *argv[1:]])
    return ei.value.code, capsys.readouterr()


@pytest.mark.parametrize("installed,name", [(True, "shipyard"), (False, "invoke")])
def test_an_error_line_names_the_program_the_user_ran(installed, name, tmp_path, capsys, monkeypatch):
    code, got = _run(["shipyard", "sandbox.exec", "--directory", str(tmp_path / "none")], capsys,
                     installed=installed, monkeypatch=monkeypatch)
    assert code == 2 and got.err == (f"shipyard: error: the Slurm sandbox in {tmp_path / 'none'} is not running "
                                     f"(start it with: {name} sandbox.up)\n")


def test_main_leaves_the_checkout_name_behind(tmp_path, capsys, monkeypatch):
    _run(["shipyard", "sandbox.exec", "--directory", str(tmp_path)], capsys, installed=True, monkeypatch=monkeypatch)
    assert cli.program() == "invoke" and cli.as_run("run invoke check") == "run invoke check"


@pytest.fixture
def as_shipyard():
    cli.set_program("shipyard", tasks.ns.task_names)
    yield
    cli.set_program("invoke", ())


def test_say_names_the_program(as_shipyard):
    ctx = Context(registry=None, out=io.StringIO())
    ctx.say("stale definitions (run `invoke render --all`); then invoke sandbox.up, invoke course.handout")
    ctx.write("see invoke logs 12\n")
    assert ctx.out.getvalue() == ("stale definitions (run `shipyard render --all`); then shipyard sandbox.up, "
                                  "shipyard course.handout\nsee shipyard logs 12\n")


@pytest.mark.parametrize("text", [
    "invoke's parser", "invoke checks nothing", "python -m invoke-like", "/usr/bin/invoke check", "invoke TASK",
    "invoke sandbox", "invoke lockfile"])
def test_only_a_known_task_after_invoke_is_renamed(as_shipyard, text):
    assert cli.as_run(text) == text


def test_without_the_shipyard_command_nothing_changes():
    assert cli.program() == "invoke"
    assert cli.as_run("run `invoke lock ENV` first") == "run `invoke lock ENV` first"


@pytest.mark.parametrize("installed,name", [(True, "shipyard"), (False, "invoke")])
def test_the_check_table_names_the_program(installed, name, tmp_path, monkeypatch, capsys):
    """`check` in a folder without locks: the table's advice to lock names the command the user runs."""
    (tmp_path / "registry.yaml").write_text((ROOT / "registry.yaml").read_text())
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(tmp_path / "registry.yaml"))
    code, got = _run(["shipyard", "check", "pytorch-2.3"], capsys, installed=installed, monkeypatch=monkeypatch)
    assert code == 1 and f"run `{name} lock pytorch-2.3`" in got.out, got.out
    other = {"shipyard": "invoke", "invoke": "shipyard"}[name]
    assert f"`{other} lock" not in got.out
