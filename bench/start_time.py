"""CPU time (user + sys) of `invoke --list`, `invoke render --all`, `invoke check` and `invoke launch --dry-run`
against invoke's own floor, measured side by side in the same rounds (goal: each <= 1.3x the floor).

The floor is `invoke --list` of a tasks.py holding one empty task: invoke's own start. shipyard's program holds the
cyclic garbage collector while it starts and freezes what it loaded (shipyard/collector.py), which also spares invoke's
own objects the collector's walks, the one at exit included; so a second floor, the held floor, runs the same one-task
tasks.py under that policy, and the ratios against it show what shipyard's own code adds. The goal is read against
invoke's floor. For scale only (no goal), hpccm rendering one equivalent recipe
runs in the same rounds unless --no-reference is given. hpccm lives in its own venv, bench/out/hpccm-venv (created on
first use with `pip install -r bench/requirements-hpccm.txt` from PyPI); it is not one of shipyard's dependencies.
The hpccm recipe is the shipped registry's pytorch-2.3 environment: nvidia/cuda base image, labels, environment, apt
packages, Python, the pinned pip packages and a runscript, rendered with `--format singularity`.

The shipyard commands run as a project folder runs them (`python -m shipyard`, the same program and tasks as
`invoke`) in a temporary copy of the project's inputs (registry.yaml, definitions/, examples/) with this checkout's
package on PYTHONPATH, so `render --all` rewrites identical files there and nothing in the checkout changes. Bytecode caches are on (PYTHONDONTWRITEBYTECODE is dropped), as on a user's machine; one
warm-up run of each command writes them. Commands run interleaved, round after round, so load from other
processes falls on all of them alike. Two figures per command: the ratio of its median to the floor's median, and the
median of its per-round ratios (each round's time over that round's floor), which cancels the drift of a shared
machine's speed between rounds; the goal is read from the second.

With ``--before DIR`` (a directory holding another version's ``shipyard/`` package, e.g. from
``git archive REV shipyard | tar -x -C DIR``) the three commands also run with that package, in the same rounds.

With ``--help-tasks all`` every task's ``--help`` is timed too, in the same rounds (``--help-tasks NAME,NAME``: some).

    python bench/start_time.py [--runs 9] [--no-reference] [--before DIR] [--help-tasks all]
                               [--json bench/out/start_time.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
HPCCM_VENV = OUT / "hpccm-venv"
FLOOR = "invoke --list of a one-task tasks.py (invoke's floor)"
HELD_FLOOR = "the same under shipyard's collector policy (held floor)"

RECIPE = '''\
# hpccm recipe equivalent to registry.yaml's pytorch-2.3 environment
Stage0 += baseimage(image="nvidia/cuda:12.1.1-runtime-ubuntu22.04", _distro="ubuntu22")
Stage0 += label(metadata={
    "org.shipyard.environment": "pytorch-2.3", "org.shipyard.torch": "2.3.1", "org.shipyard.cuda": "12.1",
    "org.shipyard.python": "3.11", "org.shipyard.os": "ubuntu22.04", "org.shipyard.nccl": "2.20.5",
    "org.shipyard.torchvision": "0.18.1", "org.shipyard.torchaudio": "2.3.1",
    "org.shipyard.base": "nvidia/cuda:12.1.1-runtime-ubuntu22.04", "org.example.course": "dl-101"})
Stage0 += environment(variables={"SHIPYARD_ENV": "pytorch-2.3", "OMP_NUM_THREADS": "1"})
Stage0 += apt_get(ospackages=["ca-certificates", "git"])
Stage0 += python(python2=False, devel=True)
Stage0 += pip(pip="pip3", packages=["torch==2.3.1", "torchvision==0.18.1", "torchaudio==2.3.1",
                                    "nvidia-nccl-cu12==2.20.5", "numpy==1.26.4"])
Stage0 += runscript(commands=["python3"])
'''


def hpccm_bin() -> Path:
    exe = HPCCM_VENV / "bin" / "hpccm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HPCCM_VENV)], check=True)
        subprocess.run([str(HPCCM_VENV / "bin" / "pip"), "install", "-q", "-r",
                        str(ROOT / "bench" / "requirements-hpccm.txt")], check=True)
    return exe


def cpu_seconds(cmd: list[str], cwd: Path, env: dict) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.decode()[-800:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def help_tasks(chosen: str) -> list[str]:
    """The task names ``--help-tasks`` chose: every task of shipyard's table (``collection.task`` inside a
    collection) for 'all'."""
    if not chosen:
        return []
    sys.path.insert(0, str(ROOT))
    from shipyard import tasks

    every = [s.name for s in tasks.TOP] + [f"{c}.{s.name}" for c, specs in tasks.COLLECTIONS.items() for s in specs]
    if chosen == "all":
        return every
    names = [n for n in chosen.split(",") if n]
    unknown = [n for n in names if n not in every]
    if unknown:
        raise SystemExit(f"--help-tasks: no task {', '.join(unknown)} (tasks: {', '.join(every)})")
    return names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--before", help="directory with an older shipyard/ package to measure in the same rounds")
    ap.add_argument("--json", default=str(OUT / "start_time.json"))
    ap.add_argument("--no-reference", action="store_true",
                    help="skip hpccm (its venv needs the network on first use)")
    ap.add_argument("--help-tasks", default="",
                    help="also time `TASK --help` for these tasks: 'all' (every task shipyard has) or NAME,NAME")
    args = ap.parse_args()
    helps = help_tasks(args.help_tasks)
    OUT.mkdir(parents=True, exist_ok=True)
    hpccm = None if args.no_reference else hpccm_bin()
    py = sys.executable
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "SHIPYARD_REGISTRY")}
    env["PYTHONPATH"] = str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        proj = Path(tmp)
        # a project folder with no tasks file in it: `python -m shipyard` is its `invoke` (the same program and tasks)
        shutil.copy(ROOT / "registry.yaml", proj / "registry.yaml")
        for name in ("definitions", "examples"):
            shutil.copytree(ROOT / name, proj / name)
        recipe = proj / "recipe.py"
        recipe.write_text(RECIPE)
        floor = proj / "floor"  # invoke's own start: a tasks.py of one empty task
        floor.mkdir()
        (floor / "tasks.py").write_text("from invoke import task\n\n\n@task\ndef hello(c):\n    pass\n")
        held = proj / "floor-held"  # the same, under shipyard's collector policy: held from the first line, the
        held.mkdir()                # objects frozen once the tasks are loaded (shipyard/collector.py)
        (held / "tasks.py").write_text("import gc\n\nfrom invoke import task\n\n\n@task\ndef hello(c):\n    pass\n\n\n"
                                       "gc.freeze()\ngc.enable()\n")
        held_run = ("import gc\ngc.disable()\nfrom invoke.main import program\n"
                    f"program.run(['invoke', '--search-root', {str(held)!r}, '--list'])\n")
        rows = [
            ("hpccm --recipe R --format singularity (reference)", [str(hpccm), "--recipe", str(recipe),
                                                                   "--format", "singularity"]),
            (FLOOR, [py, "-m", "invoke", "--search-root", str(floor), "--list"]),
            (HELD_FLOOR, [py, "-c", held_run]),
            ("python -c pass", [py, "-c", "pass"]),
            ("invoke --list", [py, "-m", "shipyard", "--list"]),
            ("invoke render --all", [py, "-m", "shipyard", "render", "--all"]),
            ("invoke check", [py, "-m", "shipyard", "check"]),
            ("invoke launch --dry-run -- examples/train.py",
             [py, "-m", "shipyard", "launch", "--dry-run", "--", "examples/train.py"]),
        ]
        rows += [(f"invoke {name} --help", [py, "-m", "shipyard", name, "--help"]) for name in helps]
        if args.no_reference:
            rows = rows[1:]
        commands = [r for r in rows if r[0].startswith("invoke ") and r[0] != "invoke --list" and "floor" not in r[0]
                    and not r[0].endswith(" --help")]
        envs = {label: env for label, _ in rows}
        if args.before:
            before_env = dict(env, PYTHONPATH=str(Path(args.before).resolve()))
            for label, cmd in commands:
                rows.append((f"{label} (before)", cmd))
                envs[f"{label} (before)"] = before_env
        for label, cmd in rows:  # warm-up: bytecode caches, the first render's writes
            cpu_seconds(cmd, proj, envs[label])
        times: dict[str, list[float]] = {label: [] for label, _ in rows}
        for _ in range(args.runs):
            for label, cmd in rows:
                times[label].append(cpu_seconds(cmd, proj, envs[label]))
        if any((proj / "definitions" / p.name).read_bytes() != p.read_bytes() for p in (ROOT / "definitions").iterdir()):
            raise SystemExit("render --all changed definitions/ in the copy: the checkout's definitions are stale")
    med = {label: statistics.median(t) for label, t in times.items()}
    ref = med[FLOOR]
    paired = {label: statistics.median(t / f for t, f in zip(times[label], times[FLOOR])) for label in times}
    paired_held = {label: statistics.median(t / f for t, f in zip(times[label], times[HELD_FLOOR]))
                   for label in times}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"CPU time (user+sys) of each process, median of {args.runs} interleaved runs\n")
    print("| command | median CPU s | x invoke floor (medians) | x invoke floor (median per round) "
          "| x held floor (median per round) |")
    print("|---|---|---|---|---|")
    for label, _ in rows:
        print(f"| {label} | {med[label]:.3f} | {med[label] / ref:.2f} | {paired[label]:.2f} | "
              f"{paired_held[label]:.2f} |")
    if helps:
        ratios = {label: paired[label] for label, _ in rows if label.endswith(" --help")}
        worst = max(ratios, key=ratios.get)
        print(f"\n{len(ratios)} tasks' --help: median {statistics.median(ratios.values()):.2f}x the floor, "
              f"highest {ratios[worst]:.2f}x ({worst})")
    Path(args.json).write_text(json.dumps({"runs": args.runs, "times": times, "median": med,
                                           "ratio": {k: v / ref for k, v in med.items()}, "paired_ratio": paired,
                                           "paired_ratio_held_floor": paired_held},
                                          indent=1))


if __name__ == "__main__":
    main()
