"""Fixtures of the containers tests only: the real dockerd + OCI registry (fixtures_docker.py), the proxy in front of
that registry (fixtures_push.py), the debootstrapped Debian base and the CONNECT proxy of the real-image build
(fixtures_debian.py), the signing project, and the nccl-tests pyxis run's image, built beside the real image. Every
docker fixture depends on docker_services, which tests/needs.py refuses to any test without the docker mark."""

from __future__ import annotations

import json
import os

import pytest
from fixtures_debian import connect_proxy, debian12_base  # noqa: F401  (fixtures)
from fixtures_docker import docker_env, docker_services, tiny_base  # noqa: F401  (fixtures)
from fixtures_push import registry_proxy  # noqa: F401  (fixtures)
from fixtures_sign import KEYS, SIGN_DOUBLE, SignProject, make_sif
from helpers_nccl_tests import build_beside

# Session fixtures that start work in a thread at the first containers test of a session in which some selected test
# uses them (the others never start them): see _start_early.
EARLY = ("nccl_tests_mpi_none_build",)


@pytest.fixture(scope="session")
def nccl_tests_mpi_none_build(docker_services, debian12_base, tmp_path_factory):
    """The nccl-tests pyxis run's image, building in a thread (a Future of its tag)."""
    return build_beside(docker_services, debian12_base, tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def _start_early(request):
    """CI's critical path is the real-runtime run of `invoke test`: the real image's test (mostly moving bytes, about
    half of the two cores) and the nccl-tests pyxis run (a CPU-bound compile) share its one process, because both
    need the one machine-wide enroot install. Starting the compile at the first containers test lets it run beside
    the real image instead of after it."""
    for name in EARLY:
        if any(name in item.fixturenames for item in request.session.items):
            request.getfixturevalue(name)


@pytest.fixture
def sign_project(make_project, tmp_path, monkeypatch):
    """The ``course`` preset with a real SIF in containers/, and the apptainer double on PATH with a keyring."""
    reg = make_project("course", name="project", use=False).path
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(reg))
    root = reg.parent
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
    return SignProject(root, reg, image, keyring, log)
