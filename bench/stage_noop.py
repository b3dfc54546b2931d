"""No-op `invoke stage` (an identical image already staged) with a 2 GiB image, against `invoke --list` in the same
run.

Goal (issue 11): <= 0.3 s including interpreter start, independent of the image's size: the no-op path stats the
image and reads its small record, never the image. The image is built through the strict apptainer double
(tests/doubles/apptainer), grown sparsely to 2 GiB, re-recorded, and staged once with --link (a copy of a sparse
file would write 2 GiB). Usage: python bench/stage_noop.py [--runs N]
"""

from __future__ import annotations

import argparse
import io
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

from shipyard import registry  # noqa: E402
from shipyard.containers import common, engine  # noqa: E402
from shipyard.commands import stage as stage_commands  # noqa: E402
from shipyard.commands.context import Context  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--size-gib", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "PATH": f"{fb.APPTAINER_DOUBLE}:{os.environ['PATH']}", "APPTAINER_TMPDIR": str(tmp),
               "APPTAINER_CACHEDIR": str(tmp / "cache"), "PYTHONPATH": str(REPO)}
        os.environ.update(env)
        root = fb.make_project(tmp / "proj")
        (tmp / "images").mkdir()
        text = (root / "registry.yaml").read_text()
        (root / "registry.yaml").write_text(text.replace("clusters:\n", "clusters:\n" + CLUSTER.replace(
            "STORAGE", str(tmp / "images"))))
        env["SHIPYARD_REGISTRY"] = str(root / "registry.yaml")
        # as on a user's machine: bytecode caches on (this workplace sets PYTHONDONTWRITEBYTECODE, which would make
        # every run recompile shipyard and its generated schema validator from source)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        reg = registry.load(root / "registry.yaml")
        engine.build(reg, reg.environment("tiny"), quiet=True, out=io.StringIO())
        sif = root / "containers" / "tiny.sif"
        head = sif.read_bytes()
        with open(sif, "r+b") as fh:
            fh.truncate(int(args.size_gib * 2**30))
            fh.seek(0)
            fh.write(head)
        common.record_artifact(reg, "tiny", "sif")
        stage_commands.stage(Context(reg, out=io.StringIO()), "tiny", "lab", link=True)
        py = sys.executable
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
