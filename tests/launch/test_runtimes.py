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
    assert set(runtimes.NAMES) == {"pyxis", "apptainer", "charliecloud", "host"}
    assert runtimes.NAMES == ("pyxis", "apptainer", "charliecloud", "host")  # the tuple's order: the usual choice first


@pytest.mark.parametrize("name", runtimes.NAMES)
def test_each_runtime_implements_the_protocol(name):
    rt = runtimes.get(name)
    assert isinstance(rt, Runtime) and rt.name == name
    place = Placement("/img", (Mount("/p", "/p"), Mount("/d", "/data", True)), "/p", ("A", "B"))
    for words in (rt.srun_words(place), rt.exec_words(place), rt.shell_words(place)):
        assert isinstance(words, list) and all(isinstance(w, str) for w in words)
    assert rt.containerised == (rt.suffix is not None)
    # ch-run binds have no read-only flag (SRC[:DST] only, ch-run 0.31 to 0.38): charliecloud spells none
    want = "/d:/data" if name == "charliecloud" else "/d:/data:ro"
    assert rt.mount(Mount("/d", "/data", True)) == want


def test_unknown_runtime_is_one_line_naming_the_flag():
    valid = r"\(valid: pyxis, apptainer, charliecloud, host\)$"
    with pytest.raises(ShipyardError, match=r"^--runtime 'docker': unknown runtime " + valid):
        runtimes.get("docker")


@pytest.mark.parametrize("kind,task_name", [(options.TORCHRUN, "launch"), (options.NCCL_TEST, "nccl-test")])
def test_options_model_drives_both_tasks(kind, task_name):
    task = load_tasks().ns.tasks[task_name]
    assert task.help == options.help_for(kind)
    assert task.iterable == ["env", "sbatch"] and task.positional == [options.POSITIONAL]
    params = [p for p in inspect.signature(task.body).parameters if p != "c"]
    assert params == list(options.names(kind))  # the task takes exactly the model's flags, in its order
    # the runtime help lists the discovered runtimes
    assert "pyxis | apptainer | charliecloud | host" in task.help["runtime"]


def test_nccl_test_has_no_torchrun_only_flags():
    assert set(options.names(options.TORCHRUN)) - set(options.names(options.NCCL_TEST)) == {
        "cpus_per_task", "monitor", "monitor_interval", "chain", "requeue", "max_restarts", "signal_before",
        "sweep", "sweep_file", "max_concurrent", "preflight"}  # sweeps are torchrun jobs


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


def _ch_placement(env_names=("FOO", "NCCL_DEBUG"), home=False):
    return Placement("/s/train.sqsh", (Mount("/proj", "/proj"), Mount("/efa", "/efa", True)), "/proj/sub",
                     env_names, home=home)


def test_charliecloud_runs_ch_run_with_binds_workdir_and_the_images_environment():
    """ch-run -b SRC:DST ... --cd WORKDIR IMAGE -- /bin/sh -c PRELUDE: no srun words (ch-run is a plain program); the
    prelude applies the image's variables, then the job's named ones on top, then execs the command."""
    rt = runtimes.get("charliecloud")
    p = _ch_placement()
    assert rt.srun_words(p) == [] and rt.suffix == "sqsh" and rt.needs == frozenset({"ch-run"})
    words = rt.exec_words(p)
    assert words[:8] == ["ch-run", "-b", "/proj:/proj", "-b", "/efa:/efa", "--cd", "/proj/sub", "/s/train.sqsh"]
    assert words[8:11] == ["--", "/bin/sh", "-c"] and words[12] == "shipyard-ch-env" and len(words) == 13
    assert "--home" not in words and "--home" in rt.shell_words(_ch_placement(home=True))
    assert rt.shell_words(p)[-1] == "bash"


def _run_prelude(tmp_path, env_file: str | None, names, job_env: dict, where="etc/environment") -> dict:
    """Run the prelude with real sh against a fake image root (the files it reads are made absolute by chroot-less
    substitution of the two paths), returning the environment the command sees."""
    import os
    import subprocess

    from shipyard.runtimes.charliecloud import env_prelude

    script = env_prelude(tuple(names))
    root = tmp_path / "img"
    for rel in ("ch", "etc"):
        (root / rel).mkdir(parents=True, exist_ok=True)
    if env_file is not None:
        (root / where).write_text(env_file)
    script = script.replace("/ch/environment", str(root / "ch/environment")).replace(
        "/etc/environment", str(root / "etc/environment"))
    out = subprocess.run(["sh", "-c", script, "shipyard-ch-env", "env", "-0"], capture_output=True, check=True,
                         env={"PATH": os.environ["PATH"], **job_env}).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if item)


