"""Fixtures of the containers tests only: the real dockerd + OCI registry (fixtures_docker.py), the proxy in front of
that registry (fixtures_push.py), the debootstrapped Debian base and the CONNECT proxy of the real-image build
(fixtures_debian.py), and the signing project (the real apptainer, its test keyring and SIF: tests/fixtures_sign.py).
Every docker fixture depends on docker_services, which tests/needs.py refuses to any test without the docker mark."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures_debian import connect_proxy, debian12_base  # noqa: F401  (fixtures)
from fixtures_docker import docker_env, docker_services, tiny_base  # noqa: F401  (fixtures)
from fixtures_push import registry_proxy  # noqa: F401  (fixtures)
from fixtures_sign import SigningKey


@dataclass
class SignProject:
    root: Path
    registry: Path
    image: Path
    keys: tuple[SigningKey, ...]  # the test keyring's keys, by --keyidx
    keysdir: Path  # the test's own copy of the keyring (APPTAINER_KEYSDIR)


@pytest.fixture
def apptainer_keyring(apptainer_on_path, signing_keyring, tmp_path, monkeypatch) -> tuple[SigningKey, ...]:
    """The real apptainer first on PATH and the test's own copy of the two-key test keyring selected
    (APPTAINER_KEYSDIR, APPTAINER_CONFIGDIR in ``tmp_path/apptainer``); returns its keys, by --keyidx."""
    for var, value in signing_keyring.copy_to(tmp_path / "apptainer").items():
        monkeypatch.setenv(var, value)
    return signing_keyring.keys


@pytest.fixture
def sign_project(make_project, tmp_path, monkeypatch, apptainer_keyring, unsigned_sif):
    """The ``course`` preset with a real, unsigned SIF in containers/, and :func:`apptainer_keyring`."""
    reg = make_project("course", name="project", use=False).path
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(reg))
    root = reg.parent
    (root / "containers").mkdir()
    image = root / "containers" / "course.sif"
    shutil.copy2(unsigned_sif, image)
    return SignProject(root, reg, image, apptainer_keyring, tmp_path / "apptainer" / "keys")
