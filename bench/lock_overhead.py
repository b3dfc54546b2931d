"""shipyard's own part of `invoke lock`, apart from uv's: the whole command as a user runs it, the same command with
a uv stand-in that prints uv's recorded answer at once, and uv alone with the same command line, in the same rounds.

Rows (wall time, interpreter start included, each a fresh process):
- `invoke lock ENV` with the real uv (its cache warm): what a user waits for;
- `invoke lock ENV` with the stand-in (a `uv` package ahead of the real one on PYTHONPATH whose `find_uv_bin()`
  names a script that prints uv's recorded output): shipyard's own part, with nothing left of uv but one `cat`;
- uv alone: `uv pip compile` with the very command line, environment and inputs shipyard gives it (uv's part);
- invoke's floor: `invoke --list` of a one-task tasks.py (as in start_time.py).
The stand-in's answer is recorded from the real uv first, so both locks and the re-rendered definitions are the same
(the script checks). The commands run in a temporary copy of registry.yaml and definitions/, with the cut-off of the
environment's existing lock, interleaved round after round; the figure is the median. uv reads PyPI (or the index
its variables name), so the uv rows move with the network; the stand-in row does not.

With ``--before DIR`` (a folder holding another version's ``shipyard/`` package, e.g. from
``git archive REV shipyard | tar -x -C DIR``) the stand-in row also runs with that package, in the same rounds.

    python bench/lock_overhead.py [ENV] [--runs 7] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from launch_generation import machine  # noqa: E402

from shipyard import registry  # noqa: E402
from shipyard.definitions import pylock  # noqa: E402


def timed(argv: list[str], cwd: Path, env: dict) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({res.returncode}): {res.stderr[-800:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("env", nargs="?", default="pytorch-2.3")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--before", help="folder with an older shipyard/ package, timed with the stand-in too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shipyard-lock-bench-") as tmp:
        tmp = Path(tmp)
        proj = tmp / "project"
        proj.mkdir()
        shutil.copy(ROOT / "registry.yaml", proj / "registry.yaml")
        shutil.copytree(ROOT / "definitions", proj / "definitions")
        env = registry.load(proj / "registry.yaml").environment(args.env)
        lock_file = proj / "definitions" / f"{env.name}.lock"
        cutoff = pylock.read_header(lock_file)["exclude-newer"]
        index = pylock.index_from(None)
        # uv alone: shipyard's command line, environment and inputs, in a folder of their own
        uv_dir = tmp / "uv"
        uv_dir.mkdir()
        (uv_dir / "requirements.in").write_text("\n".join(pylock.lock_inputs(env)) + "\n")
        if pylock.lock_overrides(env):
            (uv_dir / "overrides.txt").write_text("\n".join(pylock.lock_overrides(env)) + "\n")
        uv_argv = pylock.uv_argv(pylock._uv_bin(), env, cutoff)
        uv_env = pylock.uv_environ(env, index)
        answer = subprocess.run(uv_argv, cwd=uv_dir, env=uv_env, capture_output=True, text=True, check=True).stdout
        # the stand-in: a `uv` package ahead of the real one whose binary prints the recorded answer
        standin = tmp / "standin"
        (standin / "uv").mkdir(parents=True)
        (tmp / "answer.txt").write_text(answer)
        script = tmp / "uv-standin"
        script.write_text(f"#!/bin/sh\nexec cat {tmp / 'answer.txt'}\n")
        script.chmod(0o755)
        (standin / "uv" / "__init__.py").write_text(f"def find_uv_bin():\n    return {str(script)!r}\n")
        floor = tmp / "floor"
        floor.mkdir()
        (floor / "tasks.py").write_text("from invoke import task\n\n\n@task\ndef hello(c):\n    pass\n")

        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "SHIPYARD_REGISTRY")}
        real_env = dict(base, PYTHONPATH=str(ROOT))
        standin_env = dict(base, PYTHONPATH=os.pathsep.join([str(standin), str(ROOT)]))
        lock_cmd = [sys.executable, "-m", "shipyard", "lock", env.name]
        rows = {
            "invoke lock, real uv (cache warm)": (lock_cmd, proj, real_env),
            "invoke lock, uv stand-in (shipyard's own part)": (lock_cmd, proj, standin_env),
            "uv pip compile alone (uv's part)": (uv_argv, uv_dir, uv_env),
            "invoke --list of a one-task tasks.py (invoke's floor)": (
                [sys.executable, "-m", "invoke", "--search-root", str(floor), "--list"], proj, real_env),
        }
        if args.before:
            rows["invoke lock, uv stand-in, --before package"] = (lock_cmd, proj, dict(
                base, PYTHONPATH=os.pathsep.join([str(standin), str(Path(args.before).resolve())])))
        for argv, cwd, e in rows.values():  # warm-up: uv's cache, bytecode, the first lock's writes
            timed(argv, cwd, e)
        after_real = lock_file.read_bytes()
        timed(lock_cmd, proj, standin_env)
        if lock_file.read_bytes() != after_real:
            raise SystemExit("the stand-in's lock differs from the real uv's: the recorded answer is not uv's")
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.runs):
            for name, (argv, cwd, e) in rows.items():
                times[name].append(timed(argv, cwd, e))
    med = {name: statistics.median(t) for name, t in times.items()}
    whole, own, uv = (med["invoke lock, real uv (cache warm)"], med["invoke lock, uv stand-in (shipyard's own part)"],
                      med["uv pip compile alone (uv's part)"])
    floor_s = med["invoke --list of a one-task tasks.py (invoke's floor)"]
    print(f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}")
    print(f"environment {env.name}, exclude-newer {cutoff}; wall time, median of {args.runs} interleaved rounds\n")
    print("| command | median s | min s | max s | x invoke floor |\n|---|---|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {med[name]:.3f} | {min(ts):.3f} | {max(ts):.3f} | {med[name] / floor_s:.2f} |")
    print(f"\nshipyard's own part: {own:.3f} s with the stand-in; whole lock minus uv alone: {whole - uv:.3f} s; "
          f"uv's share of the whole lock: {uv / whole:.0%}")


if __name__ == "__main__":
    main()
