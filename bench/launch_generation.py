"""Generation time of `invoke launch --dry-run` (goal: <= 0.5 s, interpreter start included).

Baselines measured in the same run: `python -c pass` (interpreter start) and `invoke --list` (interpreter + invoke +
tasks.py import). Prints a Markdown table for bench/README.md.

    python bench/launch_generation.py [--runs 9]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal")) / 2**20
    return f"{cpu}, nproc {os.cpu_count()}, RAM {mem:.1f} GiB, Python {platform.python_version()}"


def timed(argv: list[str], runs: int) -> float:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    runs = ap.parse_args().runs
    inv = [sys.executable, "-m", "invoke"]
    cases = [
        ("python -c pass (baseline)", [sys.executable, "-c", "pass"]),
        ("invoke --list (baseline)", [*inv, "--list"]),
        ("invoke launch --dry-run, 2 nodes, host (sandbox)",
         [*inv, "launch", "--dry-run", "--nodes", "2", "--", "examples/train.py", "--steps", "60"]),
        # --image: no image is staged for grete or aws-pcluster on this machine (the binding check would refuse)
        ("invoke launch --dry-run, 2 nodes, apptainer/ib (grete), --monitor --requeue --image",
         [*inv, "launch", "--dry-run", "--cluster", "grete", "--nodes", "2", "--monitor", "--requeue", "--image",
          "/scratch/projects/shipyard/images/pytorch-2.3.sif", "--", "examples/train.py"]),
        ("invoke nccl-test --dry-run, 2 nodes, pyxis/efa (aws-pcluster) --image --image-has-nccl-tests",
         [*inv, "nccl-test", "--dry-run", "--cluster", "aws-pcluster", "--nodes", "2", "--image",
          "/fsx/shipyard/images/pytorch-2.3.sqsh", "--image-has-nccl-tests"]),
    ]
    print(f"machine: {machine()}\nmedian of {runs} runs, interpreter start included\n")
    print("| command | median s | x invoke --list |\n|---|---|---|")
    results = [(name, timed(argv, runs)) for name, argv in cases]
    base = results[1][1]
    for name, t in results:
        print(f"| {name} | {t:.3f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
