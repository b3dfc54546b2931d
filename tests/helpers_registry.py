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


# Set by `python -m tests.update_golden`: where a differing output goes, beside (never over) its golden file.
ACTUAL_ENV = "SHIPYARD_GOLDEN_ACTUAL"


def golden(path: Path, text: str) -> None:
    """Assert that ``text`` is the golden file ``path``. Never writes the golden file: when it differs and
    `python -m tests.update_golden` runs the tests, the actual text is left in that command's folder for it to show
    as a diff (and to copy over the golden file only with --accept)."""
    if (not path.exists() or path.read_text() != text) and os.environ.get(ACTUAL_ENV):
        actual = Path(os.environ[ACTUAL_ENV]) / path.resolve().relative_to(GOLDEN)
        actual.parent.mkdir(parents=True, exist_ok=True)
        actual.write_text(text)
    assert path.exists(), f"missing golden file {path}: `python -m tests.update_golden` shows it"
    assert text == path.read_text(), f"{path} differs: `python -m tests.update_golden` shows the diff"


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


def unrecorded_installer_warnings(problems) -> list:
    """The WARNs `check` gives for an EFA installer whose sha256 shipyard/data/fabrics.yaml does not record (the build
    refuses to unpack it): the shipped and example registries pin the current installer, and these go away, with
    nothing else to change, once its AWS-published sha256 is recorded."""
    from shipyard.registry import fabric_checks

    return [p for p in problems if p.severity == "WARN" and p.key.endswith(".fabric_options.efa_installer")
            and (m := re.match(r"no sha256 of EFA installer (\S+) ", p.message))
            and fabric_checks.efa_installer_sha256(m.group(1)) is None]
