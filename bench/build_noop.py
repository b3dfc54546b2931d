"""No-op `invoke build` (cache hit) with a 2 GiB artifact present, against baselines measured in the same run.

Only through the CLI, as a user runs it, with the real Apptainer (installed from ../shared/vendor and held for the
run): `tiny`'s image is a real SIF of the size asked (random bytes stored uncompressed) recorded as its build
(tests/fixtures_sif.py), and the timed `invoke build tiny` finds it current, so it stats a large file it never reads.
Usage: python bench/build_noop.py [--runs N] [--size-mib N] [--out DIR]
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import fixtures_build as fb  # noqa: E402
import fixtures_sif as fs  # noqa: E402

INVOKE = [sys.executable, "-m", "invoke", "-r", str(REPO)]


def timed(argv, env, runs: int) -> float:
    """Median wall time of ``runs`` runs (after one warm-up), in seconds."""
    subprocess.run(argv, env=env, check=True, capture_output=True)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def project_with_artifact(base: Path, size: int, env: dict, bindir: Path) -> dict:
    """A project whose `tiny` SIF (a real SIF of ``size`` bytes, recorded as its build) is current. Returns the
    environment that points the CLI at it."""
    from shipyard import registry

    root = fb.build_project_at(base)
    penv = {**env, "SHIPYARD_REGISTRY": str(root / "registry.yaml")}
    sif = fs.sized_sif(bindir, base / "image.sif", size, base)
    fs.record_build(registry.load(root / "registry.yaml"), "tiny", sif)
    sif.unlink()
    return penv


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) / 2**20
    return {"nproc": os.cpu_count(), "ram_gib": round(mem, 1), "cpu": cpu, "python": platform.python_version()}


def measure(args, tmp: Path, env: dict, bindir: Path) -> dict[str, float]:
    """Median wall times of the baselines and of the no-op build with a 1 MiB and a large artifact."""
    big = project_with_artifact(tmp / "big", args.size_mib << 20, env, bindir)
    small = project_with_artifact(tmp / "small", 1 << 20, env, bindir)
    build = INVOKE + ["build", "tiny"]
    res = {
        "python -c pass": timed([sys.executable, "-c", "pass"], env, args.runs),
        "invoke --list (CLI start)": timed(INVOKE + ["--list"], env, args.runs),
        "no-op build, 1 MiB artifact": timed(build, small, args.runs),
        f"no-op build, {args.size_mib} MiB artifact": timed(build, big, args.runs),
    }
    for penv in (small, big):
        out = subprocess.run(build, env=penv, capture_output=True, text=True).stdout
        assert "up to date" in out, out  # it really was the cache hit, never a build
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--size-mib", type=int, default=2048, help="the large artifact's size (default 2 GiB)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="where build_noop.json goes")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shipyard-bench-"))
    try:
        with fs.held_apptainer() as bindir:
            os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ['PATH']}"  # recording asks its version
            env = {**os.environ, "APPTAINER_TMPDIR": str(tmp), "APPTAINER_CACHEDIR": str(tmp)}
            res = measure(args, tmp, env, bindir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    large = f"no-op build, {args.size_mib} MiB artifact"
    noop = res[large]
    report = {"machine": machine(), "median_s": {k: round(v, 3) for k, v in res.items()},
              "ratios": {f"{args.size_mib} MiB / 1 MiB artifact": round(noop / res["no-op build, 1 MiB artifact"], 2),
                         "no-op build / python -c pass": round(noop / res["python -c pass"], 2),
                         "no-op build / invoke --list": round(noop / res["invoke --list (CLI start)"], 2)},
              "runs": args.runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "build_noop.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
