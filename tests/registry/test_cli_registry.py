"""The invoke tasks as a user runs them: exit codes, one-line errors without tracebacks, SHIPYARD_REGISTRY."""

from __future__ import annotations

import os
import shutil

import pytest
from fixtures_invoke import invoke_cli
from helpers_registry import DATA, ROOT


def run(*args, registry=None, cwd=ROOT):
    env = dict(os.environ)
    env.pop("SHIPYARD_REGISTRY", None)
    if registry:
        env["SHIPYARD_REGISTRY"] = str(registry)
    return invoke_cli(*args, cwd=cwd, env=env, timeout=120)


def test_check_passes_on_shipped_registry():
    res = run("check")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 error(s)" in res.stdout


def test_render_check_passes_on_committed_definitions():
    res = run("render", "--all", "--check")
    assert res.returncode == 0, res.stdout + res.stderr


def test_check_reports_every_problem_as_a_table_and_exits_nonzero(tmp_path):
    reg = tmp_path / "r.yaml"
    reg.write_text((DATA / "minimal.yaml").read_text().replace('cuda: "12.1"', 'cuda: "12.4"').replace(
        'python: "3.11"', 'python: "3.13"'))
    res = run("check", registry=reg)
    assert res.returncode == 1
    assert "severity" in res.stdout and "has no CUDA 12.4 wheel" in res.stdout and "Python 3.13" in res.stdout
    assert "definitions/e.lock is missing" in res.stdout  # no lock beside this registry: an ERROR too
    assert "3 error(s)" in res.stdout


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_bad_input_is_one_line_exit_2_no_traceback(tmp_path):
    reg = tmp_path / "r.yaml"
    reg.write_text((DATA / "minimal.yaml").read_text().replace("os:", "oss:"))
    for task in (["check"], ["list"], ["show"], ["render"]):
        res = run(*task, registry=reg)
        assert res.returncode == 2, (task, res.stderr)
        assert "Traceback" not in res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "r.yaml:6: environments.e.oss: unknown key 'oss' (did you mean 'os'?)" in lines[0]


def test_unknown_environment_flag(tmp_path):
    res = run("show", "pytorch-9")
    assert res.returncode == 2 and "unknown environment 'pytorch-9'" in res.stderr and "Traceback" not in res.stderr


def test_show_lists_sources():
    res = run("show", "pytorch-2.3")
    assert res.returncode == 0
    assert "default (companion of torch 2.3.1)" in res.stdout and "explicit" in res.stdout


def test_show_and_check_print_when_the_facts_were_reviewed():
    from shipyard.registry import report

    for task in (["show", "pytorch-2.3"], ["check"]):
        res = run(*task)
        assert res.returncode == 0, res.stderr
        assert res.stdout.rstrip("\n").splitlines()[-1] == report.facts_line(), task


def test_a_torch_newer_than_the_facts_is_named_so(tmp_path):
    reg = tmp_path / "r.yaml"
    reg.write_text((DATA / "minimal.yaml").read_text().replace('torch: "2.3.1"', 'torch: "2.16.0"'))
    res = run("check", registry=reg)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "torch 2.16.0 is newer than the facts (reviewed " in res.stderr


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_render_writes_into_the_registry_project(tmp_path):
    shutil.copy(DATA / "features.yaml", tmp_path / "registry.yaml")
    res = run("render", "--all", cwd=tmp_path)
    assert res.returncode == 2 and "refused" in res.stderr  # no locks beside this registry: check refuses
    res = run("render", "--all", "--force", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "definitions" / "child.def").is_file()
    res = run("render", "--all", "--check", cwd=tmp_path)
    assert res.returncode == 0
    (tmp_path / "definitions" / "child.def").write_text("stale")
    res = run("render", "--all", "--check", cwd=tmp_path)
    assert res.returncode == 1 and "definitions/child.def" in res.stdout
