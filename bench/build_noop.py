"""No-op `invoke build` (cache hit) with a 2 GiB artifact present, against baselines measured in the same run.

Goal (issue 5): <= 0.3 s including interpreter start, independent of artifact size. The build tool is the
strict apptainer double (tests/doubles/apptainer): the no-op path runs `apptainer --version` once for the cache
key, like the real tool. Usage: python bench/build_noop.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import fixtures_build as fb  # noqa: E402

from shipyard import build as b  # noqa: E402
from shipyard import registry  # noqa: E402


def timed(argv, env, runs: int) -> float:
    """Median wall time of ``runs`` runs (after one warm-up), in seconds."""
    subprocess.run(argv, env=env, check=True, capture_output=True)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def project_with_artifact(base: Path, size: int, env: dict) -> Path:
    root = fb.make_project(base)
    os.environ.update(env)
    reg = registry.load(root / "registry.yaml")
    b.build(reg, reg.environment("tiny"), quiet=True)
    sif = root / "containers" / "tiny.sif"
    head = sif.read_bytes()
    with open(sif, "r+b") as fh:  # keep the SIF header, grow it sparsely to the size under test
        fh.truncate(size)
        fh.seek(0)
        fh.write(head)
    b.record_artifact(reg, "tiny", "sif")
    return root


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) / 2**20
    return {"nproc": os.cpu_count(), "ram_gib": round(mem, 1), "cpu": cpu, "python": platform.python_version()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shipyard-bench-"))
    env = {**os.environ, "PATH": f"{fb.APPTAINER_DOUBLE}{os.pathsep}{os.environ['PATH']}",
           "APPTAINER_TMPDIR": str(tmp), "APPTAINER_CACHEDIR": str(tmp)}
    big = project_with_artifact(tmp / "big", 2 << 30, env)
    small = project_with_artifact(tmp / "small", 1 << 20, env)
    build = fb.invoke_argv("build", "tiny")
    res = {
        "python -c pass": timed([sys.executable, "-c", "pass"], env, args.runs),
        "invoke --list (CLI start)": timed(fb.invoke_argv("--list"), env, args.runs),
        "no-op build, 1 MiB artifact": timed(build, {**env, "SHIPYARD_REGISTRY": str(small / "registry.yaml")},
                                             args.runs),
        "no-op build, 2 GiB artifact": timed(build, {**env, "SHIPYARD_REGISTRY": str(big / "registry.yaml")},
                                             args.runs),
    }
    out = subprocess.run(build, env={**env, "SHIPYARD_REGISTRY": str(big / "registry.yaml")}, capture_output=True,
                         text=True).stdout
    assert "up to date" in out, out  # it really was the cache hit
    noop = res["no-op build, 2 GiB artifact"]
    report = {"machine": machine(), "median_s": {k: round(v, 3) for k, v in res.items()},
              "ratios": {"2 GiB / 1 MiB artifact": round(noop / res["no-op build, 1 MiB artifact"], 2),
                         "no-op build / python -c pass": round(noop / res["python -c pass"], 2),
                         "no-op build / invoke --list": round(noop / res["invoke --list (CLI start)"], 2)},
              "goal": "no-op build <= 0.3 s; 2 GiB / 1 MiB ratio ~ 1", "runs": args.runs}
    (REPO / "bench" / "out").mkdir(exist_ok=True)
    (REPO / "bench" / "out" / "build_noop.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
