"""Container start of one image on the sandbox's 2 nodes under every real runtime, as ratios in one run.

Run as root with the sandbox up:  python bench/container_start.py [--size-mib 256] [--repeat 3] [--sources DIR]

One root filesystem (static busybox and --size-mib of incompressible data) becomes a SquashFS file (mksquashfs, data
stored uncompressed) and a SIF (real Apptainer, the same mksquashfs options). Per round, each a 2-node step
(``srun -N2 --ntasks-per-node=1 ... true``):

* ``srun true`` with no container: Slurm's own start, the baseline subtracted from every other row;
* Apptainer: ``apptainer exec IMG.sif true`` (setuid mode, the kernel's squashfs mount);
* pyxis ``--container-image`` with no name: enroot unpacks the SquashFS on every node, every time;
* pyxis ``--container-name`` twice, as two jobs: the first unpacks, the second reuses the named container;
* pyxis with ``use_squashfuse=1`` in its plugstack line: the SquashFS mounted with squashfuse, no unpack;
* ch-run from the SquashFS (libsquashfuse) and from an unpacked folder.

Each start is `invoke doctor --time-start`'s (shipyard/jobs/start_time.py's start words), the command
``/bin/sh -c "exit 0"``.

Prints a Markdown table for bench/README.md: median seconds, container start (minus the baseline), and each row's
start over Apptainer's.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shipyard import sandbox as sb  # noqa: E402
from shipyard.jobs.start_time import start_words  # noqa: E402
from shipyard.sandbox import apptainer, runtimes  # noqa: E402

STEP = ["srun", "-N2", "--ntasks-per-node=1"]


def timed(argv, directory, env=None) -> float:
    t0 = time.monotonic()
    res = sb.run_client(argv, directory, capture_output=True, text=True, timeout=600, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))} failed: {(res.stderr or res.stdout).strip()[-800:]}")
    return time.monotonic() - t0


def make_images(tmp: Path, size_mib: int) -> tuple[Path, Path, Path]:
    """The root filesystem folder, its SquashFS and its SIF."""
    rootfs = tmp / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    for d in ("etc", "tmp", "proc", "sys", "dev", "root", "data", "home"):
        (rootfs / d).mkdir()
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    for tool in ("true", "sh"):  # sh: the start's command
        (rootfs / "bin" / tool).symlink_to("busybox")
    for f in ("passwd", "group", "hosts", "resolv.conf"):  # ch-run binds the host's over these; they must exist
        (rootfs / "etc" / f).touch()
    with open(rootfs / "data" / "blob", "wb") as fh:
        for _ in range(size_mib):
            fh.write(os.urandom(1 << 20))
    sqsh, sif = tmp / "img.sqsh", tmp / "img.sif"
    subprocess.run(["mksquashfs", str(rootfs), str(sqsh), "-noappend", "-quiet", "-noD", "-all-root"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([str(apptainer.bin_dir() / "apptainer"), "-q", "build", "--mksquashfs-args", "-noD", str(sif),
                    str(rootfs)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for p in (tmp, rootfs, sqsh, sif):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return rootfs, sqsh, sif


def drop_named(directory: Path, name: str) -> None:
    for node in ("node1", "node2"):
        for p in (runtimes.node_dir(directory, node) / "enroot" / "data").glob(f"pyxis_{name}"):
            subprocess.run(["rm", "-rf", "--one-file-system", str(p)], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sources", default=None, help="the runtimes' archives (default ../shared/vendor)")
    a = ap.parse_args()
    directory = sb.default_directory()
    if not sb.is_up(directory):
        raise SystemExit(f"the sandbox in {directory} is down: invoke sandbox.up first")
    note = runtimes.tests_left_out_line(ROOT) if a.sources is None else None
    if note:
        print(f"container_start: {note}")
        return 1 if os.environ.get("CI", "").lower() in ("true", "1") else 0
    before = sb.plugstack(directory)
    # the start words say `apptainer`: on the PATH the sandbox's clients (and so the steps) get from this process
    os.environ["PATH"] = f"{apptainer.bin_dir()}{os.pathsep}{os.environ['PATH']}"
    env = {**sb.client_env(directory), "USER": "root"}  # ch-run mounts under /var/tmp/$USER.ch; a service may start us without it
    rows: dict[str, list[float]] = {}

    def start(runtime: str, image: Path, container: str = "") -> float:
        return timed([*STEP, *start_words(runtime, str(image), container), "/bin/sh", "-c", "exit 0"], directory, env)

    try:
        info = sb.install_runtimes(a.sources or runtimes.test_sources(ROOT), directory)
        lib, args = runtimes.plugstack_entry(Path(info["build"]), directory)
        with tempfile.TemporaryDirectory(prefix="container-start-", dir="/var/tmp") as tmp:
            rootfs, sqsh, sif = make_images(Path(tmp), a.size_mib)
            for r in range(a.repeat):
                name = f"bench-{os.getpid()}-{r}"
                sb.set_plugstack([(lib, args)], directory, required=True)
                one = {
                    "srun -N2 true (baseline)": timed([*STEP, "true"], directory, env),
                    "apptainer exec IMG.sif": start("apptainer", sif),
                    "pyxis --container-image (unpack every time)": start("pyxis", sqsh),
                    "pyxis --container-name, first job (unpack)": start("pyxis", sqsh, name),
                    "pyxis --container-name, second job (reuse)": start("pyxis", sqsh, name),
                }
                drop_named(directory, name)
                sb.set_plugstack([(lib, [*args, "use_squashfuse=1"])], directory, required=True)
                one["pyxis use_squashfuse=1 (mounted, no unpack)"] = start("pyxis", sqsh)
                one["ch-run IMG.sqsh"] = start("charliecloud", sqsh)
                one["ch-run FOLDER"] = start("charliecloud", rootfs)
                for k, v in one.items():
                    rows.setdefault(k, []).append(v)
    finally:
        sb.restore_plugstack(before, directory)
    med = {k: statistics.median(v) for k, v in rows.items()}
    base = med.pop("srun -N2 true (baseline)")
    ref = max(med["apptainer exec IMG.sif"] - base, 1e-3)
    print(f"container_start: Apptainer {info['apptainer']}, pyxis {info['pyxis']} + enroot {info['enroot']}, "
          f"Slurm {info['slurm']}; image {a.size_mib} MiB; median of {a.repeat} rounds, 2 nodes")
    print("\n| step | median s | container start s | x Apptainer |\n|---|---|---|---|")
    print(f"| srun -N2 true (baseline) | {base:.2f} | - | - |")
    for k, v in med.items():
        start = max(v - base, 0.0)
        print(f"| {k} | {v:.2f} | {start:.2f} | {start / ref:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
