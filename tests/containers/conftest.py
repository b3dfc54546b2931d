"""Fixtures of the containers tests only: the real dockerd + OCI registry (fixtures_docker.py), the proxy in front of
that registry (fixtures_push.py), the debootstrapped Debian base and the CONNECT proxy of the real-image build
(fixtures_debian.py), and the signing project. Every docker fixture depends on docker_services, which tests/needs.py
refuses to any test without the docker mark."""

from __future__ import annotations

import json
import os

import pytest
from fixtures_debian import connect_proxy, debian12_base  # noqa: F401  (fixtures)
from fixtures_docker import docker_env, docker_services, tiny_base  # noqa: F401  (fixtures)
from fixtures_push import registry_proxy  # noqa: F401  (fixtures)
from fixtures_sign import KEYS, SIGN_DOUBLE, SignProject, make_sif


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
