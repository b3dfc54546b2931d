"""Benchmark of the local Slurm sandbox: `sandbox.up` time, `srun -N2` latency and the demo job's wall time.

Run as root on Debian/Ubuntu:  python bench/sandbox_bench.py [--repeat 3] [--steps 60] [--out DIR]

Baseline, measured in the same run: the demo's training (examples/train.py, same steps, 4 processes) run by a plain
local ``torchrun --standalone`` without Slurm. Every figure is reported in seconds and as a ratio to that baseline,
so results from different machines compare. Prints a Markdown table for bench/README.md and writes sandbox.json to
--out (default bench/out). The demo job runs from a copy of the project in a temporary folder, so its launcher and
log never land in the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shipyard import registry  # noqa: E402
from shipyard.commands import demo  # noqa: E402
from shipyard import sandbox as sb  # noqa: E402


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
    return f"nproc {os.cpu_count()}, RAM {mem_kb / 2**20:.1f} GiB, CPU {cpu}"


def baseline(steps: int, workdir: Path) -> float:
    """The same training without Slurm: one local torchrun, 4 processes."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                    str(ROOT / "examples" / "train.py"), "--steps", str(steps), "--checkpoint",
                    str(workdir / "baseline.pt")], check=True, capture_output=True)
    return time.monotonic() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="up/down cycles and demo jobs to measure (default 3)")
    p.add_argument("--steps", type=int, default=60, help="training steps of the demo job (default 60)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="where sandbox.json goes")
    args = p.parse_args()
    reason = sb.cannot_run_reason()
    if reason:
        print(f"bench: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="shipyard-bench-"))
    work.chmod(0o755)
    project = work / "project"  # the demo writes launch/shipyard-demo.sbatch and its log into the project
    (project / "examples").mkdir(parents=True)
    shutil.copy2(ROOT / "registry.yaml", project / "registry.yaml")
    shutil.copy2(ROOT / "examples" / "train.py", project / "examples" / "train.py")
    shutil.copytree(ROOT / "definitions", project / "definitions")  # the environments' locks
    reg = registry.load(project / "registry.yaml")
    directory = work / "sandbox"
    sb.ensure_packages(install=True)
    base = statistics.median(baseline(args.steps, work) for _ in range(args.repeat))
    ups, sruns, jobs = [], [], []
    try:
        for i in range(args.repeat):
            info = sb.up(directory=directory, cluster=reg.sandbox_cluster())
            ups.append(info["seconds"])
            t0 = time.monotonic()
            res = sb.run_client(["srun", "-N2", "hostname"], directory, capture_output=True, text=True)
            sruns.append(time.monotonic() - t0)
            assert res.returncode == 0, res.stderr
            job = demo.run_job(reg, info, steps=args.steps)
            assert job["state"] == "COMPLETED" and job["result"]["world_size"] == 4, job
            jobs.append(job["seconds"])
            if i < args.repeat - 1:
                sb.down(directory)
    finally:
        sb.down(directory)
        shutil.rmtree(work, ignore_errors=True)  # the project copy, the baseline's checkpoint; down() removed the sandbox
    med = {"up_s": statistics.median(ups), "srun_N2_s": statistics.median(sruns),
           "demo_job_s": statistics.median(jobs), "baseline_local_torchrun_s": base}
    out = {"machine": machine(), "repeat": args.repeat, "steps": args.steps, "median": med,
           "runs": {"up_s": ups, "srun_N2_s": sruns, "demo_job_s": jobs}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sandbox.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"Machine: {out['machine']}; median of {args.repeat} runs; demo training {args.steps} steps.\n")
    print("| measure | seconds | ratio to baseline |\n|---|---|---|")
    rows = [("baseline: local `torchrun --standalone`, 4 procs, no Slurm", base),
            ("`sandbox.up`: packages installed -> every node idle", med["up_s"]),
            ("`srun -N2 hostname` from the host", med["srun_N2_s"]),
            ("demo job: 2 nodes x 2 procs, sbatch -> COMPLETED", med["demo_job_s"])]
    for name, v in rows:
        print(f"| {name} | {v:.2f} | {v / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
