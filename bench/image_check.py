"""The job's pre-srun image check on an image of a given size: the first job on a new image file verifies its sha256
with the launcher's own function (shipyard/launch/templates/sha256.sh: openssl, else Python's hashlib, else
sha256sum), measured against `openssl dgst -sha256` and `sha256sum` of the same file in the same rounds; every later
job only stats it and reads one cached line.

The image is real random data (a sparse file would hash from zeros in memory and flatter the first case); the page
cache is dropped for it before the cold run where the system allows (posix_fadvise DONTNEED), so "first job, cold"
reads the disk as a compute node reading a shared filesystem would (a network filesystem is slower still).
Usage: python bench/image_check.py [--size-gib G] [--runs N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from shipyard import identity


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None, help="directory for the image (default: a temporary one)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.out) as d:
        image = Path(d) / "image.sif"
        size = int(a.size_gib * (1 << 30))
        with open(image, "wb") as fh:
            left = size
            while left:
                chunk = os.urandom(min(left, 1 << 24))
                fh.write(chunk)
                left -= len(chunk)
        stat = f"stat -c '{identity.SHELL_STAT}' {image} | tr -d ."
        func = Path(__file__).resolve().parents[1] / "shipyard" / "launch" / "templates" / "sha256.sh"
        launcher = f". {func} && shipyard_sha256 {image}"
        openssl = f"openssl dgst -sha256 -r < {image} | cut -d' ' -f1"
        sha256sum = f"sha256sum < {image} | cut -d' ' -f1"
        cached = f"s=$({stat}); [ \"$(head -c 300 {d}/cache)\" = \"x $s\" ]"
        subprocess.run(["bash", "-c", f"printf 'x %s' \"$({stat})\" > {d}/cache"], check=True)

        def timed(cmd: str, cold: bool) -> float:
            if cold:
                fd = os.open(image, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            t = time.perf_counter()
            subprocess.run(["bash", "-c", cmd], check=True, capture_output=True)
            return time.perf_counter() - t

        got = {subprocess.run(["bash", "-c", c], check=True, capture_output=True, text=True).stdout.strip()
               for c in (launcher, openssl, sha256sum)}
        if len(got) != 1:
            raise SystemExit(f"the three ways disagree on the image's sha256: {got}")
        rows = {"first job on the file, cold cache: the launcher's check": [],
                "first job on the file, warm page cache: the launcher's check": [],
                "warm page cache: openssl dgst -sha256 (baseline)": [],
                "warm page cache: sha256sum": [],
                "every later job: stat + cached line": []}
        for _ in range(a.runs):  # interleaved: the machine's load falls on every row alike
            for (what, times), (cmd, cold) in zip(rows.items(), [(launcher, True), (launcher, False),
                                                               (openssl, False), (sha256sum, False),
                                                               (cached, False)]):
                times.append(timed(cmd, cold))
        med = {what: statistics.median(times) for what, times in rows.items()}
        base = med["warm page cache: openssl dgst -sha256 (baseline)"]
        print(f"image check, {a.size_gib:g} GiB image, {a.runs} run(s), median seconds, x openssl (warm)")
        for what, m in med.items():
            print(f"  {what:62s} {m:8.3f} {m / base:6.2f}x")


if __name__ == "__main__":
    main()
