"""Cost of the cluster-facing tools, as ratios against baselines measured in the same run.

    python bench/tools_bench.py            # nccl-report and usage only
    python bench/tools_bench.py --scale 0.01 --runs 1   # a quick check that it runs (smaller inputs)
    python bench/tools_bench.py --sandbox  # also status and doctor against the local Slurm sandbox (starts one
                                           # in $SHIPYARD_SANDBOX_DIR or a temp dir, stops it if it started it)

* nccl-report parsing of a large interleaved log, against reading and splitting the same text (the least any parser
  does), plus `invoke nccl-report` (parse + PNG) against `invoke --list` (interpreter + invoke + tasks.py).
* usage of a long 8-GPU sample file, against csv.reader over the same file.
* status / doctor on the sandbox, against the bare Slurm client calls they wrap (squeue + sacct -c; srun -N1 true).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shipyard.jobs import nccl_report, usage  # noqa: E402

RUNS = 5
SCALE = 1.0  # --scale: the share of the full input sizes (300 nccl tests, 24 h of samples)


def median_s(fn, runs: int | None = None) -> float:
    times = []
    for _ in range(runs or RUNS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def machine() -> str:
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    mem = int(next(l.split()[1] for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")))
    return f"{cpu}, nproc {os.cpu_count()}, RAM {mem / 1024 / 1024:.1f} GiB, Python {platform.python_version()}"


def row(name: str, s: float, base: float) -> str:
    return f"| {name} | {s:.4f} | {s / base:.2f} |"


def bench_nccl(tmp: Path) -> list[str]:
    one = (ROOT / "tests" / "data" / "nccl" / "all_reduce_efa_2x8.log").read_text()
    tests = max(1, round(300 * SCALE))
    big = one * tests  # 300 tests in one log: ~20k lines, with every kind of interleaving the sample has
    log = tmp / "big.log"
    log.write_text(big)
    lines = big.count("\n")
    base = median_s(lambda: log.read_text().splitlines())
    parse = median_s(lambda: nccl_report.parse_file(log))
    out = [f"nccl-tests log: {lines} lines, {len(big) / 1e6:.1f} MB, {tests} tests", "",
           "| step | median s | x baseline |", "|---|---|---|",
           row("read + splitlines (baseline)", base, base), row("nccl_report.parse_file", parse, base)]
    small = ROOT / "tests" / "data" / "nccl" / "all_reduce_efa_2x8.log"
    cli = [sys.executable, "-m", "invoke", "-r", str(ROOT)]
    b2 = median_s(lambda: subprocess.run(cli + ["--list"], capture_output=True, check=True, cwd=ROOT))
    t2 = median_s(lambda: subprocess.run(cli + ["nccl-report", str(small), "--cluster", "aws-pcluster", "--out",
                                                str(tmp / "x.png")], capture_output=True, check=True, cwd=ROOT))
    out += ["", "| command (interpreter start included) | median s | x invoke --list |", "|---|---|---|",
            row("invoke --list (baseline)", b2, b2), row("invoke nccl-report (32 sizes, table + PNG)", t2, b2)]
    return out


def bench_usage(tmp: Path) -> list[str]:
    path = tmp / "long-77.usage.n1.csv"
    rows = [usage.HEADER]
    for i in range(max(1, round(17280 * SCALE))):  # 24 h at 5 s, 8 GPUs per sample: 138k rows
        ts = f"2026-11-29T{(i * 5) // 3600 % 24:02d}:{(i * 5) // 60 % 60:02d}:{i * 5 % 60:02d}Z"
        for g in range(8):
            rows.append([ts, "n1", "55.0", "20000", "515000", str(g), "90", "70000", "81559"])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.write_text(buf.getvalue())
    base = median_s(lambda: list(csv.reader(io.StringIO(path.read_text()))), min(3, RUNS))
    parse = median_s(lambda: usage.load_job(tmp, "77"), min(3, RUNS))
    return [f"usage CSV: {len(rows) - 1} rows (24 h at 5 s, 8 GPUs), {path.stat().st_size / 1e6:.1f} MB", "",
            "| step | median s | x baseline |", "|---|---|---|",
            row("csv.reader over the file (baseline)", base, base), row("usage.load_job", parse, base)]


def bench_sandbox() -> list[str]:
    from shipyard import registry, sandbox

    started = False
    if not os.environ.get(sandbox.DIR_ENV):
        d = tempfile.mkdtemp(prefix="shipyard-bench-sandbox-")
        os.chmod(d, 0o755)
        os.environ[sandbox.DIR_ENV] = d
    if not sandbox.is_up():
        sandbox.up(cluster=registry.load(ROOT / "registry.yaml").sandbox_cluster())
        started = True
    try:
        env = sandbox.client_env()
        cli = [sys.executable, "-m", "invoke", "-r", str(ROOT)]

        def raw(argv):
            subprocess.run(sandbox.client_argv(argv), env=env, capture_output=True, check=True)

        base_status = median_s(lambda: (raw(["squeue", "--user=root", "--states=all", "--noheader"]),
                                        raw(["sacct", "-c", "--noheader", "--starttime=now-2days"])))
        status = median_s(lambda: subprocess.run(cli + ["status", "--cluster", "sandbox"], capture_output=True,
                                                 check=True, cwd=ROOT))
        base_doc = median_s(lambda: raw(["srun", "-N1", "-n1", "true"]))
        doc = median_s(lambda: subprocess.run(cli + ["doctor", "--cluster", "sandbox"], capture_output=True,
                                              cwd=ROOT))
        return ["| command | median s | x its bare Slurm calls |", "|---|---|---|",
                row("squeue + sacct -c (baseline of status)", base_status, base_status),
                row("invoke status --cluster sandbox", status, base_status),
                row("srun -N1 -n1 true (baseline of doctor)", base_doc, base_doc),
                row("invoke doctor --cluster sandbox", doc, base_doc)]
    finally:
        if started:
            sandbox.down()


def main() -> None:
    global RUNS, SCALE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sandbox", action="store_true", help="also status and doctor against the local Slurm sandbox")
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--scale", type=float, default=SCALE, help="share of the full input sizes (default 1)")
    args = ap.parse_args()
    RUNS, SCALE = args.runs, args.scale
    print(f"machine: {machine()}; median of {RUNS} runs unless noted\n")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        print("\n".join(bench_nccl(tmp)) + "\n")
        print("\n".join(bench_usage(tmp)) + "\n")
    if args.sandbox:
        print("\n".join(bench_sandbox()))


if __name__ == "__main__":
    main()
