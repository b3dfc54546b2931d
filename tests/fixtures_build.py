"""A throw-away shipyard project for the build/push tests, and the strict enroot test double on PATH (the apptainer
double is test_course_path's, for a base no registry here serves)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


HERE = Path(__file__).parent
APPTAINER_DOUBLE = HERE / "doubles" / "apptainer"
ENROOT_DOUBLE = HERE / "doubles" / "enroot"

# Environments the build tests use. `tiny` builds offline FROM the fixture base image (tests/containers/fixtures_docker.py),
# whose python/torch/CUDA/NCCL facts match these pins; `tiny-mismatch` pins a torch that base does not carry, so its
# %test must fail.
PROJECT_REGISTRY = """\
environments:
  tiny:
    description: stack base on the local fixture image; shipyard installs nothing, %test verifies the pins
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: ubuntu22.04
    stack: base
    base: shipyard-test/base:1
    torchvision: false
    torchaudio: false
    env:
      OMP_NUM_THREADS: "1"
  tiny-mismatch:
    extends: tiny
    torch: "2.3.0"
  pytorch-2.3:
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: ubuntu22.04
clusters:
  sandbox:
    local_sandbox: true
    runtime: host
    fabric: socket
    gpus_per_node: 0
    scheduler:
      partition: debug
      build_partition: debug
      build_time: "00:05:00"
      build_cpus: 1
      build_mem: 500M
    storage: .sandbox/images
registries:
  local:
    uri: oras://{registry}/shipyard
    insecure: true
  local-docker:
    uri: docker://{registry}/shipyard
    insecure: true
  signed-only:
    uri: oras://{registry}/signed
    insecure: true
    require_signed: true
defaults:
  environment: tiny
  cluster: sandbox
  registry: local
"""


def build_project_at(root: Path, registry_address: str = "127.0.0.1:9") -> Path:
    """A folder holding the build preset at a given registry address (tests that push to a real registry); the
    ``make_project`` fixture (fixtures_projects.py) is the factory for everything else."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "registry.yaml").write_text(PROJECT_REGISTRY.format(registry=registry_address))
    return root


@pytest.fixture
def project(make_project, monkeypatch):
    """``make_project("build")`` in use, without the host's build network settings (see no_build_network)."""
    reg = make_project("build")
    no_build_network(monkeypatch)
    return reg


def no_build_network(monkeypatch) -> None:
    """Builds take the host's CA bundle and proxy variables (shipyard/containers/buildnet.py); tests that are not
    about them start without any, so a machine's settings (this one has SSL_CERT_FILE) do not change their calls."""
    from shipyard.containers import buildnet  # lazy: keeps this fixture module's imports light

    for var in buildnet.CA_VARS + buildnet.PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)


@pytest.fixture
def enroot_double(monkeypatch):
    monkeypatch.setenv("PATH", f"{ENROOT_DOUBLE}{os.pathsep}{os.environ['PATH']}")
    return ENROOT_DOUBLE / "enroot"


def read_calls(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
