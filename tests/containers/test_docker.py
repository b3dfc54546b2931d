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
            b._sif(job, "containers/real.sif.tmp-1", tmp_path / "proj" / "containers" / "real.sif")
    line = str(err.value)
    assert line.startswith(f"sif: {tmp_path}/shipyard-oci-"), line
    assert "/blobs/sha256/.part-2: No space left on device while saving shipyard/real:abc as an OCI layout" in line
    assert line.endswith("set APPTAINER_TMPDIR to a folder on a larger disk") and "\n" not in line
    assert [p.name for p in tmp_path.iterdir()] == ["build.log"]


def test_the_layout_a_killed_build_left_is_removed_and_nothing_else(tmp_path, monkeypatch):
    """A build killed while saving (SIGKILL: no cleanup) leaves GBs in APPTAINER_TMPDIR. The next build of the same
    SIF, holding its build lock, removes that folder; another SIF's layout (another project, another environment:
    maybe building now), a symlink with the same name (never followed) and another user's folder stay."""
    import hashlib
    import os
    import subprocess
    import types

    from test_oci_layout import legacy_archive

    from shipyard.containers.common import Job
    from shipyard.containers.log import BuildLog

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmpdir))
    target = tmp_path / "proj" / "containers" / "real.sif"
    prefix = f"shipyard-oci-{hashlib.sha256(str(target).encode()).hexdigest()[:16]}-"
    stale = tmpdir / f"{prefix}x1y2z3"
    (stale / "blobs" / "sha256").mkdir(parents=True)
    (stale / "blobs" / "sha256" / ".part-1").write_bytes(b"half a layer")
    other = tmpdir / f"shipyard-oci-{hashlib.sha256(str(target.with_name('other.sif')).encode()).hexdigest()[:16]}-a"
    other.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    (tmpdir / f"{prefix}link").symlink_to(victim)
    project = types.SimpleNamespace(root=tmp_path / "proj")  # what a Job reads of its registry: the project root
    ran = []
    monkeypatch.setattr(backend, "run_streaming", lambda argv, log, cwd=None: ran.append(argv))
    b = backend.DockerBackend()
    b._api = _SavingEngine(legacy_archive())
    with BuildLog(tmp_path / "build.log", quiet=True) as log:
        job = Job(reg=project, env=None, formats=("sif",), fakeroot=False, tag="shipyard/real:abc", log=log)
        b._sif(job, "containers/real.sif.tmp-1", target)
    assert not stale.exists()
    assert other.is_dir() and (victim / "keep").exists() and (tmpdir / f"{prefix}link").is_symlink()
    text = (tmp_path / "build.log").read_text()
    assert f"sif: removed {stale}, the OCI layout a killed build of real.sif left" in text
    # the new layout was made under the same prefix and is gone after the build
    [[*_, source]] = ran
    assert source.startswith(f"oci:{tmpdir}/{prefix}") and not os.path.exists(source[4:])
    if os.geteuid() == 0:  # another user's folder of that name is not ours to remove
        foreign = tmpdir / f"{prefix}foreign"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
        with BuildLog(tmp_path / "build2.log", quiet=True) as log:
            b._sif(Job(reg=project, env=None, formats=("sif",), fakeroot=False, tag="shipyard/real:abc", log=log),
                   "containers/real.sif.tmp-1", target)
        assert foreign.is_dir()
        subprocess.run(["rm", "-rf", str(foreign)], check=True)