def test_charliecloud_prelude_the_images_values_then_the_jobs(tmp_path):
    image = ("PATH=/opt/image/bin:/bin\nLD_LIBRARY_PATH=/opt/image/lib\nFOO=image\nQ='a b'\nBAD-NAME=x\n9X=y\n"
             "noequals\nEXPR=$(touch pwned) `x` $HOME")
    got = _run_prelude(tmp_path, image, ["FOO"], {"FOO": "job $(x) 'q'", "HOSTONLY": "kept"})
    assert got["PATH"].startswith("/opt/image/bin:/bin")  # the image's PATH: its torchrun is found
    assert got["LD_LIBRARY_PATH"] == "/opt/image/lib" and got["FOO"] == "job $(x) 'q'"  # the job's named value wins
    assert got["Q"] == "a b" and got["EXPR"] == "$(touch pwned) `x` $HOME"  # literal, ch-run's quote stripping
    assert got["HOSTONLY"] == "kept" and "BAD-NAME" not in got and "9X" not in got
    assert not (tmp_path / "pwned").exists()


def test_charliecloud_prelude_prefers_ch_environment_and_runs_without_either(tmp_path):
    (tmp_path / "img" / "etc").mkdir(parents=True)
    (tmp_path / "img" / "etc" / "environment").write_text("FROM=etc\n")
    got = _run_prelude(tmp_path, "FROM=ch\n", [], {}, where="ch/environment")
    assert got["FROM"] == "ch"
    got = _run_prelude(tmp_path / "none", None, ["A"], {"A": "job"})
    assert got["A"] == "job" and "FROM" not in got


def test_only_pyxis_and_host_cannot_wrap_tools_in_modules():
    """`invoke modules` writes wrappers for apptainer and charliecloud; pyxis (an srun plugin) and host refuse in one
    line, nothing written."""
    assert [n for n in runtimes.NAMES if runtimes.get(n).wraps_tools] == ["apptainer", "charliecloud"]
    with pytest.raises(ShipyardError, match="cannot wrap tools"):
        runtimes.get("pyxis").tool_words("/img.sqsh", None, "python")


def test_charliecloud_prelude_prepends_a_path_list_to_the_images(tmp_path):
    """A module's host-injected LD_LIBRARY_PATH goes in front of the image's, by the launcher's own line
    (fabric.prepend_exports) run after the image's environment: the host's value (after `module load`, the other
    modules' paths too) is replaced by the image's, never put in front of it; alone when the image has none."""
    import subprocess

    from shipyard.launch.fabric import EnvVar, prepend_exports
    from shipyard.runtimes.charliecloud import env_prelude

    root = tmp_path / "img"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "environment").write_text("LD_LIBRARY_PATH=/opt/image/lib\n")
    inside = "; ".join(prepend_exports([EnvVar("LD_LIBRARY_PATH", "/host/efa lib", prepend=True),
                                        EnvVar("FI_PROVIDER", "efa")]))
    script = env_prelude(("FI_PROVIDER",), inside).replace(
        "/ch/environment", str(root / "ch/environment")).replace("/etc/environment", str(root / "etc/environment"))
    run = ["sh", "-c", script, "shipyard-ch-env", "sh", "-c", 'echo "$LD_LIBRARY_PATH|$FI_PROVIDER"']
    out = subprocess.run(run, capture_output=True, text=True, check=True,
                         env={"LD_LIBRARY_PATH": "/host/efa lib:/host/other", "FI_PROVIDER": "efa"}).stdout
    assert out == "/host/efa lib:/opt/image/lib|efa\n"
    (root / "etc" / "environment").write_text("OTHER=1\n")
    out = subprocess.run(run, capture_output=True, text=True, check=True, env={}).stdout
    assert out == "/host/efa lib|\n"
    assert env_prelude(("A",)).endswith('export A="$shipyard_0"; exec "$@"')  # nothing to prepend: nothing run