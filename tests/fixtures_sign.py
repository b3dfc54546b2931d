"""Helpers of the signing tests: a real SIF file (built with siftool + mksquashfs, no apptainer), the keys of the
double's throw-away keyring. The sign_project fixture is in tests/containers/conftest.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SIGN_DOUBLE = Path(__file__).resolve().parent / "doubles" / "apptainer"
KEYS = [
    {"user": "Course Staff (gpu-course) <staff@example.org>", "fingerprint": "8232570480B868E1473AEEB03DBCBA1EE9D661E5"},
    {"user": "Teaching Assistant <ta@example.org>", "fingerprint": "65833F473098C6215E750B3BDFD69E5CEE85D448"},
]


@dataclass
class SignProject:
    root: Path
    registry: Path
    image: Path
    keyring: Path
    log: Path

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line)["argv"] for line in self.log.read_text().splitlines()]


def make_sif(path: Path, payload: str = "hello") -> Path:
    """A real SIF file with one squashfs partition (siftool/mksquashfs), so the double's SIF-header check is real."""
    for tool in ("siftool", "mksquashfs"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is required (apt-get install siftool squashfs-tools)")
    work = path.parent / (path.name + ".work")
    (work / "root").mkdir(parents=True)
    (work / "root" / "payload").write_text(payload)
    subprocess.run(["mksquashfs", str(work / "root"), str(work / "fs.sqfs"), "-noappend", "-all-root", "-quiet"],
                   check=True, capture_output=True)
    subprocess.run(["siftool", "new", str(path)], check=True, capture_output=True)
    subprocess.run(["siftool", "add", str(path), str(work / "fs.sqfs"), "--datatype", "4", "--parttype", "2",
                    "--partfs", "1", "--partarch", "2"], check=True, capture_output=True)
    shutil.rmtree(work)
    return path
