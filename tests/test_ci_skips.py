"""With CI=true an unexpected skip fails the run; one listed in the allowed list (with its reason) does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parent

SAMPLE = """
import pytest

def test_ok():
    pass

def test_skips():
    pytest.skip("needs something this runner lacks")
"""


def run(tmp_path: Path, ci: str | None, allowed: list) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "allowed.yaml").write_text(yaml.safe_dump(allowed))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update({"SHIPYARD_ALLOWED_SKIPS": str(tmp_path / "allowed.yaml"),
                "PYTHONPATH": os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])})
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "ci_skips",
                           "--rootdir", str(tmp_path), "test_sample.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)


def test_the_shipped_list_is_well_formed():
    for entry in yaml.safe_load((TESTS / "allowed_skips.yaml").read_text()) or []:
        assert set(entry) == {"test", "reason"} and entry["reason"].strip()


@pytest.mark.parametrize("ci, allowed, code", [
    (None, [], 0),  # locally a skip stays a skip
    ("true", [], 1),  # in CI it fails the run, naming the test
    ("true", [{"test": "test_sample.py::test_sk*", "reason": "the sample's runner lacks it"}], 0),
])
def test_an_unexpected_skip_fails_in_ci(tmp_path, ci, allowed, code):
    res = run(tmp_path, ci, allowed)
    assert res.returncode == code, res.stdout + res.stderr
    assert "1 passed, 1 skipped" in res.stdout
    if code:
        assert "test_sample.py::test_skips: needs something this runner lacks" in res.stdout
