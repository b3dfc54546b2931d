"""The runtimes are the tuple in shipyard/runtimes/ (one module each), and the options model
(shipyard/launch/options.py) is what both launcher tasks' help, flags and "regenerate with" line come from."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest
from helpers_registry import ROOT

from shipyard.errors import ShipyardError
from shipyard import runtimes
from shipyard.launch import options
from shipyard.runtimes.mounts import Mount
from shipyard.runtimes import Placement, Runtime

RUNTIME_DIR = Path(runtimes.__file__).parent


def load_tasks():
    spec = importlib.util.spec_from_file_location("shipyard_tasks_under_test", ROOT / "shipyard" / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_runtime_module_is_in_the_tuple():
    files = {p.stem for p in RUNTIME_DIR.glob("*.py")} - {"__init__", "base", "mounts"}
    assert {type(rt).__module__.rsplit(".", 1)[1] for rt in runtimes.RUNTIMES} == files
    assert set(runtimes.NAMES) == {"pyxis", "apptainer", "host"}
    assert runtimes.NAMES == ("pyxis", "apptainer", "host")  # the tuple's order: the usual choice first


@pytest.mark.parametrize("name", runtimes.NAMES)
def test_each_runtime_implements_the_protocol(name):
    rt = runtimes.get(name)
    assert isinstance(rt, Runtime) and rt.name == name
    place = Placement("/img", (Mount("/p", "/p"), Mount("/d", "/data", True)), "/p", ("A", "B"))
    for words in (rt.srun_words(place), rt.exec_words(place), rt.shell_words(place)):
        assert isinstance(words, list) and all(isinstance(w, str) for w in words)
    assert rt.containerised == (rt.suffix is not None)
    assert rt.mount(Mount("/d", "/data", True)) == "/d:/data:ro"


def test_unknown_runtime_is_one_line_naming_the_flag():
    with pytest.raises(ShipyardError, match=r"^--runtime 'docker': unknown runtime \(valid: pyxis, apptainer, host\)$"):
        runtimes.get("docker")


@pytest.mark.parametrize("kind,task_name", [(options.TORCHRUN, "launch"), (options.NCCL_TEST, "nccl_test")])
def test_options_model_drives_both_tasks(kind, task_name):
    task = getattr(load_tasks(), task_name)
    assert task.help == options.help_for(kind)
    assert task.iterable == ["env", "sbatch"] and task.positional == [options.POSITIONAL]
    params = [p for p in inspect.signature(task.body).parameters if p != "c"]
    assert params == list(options.names(kind))  # the task takes exactly the model's flags, in its order
    assert "pyxis | apptainer | host" in task.help["runtime"]  # the runtime help lists the discovered runtimes


def test_nccl_test_has_no_torchrun_only_flags():
    assert set(options.names(options.TORCHRUN)) - set(options.names(options.NCCL_TEST)) == {
        "cpus_per_task", "monitor", "monitor_interval", "chain", "requeue", "max_restarts", "signal_before",
        "sweep", "sweep_file", "max_concurrent"}  # issue 24: sweeps are torchrun jobs


def test_checks_name_the_flag():
    with pytest.raises(ShipyardError, match=r"^--gpus-per-node 'x': expected an integer >= 0$"):
        options.check("gpus_per_node", "x")
    with pytest.raises(ShipyardError, match=r"^--time '2h': expected Slurm time"):
        options.check("time", "2h")
    assert options.check("nodes", "3") == 3


def test_registry_schema_lists_exactly_the_runtime_files():
    """A cluster's `runtime:` is checked by the schema (editors read it too); the registry stage cannot import
    shipyard.launch, so this test keeps the two lists equal: a new runtime file fails here until the schema names it."""
    from shipyard import facts

    enum = facts.load("registry.schema.json")["$defs"]["cluster"]["properties"]["runtime"]["enum"]
    assert sorted(enum) == sorted(runtimes.NAMES)
