"""Options carry the flags: adding a launch flag is one field of the options model plus one parameter of the task.

The model derived here has one more field than :class:`Options`; nothing else is written for it, and the task's
help, the check of a bad value and the launcher's "regenerate with" line all pick it up. The flag's defaults come
from shipyard/data/launch.yaml alone.
"""

from __future__ import annotations

import importlib.util
import inspect
import io
import re
from dataclasses import MISSING, dataclass, fields

import pytest
from fixtures_launch import build_launcher
from helpers_registry import ROOT

from shipyard.commands import launch as launch_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.launch import launcher, options
from shipyard.launch.options import NCCL_TEST, TORCHRUN, Options, opt

CMD = ("examples/train.py",)


def load_tasks():
    spec = importlib.util.spec_from_file_location("shipyard_tasks_under_test", ROOT / "shipyard" / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class WithQos(Options):
    """Options plus one flag, as a newcomer would add it to options.py (and ``qos=None`` to the task)."""

    qos: str | None = opt(help="Slurm quality of service (sent every {signal} {signal_before} s before the end)",
                          kinds=(TORCHRUN,), check=options.matching(re.compile(r"^[a-z]+$"), "use lowercase letters"))


def test_the_new_field_is_a_flag_of_the_task_and_its_help():
    kwargs = options.task_kwargs(TORCHRUN, WithQos)
    d = options.defaults()
    assert kwargs["help"]["qos"] == f"Slurm quality of service (sent every {d['signal']} {d['signal_before']} s " \
                                    "before the end)"
    assert {k: v for k, v in kwargs["help"].items() if k != "qos"} == options.help_for(TORCHRUN)
    assert "qos" not in options.names(NCCL_TEST, WithQos)  # only the kinds the field names
    # the one parameter the task gains: the launch task's signature plus `qos` is the derived model's flag list
    params = [p for p in inspect.signature(load_tasks().ns.tasks["launch"].body).parameters if p != "c"]
    assert params + ["qos"] == list(options.names(TORCHRUN, WithQos))


def test_the_new_field_is_checked_and_repeated_in_the_regenerate_line(launch_registry):
    with pytest.raises(ShipyardError, match=r"^--qos 'High!': use lowercase letters$"):
        build_launcher(launch_registry, command=CMD, nodes=2, model=WithQos, qos="High!")
    l = build_launcher(launch_registry, command=CMD, nodes=2, model=WithQos, qos="high")
    assert l.regenerate[-4:] == ("--qos", "high", "--", *CMD)
    assert launcher.render(l).splitlines()[2].endswith(" --qos high -- examples/train.py")
    without = build_launcher(launch_registry, command=CMD, nodes=2)
    assert without.regenerate[:-2] == l.regenerate[:-4]  # nothing else changed


def test_the_command_passes_the_options_down_unchanged(launch_project):
    (launch_project / "t.py").write_text("")
    ctx = Context.load(out=io.StringIO())
    assert launch_commands.launch(ctx, WithQos(dry_run=True, qos="low"), ("t.py",)) == 0
    header = ctx.out.getvalue().splitlines()[2]
    assert header.endswith(" --qos low -- t.py")


def test_defaults_are_data_and_the_help_reads_them():
    d = options.defaults()
    helps = options.help_for(TORCHRUN)
    assert f"(default: {d['nodes']})" in helps["nodes"]
    assert f"(default {d['monitor_interval']})" in helps["monitor_interval"]
    assert f"(default {d['max_restarts']})" in helps["max_restarts"]
    assert f"{d['name']}-<cluster>, {d['nccl_test_name']}-<cluster>" in helps["name"]
    # a field's own default only says "not given"
    assert {f.default for f in fields(Options)} <= {None, False}
    # and the launcher's parts default only to "off" or "not given": a value comes from the data, through build
    models = [launcher.Launcher, *launcher.PARTS.values()]
    assert {f.default for m in models for f in fields(m) if f.default is not MISSING} <= {None, False, "", (), 0}
    assert "nodes" in {f.name for f in fields(launcher.Resources) if f.default is MISSING}


def test_implied_values_come_from_data(launch_registry):
    one = build_launcher(launch_registry, command=CMD)
    assert one.chain == options.defaults()["chain"] and "--chain" not in one.regenerate
    three = build_launcher(launch_registry, command=CMD, chain=3)
    assert three.regenerate[three.regenerate.index("--chain") + 1] == "3"


@pytest.mark.parametrize("flag, value, valid", [
    ("--nodes", "9" * 31, "expected an integer"),
    ("--nodes", "4294967294", "valid is 1 to 4294967293"),
    ("--signal-before", "65536", "valid is 1 to 65535"),
])
def test_integers_slurm_reads_from_flags_are_bounded_by_slurm(flag, value, valid):
    field = {"--nodes": "nodes", "--signal-before": "signal_before"}[flag]
    check = {f.name: f for f in fields(Options)}[field].metadata["check"]
    with pytest.raises(ShipyardError, match=valid) as exc:
        check(flag, value)
    assert "\n" not in str(exc.value) and "9" * 31 not in str(exc.value)
    assert check(flag, "2") == 2
