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
from fixtures_docker import TINY_BASE, docker_env, docker_services, tiny_base  # noqa: F401  (fixtures)
from fixtures_oci import DEBIAN_TORCH_BASE, TINY_BASE_ENV, OciServer, debian_torch_layer, layer, tiny_base_rootfs
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


@pytest.fixture(scope="session")
def base_registry(tmp_path_factory):
    """The in-process OCI registry (fixtures_oci.py) serving the tiny base as ``shipyard-test/base:1``: what a real
    `apptainer build` of the `tiny` environment pulls through base_mirror. No daemon, no network."""
    import shutil

    d = tmp_path_factory.mktemp("tiny-base")
    server = OciServer()
    name, tag = TINY_BASE.rsplit(":", 1)
    server.add_image(name, tag, [layer(tiny_base_rootfs(d / "rootfs"))], TINY_BASE_ENV)
    shutil.rmtree(d / "rootfs")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def apptainer_cache(tmp_path_factory):
    """One APPTAINER_CACHEDIR for the session: the base's layers are fetched once, not once per build."""
    return tmp_path_factory.mktemp("apptainer-cache")


@pytest.fixture
def real_project(project, base_registry, apptainer_on_path, apptainer_cache, monkeypatch, tmp_path):
    """The build project with base_mirror at :func:`base_registry` (plain HTTP, said explicitly) and the real
    Apptainer first on PATH; returns the registry loaded from it."""
    from shipyard import registry

    reg_file = project.root / "registry.yaml"
    reg_file.write_text(reg_file.read_text() + f"base_mirror:\n  url: {base_registry.address}\n  insecure_http: true\n")
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(apptainer_cache))
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    return registry.load(reg_file)


@pytest.fixture(scope="session")
def debian_base(base_registry, tmp_path_factory):
    """``shipyard-test/debian12-torch:1`` in base_registry: the debootstrapped Debian 12 (fixtures_debian.py, cached
    between sessions) as one layer, the metadata-only torch of the tiny base as a second."""
    from fixtures_debian import rootfs_tarball

    name, tag = DEBIAN_TORCH_BASE.rsplit(":", 1)
    base_registry.add_image(name, tag, [rootfs_tarball().read_bytes(),
                                        debian_torch_layer(tmp_path_factory.mktemp("debian-torch"))], TINY_BASE_ENV)
    return DEBIAN_TORCH_BASE
