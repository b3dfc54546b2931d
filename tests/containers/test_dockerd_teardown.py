"""The tests' own dockerd (tests/services.py) leaves nothing on the machine when it stops: no mount below its
exec-root (a container on the host's network makes dockerd bind-mount its default network namespace at
EXEC_ROOT/netns/default, and dockerd leaves it there when it exits), no mount of its data root (dockerd mounts it on
itself) and no exec-root folder. It runs beside the session's dockerd, whose exec-root it must not share."""

from __future__ import annotations

import io
import tarfile

import pytest
from services import Dockerd, mounts_under

pytestmark = pytest.mark.docker


def _one_binary_image(client, binary: str = "/bin/true") -> str:
    """An image of one static-enough file, imported from a tar (no registry, no base image)."""
    data = open(binary, "rb").read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("true")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    client.api.import_image_from_data(buf.getvalue(), repository="shipyard-test/teardown", tag="1")
    return "shipyard-test/teardown:1"


def test_a_stopped_dockerd_leaves_no_mount_and_no_exec_root(tmp_path):
    dockerd = Dockerd(tmp_path / "docker").start()
    exec_root = dockerd._exec_root
    try:
        client = dockerd.client(timeout=60)
        container = client.containers.create(_one_binary_image(client), command=["/true"], network_mode="host")
        container.start()  # /true needs the host's libc: it may fail to run, but the sandbox is made either way
        container.wait(timeout=60)
        running = mounts_under(exec_root) + mounts_under(dockerd.state / "root")
        assert any(p.endswith("/netns/default") for p in running), running  # what the stop has to undo
        assert str(dockerd.state / "root") in running, running
    finally:
        dockerd.stop()
    assert mounts_under(exec_root) == [] and mounts_under(dockerd.state / "root") == []
    assert not exec_root.exists()
