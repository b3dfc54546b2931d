"""Every bench/ script runs, with a tiny input, so a refactor cannot break a benchmark silently (bench_lock.py failed
with an ImportError for a while after the move to packages and nothing noticed).

The figures are not checked: on a shared 2-core machine they mean nothing at this size. What is checked is that each
script finishes and prints its table. The runs are marked ``slow`` (about 40 s together; CI runs them), plus the
marker of the service or network a script needs; the quick loop imports every script in-process, which is what a
moved module breaks first.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

# script -> (tiny arguments, what its output shows, marks). {tmp} is the test's temporary folder.
SMOKE = {
    "bench_lock.py": (["--runs", "1", "--no-baseline"], "invoke lock, uv cache warm", [pytest.mark.pypi]),
    "build_noop.py": (["--runs", "1", "--size-mib", "4", "--out", "{tmp}"], "no-op build, 4 MiB artifact",
                      [pytest.mark.real_apptainer]),
    "image_check.py": (["--runs", "1", "--size-gib", "0.001", "--out", "{tmp}"], "every later job", []),
    "lock_overhead.py": (["--runs", "1"], "uv stand-in (shipyard's own part)", [pytest.mark.pypi]),
    "launch_generation.py": (["--runs", "1"], "invoke nccl-test --dry-run", []),
    "launch_overhead.py": (["--rounds", "1"], "shipyard launch, host runtime", [pytest.mark.slurm, pytest.mark.slow]),
    "push_sif.py": (["--size-mib", "1", "--repeat", "1", "--out", "{tmp}"], "ratio_to_cp", [pytest.mark.docker]),
    # as many environments as the shipped registry has and one more: every kind of base, `extends` included
    "registry_render_check.py": (["--envs", "7", "--repeat", "1"], "check (7 envs)", []),
    "container_start.py": (["--size-mib", "4", "--repeat", "1"], "x Apptainer",
                           [pytest.mark.slurm, pytest.mark.real_runtimes, pytest.mark.slow]),
    "sandbox_bench.py": (["--repeat", "1", "--steps", "2", "--out", "{tmp}"], "demo job",
                         [pytest.mark.slurm, pytest.mark.slow]),
    "stage_fresh.py": (["--runs", "1", "--size-gib", "0.001"], "x baseline", [pytest.mark.real_apptainer]),
    "stage_noop.py": (["--runs", "1", "--size-gib", "0.001"], "identical image staged", [pytest.mark.real_apptainer]),
    "start_time.py": (["--runs", "1", "--no-reference", "--help-tasks", "stage", "--json", "{tmp}/start.json"],
                      "invoke stage --help", []),
    "submit_wait.py": (["--jobs", "2"], "submit -> allocation", [pytest.mark.slurm, pytest.mark.slow]),
    "sweep_submit.py": (["--runs", "1", "--combinations", "20"], "--sweep-file (20 combinations)",
                        [pytest.mark.slurm, pytest.mark.slow]),
    "tools_bench.py": (["--runs", "1", "--scale", "0.01"], "usage.load_job", []),
}


def run(script: str, args: list[str], tmp_path: Path, sandbox_dir: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if sandbox_dir is not None:
        env["SHIPYARD_SANDBOX_DIR"] = str(sandbox_dir)
    argv = [sys.executable, str(BENCH / script), *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{script}: {res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def test_every_script_has_a_smoke_case():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted(SMOKE)


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_every_script_imports(script, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])  # as `python bench/X.py` has it
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", BENCH / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.main)


def _cases():
    for script, (args, shows, marks) in sorted(SMOKE.items()):
        needs_sandbox = pytest.mark.slurm in marks
        marks = marks if pytest.mark.slow in marks else [*marks, pytest.mark.slow]
        yield pytest.param(script, args, shows, needs_sandbox, id=script, marks=marks)


@pytest.mark.parametrize("script, args, shows, needs_sandbox", list(_cases()))
def test_script_runs_with_a_tiny_input(script, args, shows, needs_sandbox, tmp_path, request):
    sandbox_dir = request.getfixturevalue("sandbox").directory if needs_sandbox else None
    assert shows in run(script, args, tmp_path, sandbox_dir)
