"""A task made from a Spec: its parameters, help and positionals as given, its command imported only when it runs,
one call with the flags, and a user error as one line."""

from __future__ import annotations

import inspect
import sys

import pytest

from shipyard.taskspec import REQUIRED, Flags, Spec, make

COMMAND = '''
from shipyard.errors import ShipyardError
calls = []
def run(*args, **kwargs):
    if args and args[0] == "bad":
        raise ShipyardError("--name 'bad': not a name")
    calls.append((args, kwargs))
    return 3
'''


@pytest.fixture
def command_module(tmp_path, monkeypatch):
    """A command module that is not imported yet, named for this test alone."""
    name = f"taskspec_command_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(COMMAND)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _spec(module: str) -> Spec:
    return Spec("do-it", "Do it once.", {"name": (REQUIRED, "what to do it to"), "from_": ("here", "where from"),
                                         "times": (1, "how often"), "dry_run": (False, "only show it")},
                f"{module}:run", lambda run, f: run(f.name, source=f.from_, times=int(f.times), show=not f.dry_run),
                positional=("name",))


def test_the_task_has_the_specs_parameters_and_help(command_module):
    t = make(_spec(command_module))
    assert t.name == "do-it" and t.__doc__ == "Do it once." and t.positional == ["name"]
    params = inspect.signature(t.body).parameters
    assert list(params) == ["c", "name", "from_", "times", "dry_run"]
    assert params["name"].default is inspect.Parameter.empty and params["times"].default == 1
    assert t.help == {"name": "what to do it to", "from": "where from", "times": "how often",
                      "dry_run": "only show it"}
    assert command_module not in sys.modules  # made, not run: the command is not loaded


def test_running_it_is_one_call_of_the_command(command_module):
    t = make(_spec(command_module))
    with pytest.raises(SystemExit) as exc:
        t.body(None, name="x", from_="there", times="2", dry_run=True)
    assert exc.value.code == 3
    assert sys.modules[command_module].calls == [(("x",), {"source": "there", "times": 2, "show": False})]


def test_a_user_error_is_one_line_and_exit_2(command_module, capsys):
    with pytest.raises(SystemExit) as exc:
        make(_spec(command_module)).body(None, name="bad", from_="here", times=1, dry_run=False)
    assert exc.value.code == 2
    assert capsys.readouterr().err == "shipyard: error: --name 'bad': not a name\n"


def test_flags_read_by_name_and_refuse_an_unknown_one():
    f = Flags({"env": "e", "registry": None})
    assert f.env == "e"
    with pytest.raises(AttributeError, match="no flag 'nodes'"):
        f.nodes
    # the launch options of the named flags only: a flag that is no launch option (--out) stays out
    o = Flags({"environment": "e", "nodes": 2, "out": "x"}).options("environment", "nodes")
    assert (o.environment, o.nodes, o.cluster) == ("e", 2, None)
