"""The docker backend's client without an engine: the one line names where it looked, as the user set it."""

from __future__ import annotations

import docker
import pytest

from shipyard.containers import docker as backend
from shipyard.errors import ShipyardError


def _no_engine(*args, **kwargs):
    raise docker.errors.DockerException("Error while fetching server API version: connection refused")


@pytest.mark.parametrize(("value", "said"), [
    ("unix:///nope/docker.sock", "no Docker engine at DOCKER_HOST=unix:///nope/docker.sock ("),
    (None, "no Docker engine at /var/run/docker.sock (DOCKER_HOST is not set) ("),
])
def test_no_engine_names_the_place_it_tried(monkeypatch, value, said):
    if value is None:
        monkeypatch.delenv("DOCKER_HOST", raising=False)
    else:
        monkeypatch.setenv("DOCKER_HOST", value)
    monkeypatch.setattr(docker, "APIClient", _no_engine)
    with pytest.raises(ShipyardError) as err:
        backend.client()
    assert said in str(err.value) and "${" not in str(err.value)


class _SavingEngine:
    """What the SIF step asks of the engine: ``get_image``, its ``docker save`` stream in chunks."""

    def __init__(self, data: bytes):
        self.data = data

    def get_image(self, tag):
        return (self.data[i:i + 4096] for i in range(0, len(self.data), 4096))


def test_a_full_disk_while_saving_the_layout_names_the_file_and_apptainer_tmpdir(tmp_path, monkeypatch):
    """No space for the image saved as an OCI layout: one line naming the file and the setting that moves it; the
    half-written layout is gone and apptainer never ran."""
    import errno
    import os

    from test_oci_layout import legacy_archive

    from shipyard.containers import oci_layout
    from shipyard.containers.common import Job
    from shipyard.containers.log import BuildLog

    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    real_write, written = os.write, []

    def write(fd, data):
        if written:  # the first blob fits, the second does not
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(oci_layout.os, "write", write)
    monkeypatch.setattr(backend, "run_streaming", lambda *a, **k: pytest.fail("apptainer ran"))
    b = backend.DockerBackend()
    b._api = _SavingEngine(legacy_archive())
    with BuildLog(tmp_path / "build.log", quiet=True) as log:
        job = Job(reg=None, env=None, formats=("sif",), fakeroot=False, tag="shipyard/real:abc", log=log)
        with pytest.raises(ShipyardError) as err:
            b._sif(job, "containers/real.sif.tmp-1")
    line = str(err.value)
    assert line.startswith(f"sif: {tmp_path}/shipyard-oci-"), line
    assert "/blobs/sha256/.part-2: No space left on device while saving shipyard/real:abc as an OCI layout" in line
    assert line.endswith("set APPTAINER_TMPDIR to a folder on a larger disk") and "\n" not in line
    assert [p.name for p in tmp_path.iterdir()] == ["build.log"]
