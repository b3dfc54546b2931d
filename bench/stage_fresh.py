"""A fresh `invoke stage` of a 2 GiB image (nothing staged yet), against `cp` + `sync` + `openssl dgst -sha256` of
the copy in the same rounds.

Goal: <= 0.8x the baseline. The baseline is what staging did when it copied, then read the copy again to hash it;
`invoke stage` hashes the bytes as it copies them, fsyncs, and compares that hash with the source's manifest record,
so each byte is read once. Rounds are interleaved (stage, baseline, stage, ...) so the machine's load falls on both
alike; the page cache is dropped for the source before each run where the system allows (posix_fadvise DONTNEED),
as a compute or login node reading a freshly built image would. Only through the CLI, as a user runs it: the image
is a real SIF of the size asked, made by the real Apptainer (installed from ../shared/vendor and held for the run)
and recorded as `tiny`'s build (tests/fixtures_sif.py).
With ``--before DIR`` (a folder holding another version's ``shipyard/`` package, e.g. from
``git archive REV shipyard | tar -x -C DIR``) the stage also runs with that package, in the same rounds.

Usage: python bench/stage_fresh.py [--runs N] [--size-gib G] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import fixtures_sif as fs  # noqa: E402
from stage_noop import project  # noqa: E402  (bench/ is the script's folder on sys.path)


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(argv: list[str], env: dict, cwd: Path, source: Path) -> float:
    drop_cache(source)
    t = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True, cwd=cwd)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--before", help="folder with an older shipyard/ package to stage with in the same rounds")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, fs.held_apptainer() as bindir:
        tmp = Path(tmp)
        root, env = project(tmp, bindir)
        images = tmp / "images"
        from shipyard import registry

        made = fs.sized_sif(bindir, tmp / "image.sif", int(args.size_gib * 2**30), tmp)
        fs.record_build(registry.load(root / "registry.yaml"), "tiny", made)  # copied to containers/tiny.sif
        made.unlink()
        sif = root / "containers" / "tiny.sif"
        copy = tmp / "copy" / "tiny.sif"
        copy.parent.mkdir()
        # `python -m shipyard`: the same program and tasks as `invoke`, with the package PYTHONPATH names first
        stage = [sys.executable, "-m", "shipyard", "stage", "tiny", "--cluster", "lab"]
        baseline = ["bash", "-c", f"cp {sif} {copy} && sync && openssl dgst -sha256 -r {copy} >/dev/null"]
        commands = {"invoke stage tiny --cluster lab (fresh)": (stage, env),
                    "cp + sync + openssl dgst -sha256 of the copy (baseline)": (baseline, env)}
        if args.before:
            before = dict(env, PYTHONPATH=os.pathsep.join([str(Path(args.before).resolve()), str(REPO)]))
            commands["invoke stage tiny --cluster lab (fresh), --before package"] = (stage, before)
        rows: dict[str, list[float]] = {what: [] for what in commands}
        for _ in range(args.runs):
            for what, (argv, e) in commands.items():
                for p in images.iterdir():  # nothing staged: each run is a fresh stage
                    p.unlink() if p.is_file() or p.is_symlink() else shutil.rmtree(p)
                copy.unlink(missing_ok=True)
                rows[what].append(timed(argv, e, root, sif))
        med = {what: statistics.median(times) for what, times in rows.items()}
        base = med["cp + sync + openssl dgst -sha256 of the copy (baseline)"]
        print(f"image {args.size_gib:g} GiB, median of {args.runs} interleaved runs, source page cache dropped")
        print("| command | median s | x baseline |")
        print("|---|---|---|")
        for what, m in med.items():
            print(f"| {what} | {m:.3f} | {m / base:.2f} |")


if __name__ == "__main__":
    main()
