"""A launcher's render is kept (shipyard/rendered.py): its context is plain data for every kind of launcher, a kept
text is the text Jinja2 renders, any change of the launcher renders anew, and a second `invoke launch --dry-run`
process prints the same launcher without importing Jinja2."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures_launch import HOSTILE_ARGS, build_launcher
from fixtures_projects import shipped_project
from fixtures_pycache import new_render_process, spy_render_keys, task_processes
from shipyard import jinja_environment, rendered
from shipyard.launch import image_check, launcher
from shipyard.launch.options import NCCL_TEST

CMD = ("train.py", "--epochs", "1")

CASES = {
    "1 node, host": dict(cluster="lab-socket"),
    "2 nodes, apptainer, ib": dict(cluster="lab-ib", nodes=2),
    "2 nodes, pyxis, efa, mounts": dict(cluster="lab-efa", nodes=2, mounts="/fsx/data:/data:ro"),
    "registry image (opt-out)": dict(cluster="lab-efa", nodes=2, image="nvcr.io#nvidia/pytorch:24.01-py3"),
    "requeue, monitor, chain, debug, env": dict(cluster="lab-socket", nodes=2, requeue=True, max_restarts=2, chain=3,
                                                monitor=True, monitor_interval=2, nccl_debug=True, env=["LR=0.1"]),
    "preflight, signal": dict(cluster="lab-ib", nodes=2, preflight="on", signal_before=120),
    "sweep": dict(cluster="lab-socket", nodes=2, sweep="lr=1e-3,1e-4 seed=0,1", max_concurrent=2),
    "sbatch pass-through, fallback allowed": dict(cluster="lab-efa", nodes=2, sbatch=["qos=low"],
                                                  allow_transport_fallback=True),
    "hostile words": dict(cluster="lab-ib", nodes=2, command=("train.py", *HOSTILE_ARGS)),
    "nccl-test": dict(cluster="lab-efa", nodes=2, kind=NCCL_TEST),
    "nccl-test, mpi none": dict(cluster="lab-socket", nodes=2, kind=NCCL_TEST, runtime="pyxis"),
}


def _launcher(reg, case: str) -> launcher.Launcher:
    flags = dict(CASES[case])
    return build_launcher(reg, kind=flags.pop("kind", "torchrun"), command=flags.pop("command", CMD), **flags)


def _no_jinja(*args, **kwargs):
    raise AssertionError("rendered by Jinja2 although the text was kept")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_kind_of_launcher_is_kept_and_served_as_jinja2_renders_it(launch_registry, fresh_renders, monkeypatch,
                                                                         case):
    l = _launcher(launch_registry, case)
    keys = spy_render_keys(monkeypatch)
    first = launcher.render(l)
    assert keys and keys[0] is not None, "the launcher's context is not plain data: it is rendered every time"
    rendered._save()
    new_render_process()
    monkeypatch.setattr(jinja_environment, "render", _no_jinja)
    assert launcher.render(l) == first


@pytest.mark.parametrize("change", [
    dict(name="other"), dict(nodes=1), dict(command=("train.py", "--epochs", "2")), dict(umask="0027"),
    dict(code_commit="0" * 40), dict(code_dirty=True), dict(forced=("environments.x: overridden",)),
    dict(handout=True), dict(gpus_per_node=2), dict(image="/elsewhere/img.sqsh"), dict(fabric="socket"),
    dict(rdzv_port=29600), dict(signal="SIGTERM"),
])
def test_any_change_of_the_launcher_changes_its_key(launch_registry, monkeypatch, change):
    """Each field the templates read, the launcher's own or a part's, is in the key."""
    l = _launcher(launch_registry, "2 nodes, pyxis, efa, mounts")
    keys = spy_render_keys(monkeypatch)
    monkeypatch.setattr(jinja_environment, "render", lambda *a: "")
    launcher.render(l)
    launcher.render(l.replace(**change))
    assert None not in keys and keys[0] != keys[1]


def test_the_mounts_and_sweep_reach_the_key(launch_registry, monkeypatch):
    """A launcher's mounts (a part's objects) and its sweep's combinations are plain data in the key."""
    mounted, sweep = _launcher(launch_registry, "2 nodes, pyxis, efa, mounts"), _launcher(launch_registry, "sweep")
    keys = spy_render_keys(monkeypatch)
    monkeypatch.setattr(jinja_environment, "render", lambda *a: "")
    last = mounted.mounts[-1]
    for l in (mounted, mounted.replace(mounts=(*mounted.mounts[:-1], replace(last, ro=not last.ro))),
              sweep, sweep.replace(combinations=replace(sweep.combinations, names=("lr", "wd")))):
        launcher.render(l)
    assert mounted.mounts and sweep.combinations
    assert None not in keys and len(set(keys)) == 4


def test_the_image_check_script_is_kept(fresh_renders, monkeypatch):
    check = image_check.Check("/fsx/images/e.sqsh", "a" * 64, "b" * 64, "stage record /fsx/images/e.sqsh.json")
    first = image_check.render(check, "e", "invoke shell e --cluster c", "`invoke shell` runs")
    rendered._save()
    new_render_process()
    monkeypatch.setattr(jinja_environment, "render", _no_jinja)
    assert image_check.render(check, "e", "invoke shell e --cluster c", "`invoke shell` runs") == first


def test_a_second_launch_dry_run_loads_no_jinja2_and_prints_the_same_launcher(tmp_path):
    """Two `launch --dry-run` processes in a project of the test's own: the second prints the first's launcher byte
    for byte from the kept text, without importing Jinja2."""
    proj = shipped_project(tmp_path / "proj")
    runs = task_processes(proj, tmp_path / "prefix", ["launch", "--dry-run", "--force", "--", "examples/train.py"])
    assert runs[0][0].startswith("#!/bin/bash"), runs[0][0][:400]
    assert runs[0][0] == runs[1][0]
    assert [jinja for _, jinja in runs] == [True, False]
