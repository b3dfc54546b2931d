"""Real enroot + pyxis in the sandbox (``invoke sandbox.runtimes``), built from the upstream source archives in
``../shared/vendor`` (or ``$SHIPYARD_RUNTIME_SOURCES``), and a tiny real SquashFS image (static busybox).

Sources missing: with CI=true the tests that need them FAIL (CI must never certify what it did not run); locally
they skip, and `invoke test` names them in one line with how to provide the sources."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def runtime_sources() -> Path:
    from shipyard.sandbox import runtimes

    return runtimes.test_sources(ROOT)


def missing_sources_line() -> str | None:
    """One line (which tests, how to provide the sources), or None when the sources are there."""
    from shipyard.sandbox import runtimes

    return runtimes.tests_left_out_line(ROOT)


@pytest.fixture(scope="module")
def real_pyxis(sandbox):
    """Real enroot + pyxis installed in the session's sandbox, the real pyxis in its plugstack.conf for this module;
    the plugstack as it was (e.g. the pyxis double) is restored afterwards. ``sandbox.down`` uninstalls enroot."""
    from ci_skips import in_ci

    from shipyard import sandbox as sb

    line = missing_sources_line()
    if line:
        (pytest.fail if in_ci() else pytest.skip)(line)
    before = sb.plugstack(sandbox.directory)
    info = sb.install_runtimes(runtime_sources(), sandbox.directory)
    try:
        yield info
    finally:
        sb.restore_plugstack(before, sandbox.directory)


@pytest.fixture(scope="session")
def busybox_sqsh(tmp_path_factory) -> Path:
    """A real SquashFS image: Debian's static busybox as /bin/*, made with mksquashfs (a few hundred ms)."""
    busybox = shutil.which("busybox")
    assert busybox, "busybox-static is in shipyard/data/test-packages.txt"
    d = tmp_path_factory.mktemp("busybox-image")
    d.chmod(0o755)
    rootfs = d / "rootfs"
    for sub in ("bin", "etc", "tmp", "proc", "sys", "dev", "root", "usr", "work"):
        (rootfs / sub).mkdir(parents=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for tool in ("sh", "hostname", "cat", "env", "ls", "pwd", "test", "echo", "printf"):
        (rootfs / "bin" / tool).symlink_to("busybox")
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    # the image's own environment (enroot reads /etc/environment): a library path the image relies on
    (rootfs / "etc" / "environment").write_text("LD_LIBRARY_PATH=/opt/image/lib\nIMAGE_ONLY=from-image\n")
    out = d / "busybox.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(out), "-noappend", "-quiet", "-all-root"], check=True,
                   stdout=subprocess.DEVNULL)
    out.chmod(0o644)
    return out
