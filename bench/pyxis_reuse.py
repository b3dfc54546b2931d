"""Benchmark of pyxis start-up reuse (issue 18 point 7) with the REAL pyxis + enroot in the running sandbox.

Run as root with the sandbox up:  python bench/pyxis_reuse.py [--size-mib 512] [--repeat 3] [--sources DIR]

A SquashFS image of --size-mib (incompressible data, stored uncompressed) is made with mksquashfs. Per round, three
2-node jobs: ``srun -N2 true`` with no container (baseline: Slurm's own start-up), then the same step with
``--container-image=IMG --container-name=NAME`` twice, as two separate jobs (a chained segment): the first unpacks the
image on each node, the second finds the named container. Container setup = step time - baseline. Goal: the second
segment's setup <= 0.3 x the first's. Prints a Markdown table for bench/README.md.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shipyard import sandbox as sb  # noqa: E402
from shipyard.sandbox import runtimes  # noqa: E402


def timed(argv, directory) -> float:
    t0 = time.monotonic()
    res = sb.run_client(argv, directory, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {res.stderr.strip()[-500:]}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sources", default=None, help="enroot/pyxis archives (default ../shared/vendor)")
    a = ap.parse_args()
    directory = sb.default_directory()
    if not sb.is_up(directory):
        raise SystemExit(f"the sandbox in {directory} is down: invoke sandbox.up first")
    note = runtimes.tests_left_out_line(ROOT) if a.sources is None else None
    if note:
        print(f"pyxis_reuse: {note}")
        return 1 if os.environ.get("CI", "").lower() in ("true", "1") else 0
    before = sb.plugstack(directory)
    try:
        info = sb.install_runtimes(a.sources or runtimes.test_sources(ROOT), directory)
        with tempfile.TemporaryDirectory(prefix="pyxis-reuse-") as tmp:
            os.chmod(tmp, 0o755)
            rootfs = Path(tmp) / "rootfs"
            (rootfs / "bin").mkdir(parents=True)
            for d in ("etc", "tmp", "proc", "sys", "dev", "root", "data"):
                (rootfs / d).mkdir()
            subprocess.run(["cp", "/bin/busybox", str(rootfs / "bin")], check=True)
            (rootfs / "bin" / "true").symlink_to("busybox")
            (rootfs / "bin" / "sh").symlink_to("busybox")
            with open(rootfs / "data" / "blob", "wb") as fh:
                for _ in range(a.size_mib):
                    fh.write(os.urandom(1 << 20))
            img = Path(tmp) / "img.sqsh"
            subprocess.run(["mksquashfs", str(rootfs), str(img), "-noappend", "-quiet", "-noD", "-all-root"],
                           check=True, stdout=subprocess.DEVNULL)
            img.chmod(0o644)
            rows = []
            for r in range(a.repeat):
                name = f"bench-{os.getpid()}-{r}"
                base = timed(["srun", "-N2", "--ntasks-per-node=1", "true"], directory)
                step = ["srun", "-N2", "--ntasks-per-node=1", f"--container-image={img}", f"--container-name={name}",
                        "true"]
                first = timed(step, directory)
                second = timed(step, directory)
                rows.append((base, first, second))
                for node in ("node1", "node2"):  # drop the named containers again
                    for p in (runtimes.node_dir(directory, node) / "enroot" / "data").glob(f"pyxis_{name}"):
                        subprocess.run(["rm", "-rf", "--one-file-system", str(p)], check=False)
    finally:
        sb.restore_plugstack(before, directory)
    base = statistics.median(r[0] for r in rows)
    first = statistics.median(r[1] for r in rows)
    second = statistics.median(r[2] for r in rows)
    s1, s2 = max(first - base, 1e-3), max(second - base, 0.0)
    print(f"pyxis_reuse: real pyxis {info['pyxis']} + enroot {info['enroot']}, Slurm {info['slurm']}; image {a.size_mib} MiB; "
          f"median of {len(rows)} rounds, 2 nodes")
    print("\n| step | median s | container setup s |\n|---|---|---|")
    print(f"| srun -N2 true (baseline) | {base:.2f} | - |")
    print(f"| first segment (unpack) | {first:.2f} | {s1:.2f} |")
    print(f"| second segment (--container-name reused) | {second:.2f} | {s2:.2f} |")
    print(f"\nratio second/first container setup: {s2 / s1:.2f} (goal <= 0.3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
