"""Benchmark `invoke lock`: uv's resolution of an environment's closure against pip's resolver, same run, same inputs.

Baseline: ``pip install --dry-run --report`` for the same requirements, target platform and Python (with
``--use-feature=fast-deps`` so pip reads wheel metadata by HTTP range request instead of downloading ~800 MB of
torch). Measured: shipyard's lock (``shipyard.definitions.pylock.compile_lock``) with uv's cache warm, and with ``--no-cache``
semantics (a fresh UV_CACHE_DIR per run). Both resolve against live PyPI; read the ratios, not the seconds.

    python bench/bench_lock.py [ENV] [--runs N] [--no-baseline]   (--no-baseline: uv only, for a quick check)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shipyard import registry  # noqa: E402
from shipyard.definitions import pylock as lock  # noqa: E402

CUTOFF = "2026-11-01T00:00:00Z"


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    mem = next((int(ln.split()[1]) for ln in open("/proc/meminfo") if ln.startswith("MemTotal")), 0)
    return f"{model}, nproc {os.cpu_count()}, RAM {mem / 2**20:.1f} GiB, {platform.platform()}, Python {platform.python_version()}"


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pip_baseline(env) -> int:
    reqs = lock.lock_inputs(env)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        penv = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        penv["PIP_CONFIG_FILE"] = os.devnull
        plats = []
        for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"):
            plats += ["--platform", tag]
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--target", str(Path(tmp) / "t"), "--report", str(report), "--use-feature=fast-deps",
                        "--python-version", str(env.python.value), *plats, "--only-binary=:all:", *reqs],
                       check=True, env=penv, capture_output=True)
        return len(json.loads(report.read_text())["install"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("env", nargs="?", default="pytorch-2.3")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-baseline", action="store_true", help="skip pip's resolver (about a minute); ratios then read 'n/a'")
    args = ap.parse_args()
    env = registry.load(ROOT / "registry.yaml").environment(args.env)

    rows = []
    n_pip = 0

    def base():
        nonlocal n_pip
        n_pip = pip_baseline(env)

    t_pip = None
    if not args.no_baseline:
        t_pip = timed(base)
        rows.append(("pip resolver, fast-deps (baseline)", [t_pip], n_pip))

    lock.compile_lock(env, CUTOFF)  # warm uv's cache
    warm = []
    text = ""
    for _ in range(args.runs):
        def run():
            nonlocal text
            text = lock.compile_lock(env, CUTOFF)
        warm.append(timed(run))
    rows.append(("invoke lock, uv cache warm", warm, lock.count_pins(text)[0]))

    cold = []
    for _ in range(max(1, args.runs // 2)):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["UV_CACHE_DIR"] = cache
            try:
                cold.append(timed(lambda: lock.compile_lock(env, CUTOFF)))
            finally:
                del os.environ["UV_CACHE_DIR"]
    rows.append(("invoke lock, empty uv cache", cold, lock.count_pins(text)[0]))

    print(f"machine: {machine()}")
    print(f"environment {env.name}: {', '.join(lock.lock_inputs(env))}; exclude-newer {CUTOFF}\n")
    print("| resolver | runs | median s | x baseline | packages |")
    print("|---|---|---|---|---|")
    for name, times, n in rows:
        med = statistics.median(times)
        ratio = f"{med / t_pip:.3f}" if t_pip else "n/a"
        print(f"| {name} | {len(times)} | {med:.2f} | {ratio} | {n} |")
    print(f"\npeak RSS of any child process (pip or uv): {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
