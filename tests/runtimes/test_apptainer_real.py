"""The real Apptainer 1.4.5's rules for what a command in a SIF sees, which shipyard's apptainer runtime
(shipyard/runtimes/apptainer.py) and its launchers rely on: the image's PATH and environment, not the host's; the
host's LD_LIBRARY_PATH dropped (the image's plus /.singularity.d/libs); APPTAINERENV_ and --env on top of the
image's values; what --cleanenv keeps; --pwd, --bind and the current directory bound by default; hostile arguments
intact; `apptainer shell` starting a shell inside. The SIF is built here by the real Apptainer from a tiny root
filesystem (static busybox + the host's bash with its libraries; tests/fixtures_runtimes.py), no Slurm needed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures_runtimes import build_sif

pytestmark = pytest.mark.real_apptainer

# a definition's %environment as shipyard's recipe writes one: the image's PATH in front of Apptainer's default
ENVIRONMENT = """    export PATH=/opt/image/bin:$PATH
    export LD_LIBRARY_PATH=/opt/image/lib
    export IMAGE_ONLY=from-image
    export OVERRIDE_ME=image-value
"""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Apptainer's, without an image PATH


@pytest.fixture(scope="module")
def rootfs_sif(real_apptainer, busybox_sif_rootfs, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rootfs-sif")
    return build_sif(real_apptainer, busybox_sif_rootfs, d / "image.sif", environment=ENVIRONMENT)


def run(apptainer: Path, verb: str, sif: Path, *args, opts=(), env=None, cwd=None, stdin=None):
    """``apptainer VERB [OPTS] SIF ARGS`` with a host environment of its own (PATH and LD_LIBRARY_PATH with
    host-only entries, HOST_ONLY) plus ``env``; its stdout."""
    full = {"PATH": f"/host/only/bin:{apptainer}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/root"),
            "USER": os.environ.get("USER", "root"), "LD_LIBRARY_PATH": "/host/lib", "HOST_ONLY": "from-host",
            **(env or {})}
    res = subprocess.run(["apptainer", verb, *opts, str(sif), *args], capture_output=True, text=True, env=full,
                         cwd=cwd, timeout=60, input=stdin)
    assert res.returncode == 0, res.stderr
    return res.stdout


def env_inside(apptainer, sif, **kw) -> dict[str, str]:
    out = run(apptainer, "exec", sif, "/bin/env", **kw)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_image_path_and_environment_not_the_hosts(real_apptainer, rootfs_sif, tmp_path):
    env = env_inside(real_apptainer, rootfs_sif, cwd=tmp_path)
    assert env["PATH"] == f"/opt/image/bin:{DEFAULT_PATH}"
    assert env["LD_LIBRARY_PATH"] == "/opt/image/lib:/.singularity.d/libs"  # the host's /host/lib never arrives
    assert env["IMAGE_ONLY"] == "from-image" and env["HOST_ONLY"] == "from-host"  # other host variables pass
    assert env["APPTAINER_CONTAINER"] == str(rootfs_sif) and env["PWD"] == str(tmp_path)
    assert env["USER_PATH"].startswith("/host/only/bin:")  # the host's PATH is kept aside, not used
    assert run(real_apptainer, "exec", rootfs_sif, "image-tool") == "image-tool ran\n"  # the image's PATH only
    assert shutil.which("image-tool") is None


def test_overrides_win_over_the_image_and_env_wins_over_apptainerenv(real_apptainer, rootfs_sif):
    env = env_inside(real_apptainer, rootfs_sif, opts=["--env", "OVERRIDE_ME=from-flag", "--env", "FLAG_ONLY=$HOME/x"],
                     env={"APPTAINERENV_OVERRIDE_ME": "from-prefix", "APPTAINERENV_LD_LIBRARY_PATH": "/inj",
                          "APPTAINERENV_PREPEND_PATH": "/pre", "APPTAINERENV_IMAGE_ONLY": "prefix-wins"})
    assert env["OVERRIDE_ME"] == "from-flag" and env["IMAGE_ONLY"] == "prefix-wins"
    # set after the image's environment: the image's library path is *replaced*, which is why launchers and module
    # wrappers prepend an injected path with a shell inside the container instead
    assert env["LD_LIBRARY_PATH"] == "/inj:/.singularity.d/libs"
    assert env["PATH"] == f"/pre:/opt/image/bin:{DEFAULT_PATH}"
    assert env["FLAG_ONLY"] == f"{os.environ.get('HOME', '/root')}/x"  # Apptainer evaluates override values


def test_cleanenv_keeps_only_term_proxies_and_the_image(real_apptainer, rootfs_sif):
    env = env_inside(real_apptainer, rootfs_sif, opts=["--cleanenv"],
                     env={"TERM": "dumb", "https_proxy": "http://p:3128"})
    assert "HOST_ONLY" not in env and "USER_PATH" not in env
    assert env["TERM"] == "dumb" and env["https_proxy"] == "http://p:3128"
    assert env["LANG"] == "C" and env["IMAGE_ONLY"] == "from-image" and env["OVERRIDE_ME"] == "image-value"
    assert env["LD_LIBRARY_PATH"] == "/opt/image/lib:/.singularity.d/libs"


def test_pwd_bind_and_hostile_arguments(real_apptainer, rootfs_sif, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "file.txt").write_text("bound\n")
    hostile = ["a b", "$(touch /tmp/pwned)", "'\"", "*", "-n", "", "line\nbreak", "`id`", "$HOME"]
    out = run(real_apptainer, "exec", rootfs_sif, "/bin/sh", "-c", 'pwd; cat file.txt; printf "[%s]\\n" "$@"', "sh",
              *hostile, opts=["--bind", f"{data}:/mnt/data:ro", "--pwd", "/mnt/data"], cwd=tmp_path)
    assert out == "/mnt/data\nbound\n" + "".join(f"[{a}]\n" for a in hostile)
    assert not Path("/tmp/pwned").exists()
    # read-only as asked
    res = subprocess.run(["apptainer", "exec", "--bind", f"{data}:/mnt/data:ro", str(rootfs_sif), "/bin/sh", "-c",
                          "echo x > /mnt/data/new"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{real_apptainer}:{os.environ['PATH']}"})
    assert res.returncode != 0 and "Read-only file system" in res.stderr and not (data / "new").exists()
    # the current directory is bound by default (Apptainer's `mount cwd`), also where the image lacks it
    assert run(real_apptainer, "exec", rootfs_sif, "/bin/cat", "data/file.txt", cwd=tmp_path) == "bound\n"


def test_shell_starts_bash_inside(real_apptainer, rootfs_sif):
    out = run(real_apptainer, "shell", rootfs_sif, stdin="echo $SHELL $BASH_VERSION; command -v image-tool; "
              "echo $APPTAINER_COMMAND\n")
    first, second, third = out.splitlines()
    shell, version = first.split()[:2]
    assert shell == "/bin/bash" and version
    assert second == "/opt/image/bin/image-tool" and third == "shell"
