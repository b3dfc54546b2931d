"""Real Docker engine + real OCI registry for the build/push tests, and a tiny local base image.

Started once per test session by ``tests/services.py`` (private data root, unix socket, registry on a free
127.0.0.1 port) and stopped by PID at the end. No Docker Hub: the base image is assembled here FROM scratch.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from services import Dockerd, OciRegistry

TINY_BASE = "shipyard-test/base:1"
# What the tiny base "carries", i.e. what a stack: base environment's %test must find in it.
TINY_PINS = {"python": "3.11", "torch": "2.3.1", "cuda": "12.1", "nccl": "2.20.5"}
_PY = "/usr/bin/python3.11"
_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data", "__pycache__"}


@pytest.fixture(scope="session")
def docker_services(tmp_path_factory):
    """(dockerd, registry): a real dockerd and a real docker-registry on 127.0.0.1, for this session only."""
    state = tmp_path_factory.mktemp("services")
    dockerd = Dockerd(state / "docker").start()
    try:
        reg = OciRegistry(state / "registry").start()
    except BaseException:
        dockerd.stop()
        raise
    yield dockerd, reg
    reg.stop()
    dockerd.stop()


@pytest.fixture
def docker_env(docker_services, monkeypatch):
    """DOCKER_HOST pointing at the session's dockerd (as a user would export it)."""
    dockerd, _ = docker_services
    monkeypatch.setenv("DOCKER_HOST", dockerd.host)
    return dockerd


def _libs(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    return set(re.findall(r"(/\S+\.so[.\d]*)", out))


def _fixture_torch(site: Path, pins: dict) -> None:
    """A metadata-only ``torch`` package: the version facts a real torch wheel reports, and nothing else. It lets
    the %test equivalent run for real (real python, real imports, real asserts) in a 30 MB image."""
    pkg = site / "torch"
    (pkg / "cuda").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'"""TEST FIXTURE, not torch."""\n__version__ = "{pins["torch"]}+cu'
                                     f'{pins["cuda"].replace(".", "")}"\nfrom torch import version, cuda\n')
    (pkg / "version.py").write_text(f'cuda = "{pins["cuda"]}"\n')
    (pkg / "cuda" / "__init__.py").write_text("from torch.cuda import nccl\n")
    nccl = tuple(int(x) for x in pins["nccl"].split("."))
    (pkg / "cuda" / "nccl.py").write_text(f"def version():\n    return {nccl!r}\n")


def make_rootfs(dest: Path, pins: dict = TINY_PINS) -> Path:
    """busybox-static + Debian's python3.11 (stdlib, pip) + the fixture torch: enough for RUN and %test."""
    busybox = shutil.which("busybox")
    if not busybox:
        pytest.fail("busybox is missing: apt-get install busybox-static (needed for the tiny base image)")
    (dest / "bin").mkdir(parents=True)
    for d in ("usr/bin", "usr/lib", "usr/lib64", "tmp", "root"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, dest / "bin/busybox")
    for applet in subprocess.run([busybox, "--list"], capture_output=True, text=True).stdout.split():
        if applet != "busybox":
            (dest / "bin" / applet).symlink_to("busybox")
    (dest / "lib").symlink_to("usr/lib")
    (dest / "lib64").symlink_to("usr/lib64")
    shutil.copy2(_PY, dest / "usr/bin/python3.11")
    (dest / "usr/bin/python3").symlink_to("python3.11")
    stdlib = Path("/usr/lib/python3.11")
    shutil.copytree(stdlib, dest / "usr/lib/python3.11", symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in _SKIP or n.startswith("config-")])
    shutil.copytree("/usr/lib/python3/dist-packages/pip", dest / "usr/lib/python3/dist-packages/pip",
                    ignore=shutil.ignore_patterns("__pycache__"))
    libs = _libs(_PY)
    for so in (stdlib / "lib-dynload").glob("*.so"):
        libs |= _libs(str(so))
    for lib in libs:
        real = Path(lib)
        rel = Path("usr") / real.relative_to("/") if not lib.startswith("/usr/") else real.relative_to("/")
        rel = Path(str(rel).replace("usr/usr/", "usr/"))
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(real.resolve(), dest / rel)
    _fixture_torch(dest / "usr/local/lib/python3.11/dist-packages", pins)
    return dest


@pytest.fixture(scope="session")
def tiny_base(docker_services, tmp_path_factory):
    """The local base image ``shipyard-test/base:1`` (FROM scratch; built once per session)."""
    import io
    import tarfile

    dockerd, _ = docker_services
    ctx = tmp_path_factory.mktemp("tinybase")
    make_rootfs(ctx / "rootfs")
    (ctx / "Dockerfile").write_text(
        "FROM scratch\nCOPY rootfs/ /\n"
        "ENV PATH=/usr/local/bin:/usr/bin:/bin\n"
        'CMD ["/bin/sh"]\n')
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(ctx / "Dockerfile", arcname="Dockerfile")
        tar.add(ctx / "rootfs", arcname="rootfs")
    buf.seek(0)
    api = dockerd.client().api
    out = list(api.build(fileobj=buf, custom_context=True, tag=TINY_BASE, rm=True, decode=True))
    errors = [m["error"] for m in out if "error" in m]
    assert not errors, errors
    shutil.rmtree(ctx)
    return TINY_BASE
