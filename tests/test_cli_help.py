"""Every task answers `invoke TASK --help`, `invoke TASK -h` and `invoke --help TASK` with its help, exit 0.

Tasks with a positional argument used to take a `--help` after their name as that argument's value
(`invoke logs --help`: "expected a Slurm job id"); the list of tasks comes from tasks.ns itself, so a new task is
covered without editing this file. The usage line names the positionals as the README or docs/ write them.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import subprocess
from pathlib import Path

import pytest
from invoke.main import program

import tasks

ROOT = Path(__file__).resolve().parent.parent
# the user docs: README.md and the feature pages under docs/ it links (docs/remote.md shows remote.login, ...)
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
TASKS = sorted(tasks.ns.task_names)
FORMS = {"TASK --help": lambda t: (t, "--help"), "TASK -h": lambda t: (t, "-h"), "--help TASK": lambda t: ("--help", t)}
# -h takes the same path as --help; it is checked where the bug was (a positional waiting), to keep the test short
CASES = [(t, f) for t in TASKS for f in FORMS if f != "TASK -h" or tasks.ns[t].positional]


def in_process(*args: str) -> subprocess.CompletedProcess:
    """``invoke -r ROOT ARGS`` through invoke's own program object in this process: the same parser, hooks and
    tasks.py as the command line, without a fresh interpreter (~0.4 s each) per case."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            program.run(["invoke", "-r", str(ROOT), *args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def helps():
    """{(task, form): CompletedProcess} for every case, run once in this process."""
    return {case: in_process(*FORMS[case[1]](case[0])) for case in CASES}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_in_process_help_is_what_the_command_line_prints(invoke, helps, form):
    """The shortcut above is only as good as its agreement with a real ``python -m invoke`` process: one task with
    a waiting positional per form, byte for byte."""
    res = invoke(*FORMS[form]("logs"), timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (helps["logs", form].returncode, helps["logs", form].stdout,
                                                        helps["logs", form].stderr)


def positionals(name: str) -> list[tuple[str, bool]]:
    """(argument name, optional?) for each positional of the task, from its signature's defaults."""
    task = tasks.ns[name]
    params = inspect.signature(task.body).parameters
    return [(p, params[p].default is not inspect.Parameter.empty) for p in task.positional]


def test_every_task_is_covered():
    assert {"show", "logs", "nccl-report", "sandbox.up", "launch"} <= set(TASKS)
    assert len(TASKS) >= 20


@pytest.mark.parametrize("name, form", CASES)
def test_help_prints_usage_and_docstring(helps, name, form):
    res = helps[name, form]
    assert (res.returncode, res.stderr) == (0, ""), res.stdout + res.stderr
    usage = res.stdout.splitlines()[0]
    m = re.fullmatch(rf"Usage: inv\[oke\] \[--core-opts\] {re.escape(name)} (\[--options\] )?(?P<pos>.*?) ?"
                     r"\[other tasks here \.\.\.\]", usage)
    assert m, usage
    words = m["pos"].split()
    expected = positionals(name)
    assert len(words) == len(expected), usage
    for word, (arg, optional) in zip(words, expected):
        assert word == (f"[{word.strip('[]')}]" if optional else word.strip("[]")), (arg, usage)
    first_line = inspect.getdoc(tasks.ns[name]).splitlines()[0]
    assert first_line in res.stdout


def test_every_task_has_help(invoke, helps):
    """Moved from test_cli_registry (it ran --help once more per task): every task listed has a docstring and every
    flag a help text."""
    res = invoke("--list", timeout=120)
    names = [ln.split()[0] for ln in res.stdout.splitlines()[2:] if ln.startswith("  ") and ln.strip()
             and not ln.startswith("    ")]
    assert "check" in names and "render" in names
    for name in names:
        h = helps[name, "--help TASK"]
        assert h.returncode == 0
        assert "Docstring:\n  none" not in h.stdout, name
        opts = h.stdout.split("Options:", 1)[1] if "Options:" in h.stdout else ""
        for ln in opts.splitlines():
            if re.match(r"^\s+-", ln):
                assert re.match(r"^\s+\S.*?\s{2,}\S", ln), f"{name}: flag without help: {ln}"


@pytest.mark.parametrize("name", [t for t in TASKS if tasks.ns[t].positional])
def test_usage_agrees_with_readme(helps, name):
    usage = helps[name, "TASK --help"].stdout.splitlines()[0]
    pos = usage.split("[--options] ", 1)[1].split(" [other tasks here", 1)[0]
    assert f"invoke {name} {pos}" in README, f"neither README.md nor docs/ show `invoke {name} {pos}`"


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_a_real_value_is_still_a_positional(invoke):
    res = invoke("show", "pytorch-2.3")
    assert res.returncode == 0 and res.stdout.startswith("environment pytorch-2.3"), res.stderr
    bad = invoke("logs", "12;x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


@pytest.mark.parametrize(("args", "line"), [
    (("course.handout", "--forse"), "course.handout: no flag --forse; did you mean --force?"),
    (("course.handout", "--out=/tmp/h", "--replce"), "course.handout: no flag --replce; did you mean --replace?"),
    (("launch", "--nodse", "2"), "launch: no flag --nodse; did you mean --nodes?"),
    (("course.handout", "--image", "x.sif"), "course.handout: no flag --image (--help lists its flags)"),
])
def test_a_mistyped_flag_is_one_line_with_the_closest_flag(args, line):
    """A task with a positional took a mistyped flag as that positional's value and blamed the next word (or ran
    with an environment named "--forse"); now the flag is named, with the nearest real one."""
    res = in_process(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr.strip() == f"shipyard: error: {line}" + ("" if line.endswith(")") else
                                                               " (--help lists its flags)")


def test_a_flag_value_that_looks_like_a_flag_is_still_a_value(invoke):
    """`--name --help` names the launcher "--help", as invoke does: only a word in a flag's place is checked."""
    res = in_process("launch", "--name", "--nodse", "--help")
    assert "no flag" not in res.stderr, res.stderr


def test_every_runtime_flag_lists_every_runtime():
    """Each task's --runtime help lists the runtimes from shipyard/runtimes/: a runtime added there cannot be
    missing from a flag's help (two of them once said "pyxis, apptainer or host" after Charliecloud came)."""
    from shipyard import runtimes

    helps = {t: tasks.ns[t].help["runtime"] for t in TASKS if "runtime" in tasks.ns[t].help}
    assert {"launch", "nccl-test", "shell", "cluster.import-pcluster"} <= set(helps)
    assert {t: h for t, h in helps.items() if not set(runtimes.NAMES) <= set(re.findall(r"[a-z]+", h))} == {}
