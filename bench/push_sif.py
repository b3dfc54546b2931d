"""Push of a 1 GiB SIF to a local OCI registry: throughput as a ratio of `cp` of the same file on the same disk,
and peak memory of the pushing process. Goals: >= 0.3x cp, <= 150 MB peak (a multi-GB image streams from the file to
the socket and never passes through Python's memory).

Everything runs in one temp directory (one disk): the SIF (a real SIF made with mksquashfs + siftool around 1 GiB
of random data), the cp copy, and the registry's storage. Each push runs in a child process so its peak RSS
(ru_maxrss) is its own. Also measured, for reference: the oras library's own chunked push of the same file.
Usage: python bench/push_sif.py [--size-mib N] [--repeat N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.append(str(REPO / "tests"))  # tests/services.py: the OCI registry the tests start

from build_noop import machine  # noqa: E402
from services import OciRegistry  # noqa: E402

CHILD_SHIPYARD = """
import sys, hashlib
from pathlib import Path
from shipyard.containers import push
from shipyard.registry import model
target = model.RegistryTarget("bench", "oras://" + sys.argv[1] + "/bench", insecure=True)
sif = Path(sys.argv[2])
push.push_sif(target, sys.argv[4], sif, sys.argv[3], "v1", {}, None)
"""
CHILD_ORAS = """
import sys
import oras.client
c = oras.client.OrasClient(hostname=sys.argv[1], insecure=True)
c.push(files=[sys.argv[2] + ":application/vnd.sylabs.sif.layer.v1.sif"], target=sys.argv[1] + "/bench/" + sys.argv[3] + ":v1",
       disable_path_validation=True, do_chunked=True)
"""
CHILD_IDLE = "import shipyard.containers.push, oras.provider, requests"


def child(code: str, *args: str) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of a Python child running ``code``. Peak RSS comes from GNU time (%M), which
    forks from a small process: a child forked from this benchmark would count our own pages until it execs."""
    t = time.perf_counter()
    res = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-c", code, *args],
                         capture_output=True, text=True)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"child failed: {res.stderr[-2000:]}")
    kb = int(res.stderr.strip().splitlines()[-1].split("=", 1)[1])
    return wall, kb / 1024


def curl_patch(address: str, sif: Path, repo: str) -> float:
    """What the registry itself can take in: curl streams the whole file in one PATCH to a fresh upload session."""
    import urllib.request

    req = urllib.request.Request(f"http://{address}/v2/bench/{repo}/blobs/uploads/", method="POST", data=b"")
    with urllib.request.urlopen(req) as r:
        location = r.headers["Location"]
    t = time.perf_counter()
    subprocess.run(["curl", "-sf", "-o", "/dev/null", "-X", "PATCH", "-H", "Content-Type: application/octet-stream",
                    "-T", str(sif), location], check=True)
    return time.perf_counter() - t


def make_sif(work: Path, size: int) -> Path:
    rootfs = work / "rootfs"
    rootfs.mkdir()
    with open(rootfs / "weights.bin", "wb") as fh:
        left = size
        while left:
            n = min(left, 64 << 20)
            fh.write(os.urandom(n))
            left -= n
    subprocess.run(["mksquashfs", str(rootfs), str(work / "fs.sqfs"), "-noappend", "-all-root", "-quiet",
                    "-noI", "-noD", "-noF", "-noX"], check=True)
    shutil.rmtree(rootfs)
    sif = work / "big.sif"
    (work / "def.txt").write_text("Bootstrap: docker\nFrom: scratch\n")
    subprocess.run(["siftool", "new", str(sif)], check=True)
    subprocess.run(["siftool", "add", str(sif), str(work / "def.txt"), "--datatype", "1"], check=True)
    subprocess.run(["siftool", "add", str(sif), str(work / "fs.sqfs"), "--datatype", "4", "--parttype", "2",
                    "--partfs", "1", "--partarch", "2"], check=True)
    (work / "fs.sqfs").unlink()
    return sif


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="where push_sif.json goes")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shipyard-bench-push-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    reg = OciRegistry(work / "registry").start()
    try:
        sif = make_sif(work, args.size_mib << 20)
        size = sif.stat().st_size
        from shipyard.files import sha256_file

        sha = sha256_file(sif)  # also warms the page cache for cp and push alike
        def cp() -> float:
            t = time.perf_counter()
            subprocess.run(["cp", str(sif), str(work / "copy.sif")], check=True)
            subprocess.run(["sync"], check=True)
            took = time.perf_counter() - t
            (work / "copy.sif").unlink()
            return took

        # each method twice, alternating, after a sync (so one's writeback does not land on the next); median of 2
        runs: dict[str, list] = {"cp": [], "curl": [], "shipyard": [], "oras": []}
        idle_s, idle_mb = child(CHILD_IDLE)
        for i in range(args.repeat):
            subprocess.run(["sync"], check=True)
            runs["cp"].append(cp())
            runs["curl"].append(curl_patch(reg.address, sif, f"curl{i}"))
            subprocess.run(["sync"], check=True)
            runs["shipyard"].append(child(CHILD_SHIPYARD, reg.address, str(sif), sha, f"shipyard{i}"))
            subprocess.run(["sync"], check=True)
            runs["oras"].append(child(CHILD_ORAS, reg.address, str(sif), f"oras{i}"))
            subprocess.run(["sync"], check=True)
        cp_s = statistics.median(runs["cp"])
        curl_s = statistics.median(runs["curl"])
        push_s = statistics.median(r[0] for r in runs["shipyard"])
        push_mb = max(r[1] for r in runs["shipyard"])
        oras_s = statistics.median(r[0] for r in runs["oras"])
        oras_mb = max(r[1] for r in runs["oras"])
        mbps = lambda s: round(size / s / 1e6, 1)  # noqa: E731
        report = {
            "machine": machine(), "size_bytes": size,
            "cp": {"seconds": round(cp_s, 2), "MB_per_s": mbps(cp_s)},
            "shipyard push (streamed chunked upload + manifest read-back)": {
                "seconds": round(push_s, 2), "MB_per_s": mbps(push_s), "peak_rss_MB": round(push_mb, 1),
                "ratio_to_cp": round(cp_s / push_s, 2)},
            "curl: one streamed PATCH of the file (registry ingest ceiling)": {
                "seconds": round(curl_s, 2), "MB_per_s": mbps(curl_s), "ratio_to_cp": round(cp_s / curl_s, 2)},
            "shipyard push / curl PATCH": round(curl_s / push_s, 2),
            "oras library chunked push (reference)": {
                "seconds": round(oras_s, 2), "MB_per_s": mbps(oras_s), "peak_rss_MB": round(oras_mb, 1),
                "ratio_to_cp": round(cp_s / oras_s, 2)},
            "python importing shipyard.push (memory floor)": {"peak_rss_MB": round(idle_mb, 1)},
            "goals": "ratio_to_cp >= 0.3; peak_rss_MB <= 150", "repeat": args.repeat,
            "load_average_after": os.getloadavg(),
        }
    finally:
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "push_sif.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
