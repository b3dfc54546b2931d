"""Exit codes mean one thing (README, "Exit codes"): 0 success, 1 a check or job that failed, 2 bad input or an
unusable environment, for every task, with one line on stderr and never a traceback."""

from __future__ import annotations

import os

import pytest
from fixtures_invoke import invoke_cli, task_program

import tasks

# the required positionals, given, so that what is tested is the bad registry, not invoke's own parser
ARGS = {"logs": ["1"], "usage": ["1"], "sweep-status": ["s"], "nccl-report": ["nccl.log"],
        "cluster.import-pcluster": ["pcluster.yaml"]}
# `invoke test` runs pytest on this checkout, the sandbox's down/status act on the machine's one sandbox, and
# compat.refresh reads shipyard's own compat data and PyPI: they read no project registry (tested below instead)
NO_REGISTRY = {"test", "sandbox.down", "sandbox.status", "compat.refresh"}
TASKS = [t for t in sorted(tasks.ns.task_names) if t not in NO_REGISTRY]


def test_every_task_is_listed():
    assert set(TASKS) | NO_REGISTRY == set(tasks.ns.task_names) and len(TASKS) >= 20


@pytest.mark.parametrize("name", sorted(ARGS))
def test_a_missing_required_argument_is_exit_2_with_one_line(name, capsys):
    """invoke's own parse errors exit 1; shipyard's parser hook makes them bad input like any other (exit 2)."""
    with pytest.raises(SystemExit) as ei:
        task_program().run(["invoke", name])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.startswith("shipyard: error: ") and len(err.strip().splitlines()) == 1, err
    assert "did not receive required positional arguments" in err


def test_compat_refresh_bad_input_is_exit_2_before_any_network(capsys):
    with pytest.raises(SystemExit) as ei:
        task_program().run(["invoke", "compat.refresh", "--torch", "nonsense"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.startswith("shipyard: error: --torch nonsense") and len(err.splitlines()) == 1


@pytest.mark.parametrize("name", ["sandbox.down", "sandbox.status"])
def test_sandbox_tasks_need_no_registry(name, tmp_path, monkeypatch, capsys):
    """One sandbox per machine: stopping or asking about it works from any folder, registry or not (exit 0)."""
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(tmp_path / "missing" / "registry.yaml"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ei:  # every task ends with its command's exit code
        task_program().run(["invoke", name, "--directory", str(tmp_path / "no-sandbox")], exit=False)
    assert (ei.value.code, capsys.readouterr().err) == (0, "")


@pytest.mark.parametrize("name", TASKS)
def test_bad_input_is_exit_2_with_one_line_for_every_task(name, tmp_path, monkeypatch, capsys):
    """A registry that does not exist is bad input for every task that reads one: exit 2, one stderr line.

    In-process through invoke's own Program and shipyard's task guard (a child process per task cost ~0.5 s each);
    the child-process CLI is covered below and in tests/test_cli_help.py."""
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(tmp_path / "missing" / "registry.yaml"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ei:
        task_program().run(["invoke", name, *ARGS.get(name, [])])
    err = capsys.readouterr().err
    assert ei.value.code == 2, (name, err[-500:])
    assert err.startswith("shipyard: error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("args, code", [
    (["show", "pytorch-2.3"], 0),
    (["show", "no-such-env"], 2),
    (["render", "--all", "--check"], 1),
])
def test_success_is_0_and_a_failed_check_is_1(args, code, tmp_path):
    """`render --check` on a project whose definitions/ is missing is a failed check (1), not bad input."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "registry.yaml").write_text(open(os.path.join(root, "registry.yaml")).read())
    env = dict(os.environ, SHIPYARD_REGISTRY=str(tmp_path / "registry.yaml"))
    proc = invoke_cli(*args, cwd=tmp_path, env=env)
    assert proc.returncode == code, proc.stderr


@pytest.mark.parametrize("argv,needle", [
    (["logs", "1", "-n", "abc"], "--num-lines 'abc': expected a whole number"),
    (["logs", "1", "--num-lines=1.5"], "--num-lines '1.5'"),
    (["sign", "--keyidx", "x1"], "--keyidx 'x1': expected a whole number"),
])
def test_a_flag_value_of_the_wrong_type_is_exit_2_with_one_line(argv, needle, capsys):
    """invoke casts a flag's value to its default's type; a ValueError there must be one line, not a traceback."""
    with pytest.raises(SystemExit) as ei:
        task_program().run(["invoke", *argv])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.startswith("shipyard: error: ") and len(err.strip().splitlines()) == 1, err
    assert needle in err, err


@pytest.mark.parametrize("out", ["adir.png", "afile/x.png", "/proc/x.png"])
def test_an_unwritable_out_is_exit_2_with_one_line(out, tmp_path, monkeypatch, capsys):
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir.png").mkdir()
    (tmp_path / "afile").write_text("")
    log = Path(__file__).parent / "data" / "nccl" / "all_reduce_efa_2x8.log"
    with pytest.raises(SystemExit) as ei:
        task_program().run(["invoke", "nccl-report", str(log), "--out", out])
    err = capsys.readouterr().err.strip().splitlines()
    assert ei.value.code == 2 and err[-1].startswith(f"shipyard: error: --out {out}: cannot write"), err


def test_an_unwritable_prefix_is_exit_2_with_one_line(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "registry.yaml").write_text((Path(__file__).parent.parent / "registry.yaml").read_text())
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as ei:
        task_program().run(["invoke", "modules", "--cluster", "grete", "--force", "--prefix",
                                         "afile/m"])
    err = capsys.readouterr().err.strip().splitlines()
    assert ei.value.code == 2 and err[-1].startswith("shipyard: error: --prefix afile/m: cannot write"), err


def test_a_reader_that_goes_away_is_no_traceback(invoke):
    """`invoke launch --dry-run | head -1`: the pipe closes early; the task stops quietly with 141 (SIGPIPE's code)."""
    import subprocess

    proc = subprocess.Popen(invoke.argv("launch", "--dry-run", "--cluster", "sandbox", "--", "examples/train.py"),
                            cwd=invoke.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the launcher is written
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=60), err) == (141, "")
