"""The sandbox's submit -> allocation wait: how long a one-node batch job waits in the queue of an idle sandbox
before slurmctld allocates its node (goal: median <= 0.5 s).

Each job is `sbatch --parsable` of a one-line script that writes `date +%s.%N` first thing. Two figures per job:
- submit -> allocation: slurmctld's own log lines for the job (`_slurm_rpc_submit_batch_job: JobId=N`, then
  `sched: Allocate JobId=N` from the main scheduler or `sched/backfill: _start_job: Started JobId=N` from the
  backfill scheduler; millisecond timestamps), so neither the client's start nor the job's launch counts;
- submit -> script start: from just before `sbatch` runs to the script's first line, the wait a user sees.
Before each job the queue is empty and every node idle (as in launch_overhead.py), so each job meets the same state,
and then the script waits a part of a second (seeded, spread evenly over the jobs): slurmctld 22.05 schedules batch
jobs in its background loop, once a second, and a job submitted right after the previous one's end would always meet
that loop at the same phase (a user's submission meets it at any).

    SHIPYARD_SANDBOX_DIR=/tmp/sbx python bench/submit_wait.py [--jobs 9]

Uses a running sandbox in $SHIPYARD_SANDBOX_DIR, or starts one in a temporary folder and stops it afterwards. Run as
root, as the sandbox needs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from launch_generation import machine  # noqa: E402
from launch_overhead import bench_sandbox, wait_idle  # noqa: E402

SCRIPT = "#!/bin/sh\n#SBATCH --nodes=1 --ntasks=1 --output=/dev/null\ndate +%s.%N > {out}/$SLURM_JOB_ID\n"
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] (.*)$")


def log_times(log: Path, job: str) -> tuple[float | None, float | None]:
    """(submitted, allocated) of ``job`` from slurmctld's log, as epoch seconds (the log's local time)."""
    submitted = allocated = None
    for line in log.read_text(errors="replace").splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        when, what = m.groups()
        if re.search(rf"_slurm_rpc_submit_batch_job: JobId={job}\b", what):
            submitted = datetime.datetime.fromisoformat(when).timestamp()
        elif re.search(rf"^sched: Allocate JobId={job}\b|^sched/backfill: _start_job: Started JobId={job}\b", what):
            allocated = datetime.datetime.fromisoformat(when).timestamp()
    return submitted, allocated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=9)
    jobs = ap.parse_args().jobs
    from shipyard import sandbox as sb

    work = Path(tempfile.mkdtemp(prefix="shipyard-submit-bench-"))
    work.chmod(0o755)
    alloc: list[float] = []
    start: list[float] = []
    try:
        with bench_sandbox() as directory:
            log = directory / "log" / "slurmctld.log"
            out = work / "out"
            out.mkdir(mode=0o777)
            out.chmod(0o777)
            script = work / "job.sh"
            script.write_text(SCRIPT.format(out=out))
            phases = [(i + 0.5) / jobs for i in range(jobs)]
            random.Random(36).shuffle(phases)
            for phase in phases:
                wait_idle(sb, directory)
                time.sleep(phase)
                t0 = time.time()
                res = sb.run_client(["sbatch", "--parsable", str(script)], directory, capture_output=True, text=True,
                                    cwd=work)
                if res.returncode:
                    raise SystemExit(f"sbatch: {res.stderr.strip()}")
                job = res.stdout.strip().split(";")[0]
                deadline = time.time() + 120
                while not (out / job).is_file() or not (out / job).read_text().strip():
                    if time.time() > deadline:
                        raise SystemExit(f"job {job} did not start in 120 s")
                    time.sleep(0.02)
                start.append(float((out / job).read_text()) - t0)
                for _ in range(100):  # slurmctld may write its log line after the job started
                    submitted, allocated = log_times(log, job)
                    if submitted is not None and allocated is not None:
                        break
                    time.sleep(0.05)
                if submitted is None or allocated is None:
                    raise SystemExit(f"job {job}: no submit or allocate line in {log}")
                alloc.append(allocated - submitted)
            wait_idle(sb, directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"machine: {machine()}\n{jobs} one-node batch jobs, each on an idle sandbox\n")
    print("| interval | median s | min s | max s |\n|---|---|---|---|")
    for name, ts in (("submit -> allocation (slurmctld's log)", alloc), ("submit -> script start (sbatch call to the "
                                                                         "script's first line)", start)):
        print(f"| {name} | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} |")


if __name__ == "__main__":
    main()
