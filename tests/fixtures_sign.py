"""Fixtures for the signing tests: a project directory with a real SIF file (built with siftool + mksquashfs, no
apptainer) and the strict apptainer *test double* first on PATH with a throw-away keyring."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SIGN_DOUBLE = Path(__file__).resolve().parent / "doubles" / "apptainer"
COURSE_REGISTRY = Path(__file__).resolve().parent.parent / "examples" / "course" / "registry.yaml"
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


@pytest.fixture
def sign_project(tmp_path, monkeypatch):
    root = tmp_path / "project"
    root.mkdir()
    reg = root / "registry.yaml"
    reg.write_text(COURSE_REGISTRY.read_text())
    (root / "containers").mkdir()
    image = make_sif(root / "containers" / "course.sif")
    keyring = tmp_path / "keyring.json"
    keyring.write_text(json.dumps({"secret": KEYS, "public": KEYS}))
    state = tmp_path / "double-state"
    state.mkdir()
    log = tmp_path / "apptainer-calls.jsonl"
    monkeypatch.setenv("PATH", f"{SIGN_DOUBLE}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_KEYRING", str(keyring))
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_STATE", str(state))
    monkeypatch.setenv("SHIPYARD_DOUBLE_CALLS", str(log))
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(reg))
    return SignProject(root, reg, image, keyring, log)
