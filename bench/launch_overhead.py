"""Launch overhead on the sandbox: submit -> training start for the generated 2-node launcher, against a hand-written
minimal reference sbatch running the same torchrun command (goal: ratio <= 1.1).

"Training start" is the moment the last of the 4 ranks (2 nodes x 2 processes) has started its Python script: each
rank writes time.time() first thing. Runs alternate reference/generated so that load drift hits both alike, and each
submission waits until the queue is empty and every node is idle again (a node still COMPLETING the previous job
would delay only the next one), so both sides are timed from the same state. The generated launcher is written by
`invoke launch`, as a user writes it.

    SHIPYARD_SANDBOX_DIR=/tmp/sbx python bench/launch_overhead.py [--rounds 5]

Uses a running sandbox in $SHIPYARD_SANDBOX_DIR, or starts one in a temp dir and stops it afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from launch_generation import machine  # noqa: E402

START = """\
import os, sys, time
t = time.time()
with open(os.path.join(sys.argv[1], f"{os.environ['SLURM_JOB_ID']}.{os.environ['RANK']}"), "w") as fh:
    fh.write(repr(t))
"""

REFERENCE = """\
#!/bin/bash
#SBATCH --job-name=reference
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=2
#SBATCH --output={log}
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
addr=$(scontrol show node "$head" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
srun torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint="$addr:29500" \\
  --rdzv-id="$SLURM_JOB_ID" {start} {out}
"""


def run_one(sb, directory, script: Path, out: Path) -> float:
    from shipyard.errors import ShipyardError

    t0 = time.time()
    res = sb.run_client(["sbatch", "--parsable", str(script)], directory, capture_output=True, text=True)
    if res.returncode:
        raise ShipyardError(f"sbatch {script}: {res.stderr.strip()}")
    job = res.stdout.strip()
    deadline = time.time() + 300
    while time.time() < deadline:
        files = list(out.glob(f"{job}.*"))
        if len(files) == 4:
            time.sleep(0.2)
            return max(float(f.read_text()) for f in files) - t0
        time.sleep(0.05)
    raise RuntimeError(f"job {job} did not start 4 ranks in 300 s")


def wait_idle(sb, directory, timeout: float = 300) -> None:
    """Until no job is queued and every node reports the state ``idle`` (not mixed, allocated or completing)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        queue = sb.run_client(["squeue", "-h"], directory, capture_output=True, text=True).stdout.strip()
        states = sb.run_client(["sinfo", "-h", "-N", "-o", "%T"], directory, capture_output=True, text=True).stdout
        if not queue and states.split() and all(s == "idle" for s in states.split()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the sandbox's nodes were not idle within {timeout:.0f} s")


@contextlib.contextmanager
def bench_sandbox() -> Iterator[Path]:
    """The sandbox a bench runs on: the one $SHIPYARD_SANDBOX_DIR names (left running, as found), else a new one in
    a temporary folder, stopped at the end. The variable names it for the bench's own commands too."""
    from shipyard import registry
    from shipyard import sandbox as sb

    preset = os.environ.get(sb.DIR_ENV)
    directory = Path(preset) if preset else Path(tempfile.mkdtemp(prefix="shipyard-bench-"))
    directory.chmod(0o755)
    started = not sb.is_up(directory)
    os.environ[sb.DIR_ENV] = str(directory)
    try:
        sb.up(directory=directory, cluster=registry.load(ROOT / "registry.yaml").sandbox_cluster())
        yield directory
    finally:
        if started:
            sb.down(directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    rounds = ap.parse_args().rounds
    from shipyard import sandbox as sb

    project = Path(tempfile.mkdtemp(prefix="shipyard-launch-bench-"))
    try:
        with bench_sandbox() as directory:
            (project / "registry.yaml").write_text((ROOT / "registry.yaml").read_text())
            (project / "start.py").write_text(START)
            out = project / "out"
            out.mkdir()
            (project / "launch" / "logs").mkdir(parents=True)
            shutil.copytree(ROOT / "definitions", project / "definitions")  # the environments' locks
            subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "launch", "--cluster", "sandbox",
                            "--nodes", "2", "--name", "generated", "--", str(project / "start.py"), str(out)],
                           check=True, cwd=project, capture_output=True,
                           env={**os.environ, "SHIPYARD_REGISTRY": str(project / "registry.yaml")})
            gen = project / "launch" / "generated.sbatch"
            ref = project / "launch" / "reference.sbatch"
            ref.write_text(REFERENCE.format(log=project / "launch" / "logs" / "reference-%j.out",
                                            start=project / "start.py", out=out))
            times: dict[str, list[float]] = {"reference": [], "generated": []}
            os.chdir(project)
            for _ in range(rounds):
                for name, script in (("reference", ref), ("generated", gen)):
                    wait_idle(sb, directory)
                    times[name].append(run_one(sb, directory, script, out))
            wait_idle(sb, directory)
    finally:
        shutil.rmtree(project, ignore_errors=True)
    r, g = statistics.median(times["reference"]), statistics.median(times["generated"])
    print(f"machine: {machine()}\n{rounds} rounds, alternating; submit -> all 4 ranks started\n")
    print("| launcher | median s | min s | max s | x reference |\n|---|---|---|---|---|")
    for name, m in (("hand-written minimal sbatch (baseline)", r), ("shipyard launch, host runtime", g)):
        ts = times["reference" if m is r else "generated"]
        print(f"| {name} | {m:.2f} | {min(ts):.2f} | {max(ts):.2f} | {m / r:.2f} |")


if __name__ == "__main__":
    main()
