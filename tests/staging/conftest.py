"""Fixtures of the staging tests: a project with apptainer and pyxis clusters whose storage is a directory of the
test, and `tiny` in its containers/ as a real SIF (made by the real Apptainer) with its build manifest."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest
from fixtures_build import PROJECT_REGISTRY, no_build_network
from fixtures_sif import record_build

from shipyard import registry

# The build tests' registry plus: an apptainer cluster whose storage is a directory of the test, one whose driver is
# too old for CUDA 12 (so environment x cluster fails `invoke check`), and an environment whose Python has no torch
# wheel (so the environment alone fails).
EXTRA_CLUSTERS = """\
  lab:
    runtime: apptainer
    fabric: ib
    gpus_per_node: 0
    scheduler: {partition: gpu, build_partition: gpu}
    storage: STORAGE
  lab-old:
    runtime: apptainer
    fabric: ib
    gpus_per_node: 4
    gpus: [{model: A100, arch: sm_80}]
    driver: "470.57.02"
    scheduler: {partition: gpu}
    storage: STORAGE
  lab-pyxis:
    runtime: pyxis
    fabric: ib
    gpus_per_node: 0
    scheduler: {partition: gpu}
    storage: STORAGE
"""
BAD_ENV = """\
  tiny-py313:
    extends: tiny
    python: "3.13"
"""


@pytest.fixture
def proj(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    root.mkdir()
    # the storage a course's students reach: outside pytest's own 0700 folder, so doctor, run as root, can read the
    # image as one of them (another uid) the way their jobs do
    storage = Path(tempfile.mkdtemp(prefix="shipyard-images-"))
    storage.chmod(0o755)
    text = PROJECT_REGISTRY.format(registry="127.0.0.1:9")
    text = text.replace("clusters:\n", "clusters:\n" + EXTRA_CLUSTERS.replace("STORAGE", str(storage)))
    text = text.replace("  pytorch-2.3:\n", BAD_ENV + "  pytorch-2.3:\n")
    (root / "registry.yaml").write_text(text)
    monkeypatch.chdir(root)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(root / "registry.yaml"))
    # stage and doctor verify an image once per file and cache it in the user's cache, as the job does: the test's own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    no_build_network(monkeypatch)  # the host's CA bundle and proxy are not what these tests are about
    yield registry.load(root / "registry.yaml")
    # rm, not shutil.rmtree: a test may leave a file where the folder was, and os.open patched until monkeypatch
    # undoes it after this
    subprocess.run(["rm", "-rf", "--", str(storage)], check=False)


@pytest.fixture
def built(proj, staging_sif, apptainer_on_path):
    """`tiny` in containers/: the busybox SIF (tests/fixtures_sif.py) recorded as its finished build. Staging needs
    an image and its manifest; the build of `tiny` itself is tested in tests/containers. The real Apptainer stays
    first on PATH, so a test can run the image it staged."""
    record_build(proj, "tiny", staging_sif)
    return proj
