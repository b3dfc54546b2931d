"""No-op `invoke stage` (an identical image already staged) with a 2 GiB image, against `invoke --list` in the same
run.

Goal: <= 0.3 s including interpreter start, independent of the image's size: the no-op path stats the
image and reads its small record, never the image. Only through the CLI, as a user runs it: the image is a real
SIF of the size asked, made by the real Apptainer (installed from ../shared/vendor and held for the run) and recorded
as `tiny`'s build (tests/fixtures_sif.py), and is staged once with `invoke stage --link` (no second copy).
Usage: python bench/stage_noop.py [--runs N] [--size-gib G]
"""

from __future__ import annotations

import argparse
import os
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

CLUSTER = """\
  lab:
    runtime: apptainer
    fabric: ib
    gpus_per_node: 0
    scheduler: {partition: gpu}
    storage: STORAGE
"""


def timed(argv, env, runs: int, cwd: Path) -> float:
    subprocess.run(argv, env=env, check=True, capture_output=True, cwd=cwd)  # warm-up (bytecode caches)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True, cwd=cwd)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def project(tmp: Path, bindir: Path) -> tuple[Path, dict]:
    """A build project in ``tmp`` with the ``lab`` cluster (apptainer, storage ``tmp/images``), and the environment
    its commands run with: the real Apptainer first on PATH, its folders under ``tmp``."""
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "APPTAINER_TMPDIR": str(tmp),
           "APPTAINER_CACHEDIR": str(tmp / "cache"), "PYTHONPATH": str(REPO)}
    os.environ.update(env)
    root = fb.build_project_at(tmp / "proj")
    (tmp / "images").mkdir()
    text = (root / "registry.yaml").read_text()
    (root / "registry.yaml").write_text(text.replace("clusters:\n", "clusters:\n" + CLUSTER.replace(
        "STORAGE", str(tmp / "images"))))
    env["SHIPYARD_REGISTRY"] = str(root / "registry.yaml")
    # as on a user's machine: bytecode caches on (this workplace sets PYTHONDONTWRITEBYTECODE, which would make
    # every run recompile shipyard from source)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return root, env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--size-gib", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, fs.held_apptainer() as bindir:
        tmp = Path(tmp)
        root, env = project(tmp, bindir)
        py = sys.executable
        from shipyard import registry

        sif = fs.sized_sif(bindir, tmp / "image.sif", int(args.size_gib * 2**30), tmp)
        fs.record_build(registry.load(root / "registry.yaml"), "tiny", sif)
        sif.unlink()
        subprocess.run([py, "-m", "invoke", "-r", str(REPO), "stage", "tiny", "--cluster", "lab", "--link"],
                       check=True, capture_output=True, cwd=root, env=env)
        base = timed([py, "-m", "invoke", "-r", str(REPO), "--list"], env, args.runs, root)
        noop = timed([py, "-m", "invoke", "-r", str(REPO), "stage", "tiny", "--cluster", "lab", "--link"], env,
                     args.runs, root)
        print(f"image {args.size_gib:g} GiB, median of {args.runs} runs, interpreter start included")
        print("| command | median s | x invoke --list |")
        print("|---|---|---|")
        print(f"| invoke --list (baseline) | {base:.3f} | 1.00 |")
        print(f"| invoke stage tiny --cluster lab (identical image staged) | {noop:.3f} | {noop / base:.2f} |")


if __name__ == "__main__":
    main()
