"""examples/course: the registry loads and `invoke check` passes on it, and every `invoke` command its README walks
through names a real task and real flags (so the walkthrough cannot silently rot when a task changes)."""

from __future__ import annotations

import functools
import os
import re
import shlex
from pathlib import Path

import pytest
from fixtures_invoke import invoke_cli
from helpers_registry import unrecorded_installer_warnings

from shipyard import project as paths
from shipyard import registry
from shipyard.commands import gate
from shipyard.definitions import pylock as lock
from shipyard.launch import modules
from shipyard.registry import compat

ROOT = Path(__file__).resolve().parents[2]
COURSE = ROOT / "examples" / "course"


def _invoke(*args, **env):
    full = {**os.environ, "SHIPYARD_REGISTRY": str(COURSE / "registry.yaml"), **env}
    return invoke_cli(*args, cwd=ROOT, env=full, timeout=120)


def test_course_registry_loads_with_both_cluster_kinds():
    reg = registry.load(COURSE / "registry.yaml")
    kinds = {(c.runtime, c.fabric) for c in reg.clusters.values()}
    assert ("apptainer", "ib") in kinds and ("pyxis", "efa") in kinds
    assert reg.registry_target().require_signed
    found = compat.check_all(reg)
    assert [p for p in found if p not in unrecorded_installer_warnings(found)] == []


def test_invoke_check_is_clean_on_the_course_registry():
    res = _invoke("check")
    assert res.returncode == 0, res.stdout + res.stderr
    reg = registry.load(COURSE / "registry.yaml")
    unverified = len(unrecorded_installer_warnings(compat.check_all(reg)))
    # the locks' checks: the course's public CUDA bases cannot be looked up here, so each is pinned by tag only
    locks = gate.lock_problems(reg)
    assert [(p.severity, p.key) for p in locks] == [("WARN", f"environments.{e}.base") for e in reg.environments]
    assert f"0 error(s), {unverified + len(locks)} warning(s)" in res.stdout


def test_course_environments_lock_inputs_and_modules():
    reg = registry.load(COURSE / "registry.yaml")
    assert lock.lock_inputs(reg.environment("course"))[0] == "torch==2.5.1"
    assert [e.name for e in modules.environments_on(reg, reg.cluster("gwdg"))] == ["course", "course-dev"]


def _readme_commands() -> list[list[str]]:
    cmds = []
    for line in (COURSE / "README.md").read_text().splitlines():
        m = re.match(r"^    (?:invoke|shipyard) (.*)$", line)  # the course README runs `shipyard` from its folder
        if m:
            cmds.append(shlex.split(m.group(1).split(" #")[0]))
    return cmds


@functools.lru_cache(maxsize=None)
def _flags(task: str) -> frozenset[str]:
    res = _invoke("--help", task)
    assert res.returncode == 0, f"README uses `invoke {task}`, which does not exist: {res.stderr.strip()}"
    return frozenset(re.findall(r"--[a-z][a-z-]*", res.stdout))


@pytest.mark.parametrize("argv", _readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_commands_name_real_tasks_and_flags(argv):
    words = argv[: argv.index("--")] if "--" in argv else argv
    task = words[0]
    for word in words[1:]:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            assert flag in _flags(task), f"`invoke {task}` has no {flag}"


def test_readme_covers_the_walk():
    tasks = {a[0] for a in _readme_commands()}
    assert {"check", "lock", "render", "build", "sign", "verify", "push", "doctor", "modules", "launch",
            "nccl-test", "nccl-report"} <= tasks


@pytest.mark.parametrize("name", ["course", "course-dev"])
def test_committed_course_locks_are_fresh_and_hashed(name):
    reg = registry.load(COURSE / "registry.yaml")
    path = paths.lock_path(reg, name)
    assert path.is_file(), f"run `SHIPYARD_REGISTRY=examples/course/registry.yaml invoke lock {name}`"
    assert lock.stale_reason(reg, reg.environment(name)) is None
    text = path.read_text()
    pkgs, hashes = lock.count_pins(text)
    assert pkgs > 30 and hashes >= pkgs
    assert "torch==2.5.1 \\" in text and "nvidia-nccl-cu12==2.21.5 \\" in text


@pytest.mark.slurm
@pytest.mark.slow
def test_readme_rehearsal_runs_two_node_training_on_the_sandbox(sandbox, tmp_path, monkeypatch):
    """README step 7, for real: the course registry's `sandbox` cluster, `invoke launch --nodes 2 --submit`'s code
    path, train.py copied into the project directory, on the real 2-node Slurm sandbox."""
    from fixtures_launch import run_launch, wait_job

    (tmp_path / "registry.yaml").write_text((COURSE / "registry.yaml").read_text())
    (tmp_path / "train.py").write_text((ROOT / "examples" / "train.py").read_text())
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(tmp_path / "registry.yaml"))
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    monkeypatch.chdir(tmp_path)
    out = run_launch(["train.py", "--steps", "20"], submit=True, cluster="sandbox", nodes=2)
    job = re.search(r"submitted job (\d+)", out).group(1)
    info = wait_job(sandbox, job)
    text = (tmp_path / "launch" / "logs" / f"train-sandbox-{job}.out").read_text()  # default name: train-<cluster>
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert re.search(r"result: .*world_size=4", text), text[-3000:]
