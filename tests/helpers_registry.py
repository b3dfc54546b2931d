"""Small helpers shared by the registry/definition tests (not fixtures: plain functions)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "registry"
GOLDEN = Path(__file__).resolve().parent / "golden"


def golden(path: Path, text: str) -> None:
    """Compare with a golden file; SHIPYARD_UPDATE_GOLDEN=1 rewrites it instead."""
    if os.environ.get("SHIPYARD_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with SHIPYARD_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs (SHIPYARD_UPDATE_GOLDEN=1 to accept)"


def sections(def_text: str) -> dict[str, str]:
    """Split an Apptainer definition into {'header': ..., 'post': ..., ...}."""
    out: dict[str, list[str]] = {"header": []}
    cur = "header"
    for line in def_text.splitlines():
        m = re.match(r"^%(\w+)\s*$", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        else:
            out[cur].append(line)
    return {k: "\n".join(v) + "\n" for k, v in out.items()}


def shellcheck(script: str, shell: str = "sh") -> subprocess.CompletedProcess:
    exe = shutil.which("shellcheck")
    if not exe:
        pytest.fail("shellcheck is required (apt-get install shellcheck; `invoke test` installs it)")
    return subprocess.run([exe, "-S", "warning", "-s", shell, "-"], input=script, text=True, capture_output=True)
