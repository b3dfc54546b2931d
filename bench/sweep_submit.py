"""Writing and submitting a large sweep on the sandbox: `invoke launch --sweep-file (N rows) --submit` against a
single `invoke launch --submit` measured in the same run (goal: one sbatch call per array, time <= 2x the single).

Both are the whole command as a user runs it (a fresh `python -m invoke` process: start-up, the registry, writing
the launcher and, for the sweep, the combination table and N run directory names, then sbatch). The jobs are
submitted with ``--sbatch begin=now+1hours`` so that they stay pending (1,000 tasks never run on 2 nodes) and are
cancelled after each round; runs alternate single/sweep so that load drift hits both alike. The sbatch calls are
counted by an ``sbatch`` shim ahead of the real one on PATH (it appends a line to a file, then execs Slurm's).

    SHIPYARD_SANDBOX_DIR=/tmp/sbx python bench/sweep_submit.py [--runs 5] [--combinations 1000] [--max-array-size N]

Uses a running sandbox in $SHIPYARD_SANDBOX_DIR, or starts one in a temp dir and stops it afterwards.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from launch_generation import machine  # noqa: E402
from launch_overhead import bench_sandbox  # noqa: E402

SHIM = """#!/bin/sh
echo "$*" >> {calls}
exec {real} "$@"
"""


def timed(argv: list[str], cwd: Path, env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
    return dt, res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--combinations", type=int, default=1000)
    ap.add_argument("--max-array-size", type=int, help="scheduler.max_array_size in the registry (default: the "
                    "sandbox's MaxArraySize, Slurm's 1001): smaller splits the sweep into several arrays")
    args = ap.parse_args()
    from shipyard import sandbox as sb

    project = Path(tempfile.mkdtemp(prefix="shipyard-sweep-bench-"))
    times: dict[str, list[float]] = {"single": [], "sweep": []}
    calls: dict[str, list[int]] = {"single": [], "sweep": []}
    arrays: list[int] = []
    try:
        with bench_sandbox() as directory:
            text = (ROOT / "registry.yaml").read_text()
            if args.max_array_size:
                text = text.replace("      partitions: [debug]\n",
                                    f"      partitions: [debug]\n      max_array_size: {args.max_array_size}\n", 1)
            (project / "registry.yaml").write_text(text)
            shutil.copytree(ROOT / "definitions", project / "definitions")  # the environments' locks
            (project / "train.py").write_text("import sys; print(sys.argv)\n")
            table = project / "combos.tsv"
            table.write_text("lr\tseed\n" + "".join(f"{10 ** -(1 + i % 5):g}\t{i}\n" for i in range(args.combinations)))
            shim_dir = project / "shim"
            shim_dir.mkdir()
            log = project / "sbatch-calls"
            real = shutil.which("sbatch")
            if real is None:
                raise RuntimeError("sbatch is not on PATH")
            (shim_dir / "sbatch").write_text(SHIM.format(calls=log, real=real))
            (shim_dir / "sbatch").chmod(0o755)
            env = {**os.environ, "SHIPYARD_REGISTRY": str(project / "registry.yaml"), sb.DIR_ENV: str(directory),
                   "PATH": f"{shim_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
            base = [sys.executable, "-m", "invoke", "-r", str(ROOT), "launch", "--cluster", "sandbox",
                    "--gpus-per-node", "1", "--sbatch", "begin=now+1hours", "--submit"]
            argvs = {"single": [*base, "--name", "single", "--", "train.py"],
                     "sweep": [*base, "--name", "sweep", "--sweep-file", str(table), "--", "train.py"]}
            for _ in range(args.runs):
                for name in ("single", "sweep"):
                    log.write_text("")
                    dt, out = timed(argvs[name], project, env)
                    times[name].append(dt)
                    calls[name].append(len(log.read_text().splitlines()))
                    m = re.search(r"as job array\(s\) ([\d, ]+)", out) if name == "sweep" else None
                    ids = [i.strip() for i in m.group(1).split(",")] if m else re.findall(r"\b(\d+)\b", out)[-1:]
                    if name == "sweep":
                        arrays.append(len(ids))
                    sb.run_client(["scancel", *ids], directory, capture_output=True)
                    # no finished combination: all submitted again
                    shutil.rmtree(project / "launch", ignore_errors=True)
    finally:
        shutil.rmtree(project, ignore_errors=True)
    s, w = statistics.median(times["single"]), statistics.median(times["sweep"])
    split = f", max_array_size {args.max_array_size}" if args.max_array_size else ""
    print(f"machine: {machine()}\n{args.runs} runs, alternating; whole command (python -m invoke ... --submit)\n")
    print("| command | median s | min s | max s | sbatch calls | x single |\n|---|---|---|---|---|---|")
    print(f"| invoke launch --submit, one job (baseline) | {s:.2f} | {min(times['single']):.2f} | "
          f"{max(times['single']):.2f} | {max(calls['single'])} | 1.00 |")
    print(f"| invoke launch --sweep-file ({args.combinations} combinations{split}) --submit | {w:.2f} | "
          f"{min(times['sweep']):.2f} | {max(times['sweep']):.2f} | {max(calls['sweep'])} | {w / s:.2f} |")
    print(f"\narrays per sweep: {sorted(set(arrays))}; sbatch calls per sweep: {sorted(set(calls['sweep']))}")
    if calls["sweep"] != arrays:
        raise SystemExit(f"sbatch calls {calls['sweep']} differ from the arrays submitted {arrays}")


if __name__ == "__main__":
    main()
