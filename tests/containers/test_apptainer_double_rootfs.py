"""The apptainer double's root-filesystem mode (tests/doubles/apptainer): a SIF with a SquashFS system partition
runs its commands *inside* that filesystem (Charliecloud's ch-run), with Apptainer's environment rules as read in
Apptainer's sources. These tests pin the double to those rules, so tests that use it mean what real Apptainer does:
the image's PATH (not the host's), no host LD_LIBRARY_PATH, %environment / docker ENV, then APPTAINERENV_ and --env
on top, --cleanenv, --pwd, --bind, default binds, hostile arguments intact. The SIF is built from a tiny rootfs
(static busybox + the host's bash with its libraries) through the double's `build` with
$SHIPYARD_DOUBLE_APPTAINER_ROOTFS, which puts %environment where Apptainer does (no docker needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures_build import APPTAINER_DOUBLE, read_calls
from fixtures_runtimes import _copy_with_libraries

pytestmark = pytest.mark.double

DOUBLE = APPTAINER_DOUBLE / "apptainer"
DEF = """Bootstrap: docker
From: debian:12

%environment
    export PATH=/opt/image/bin:$PATH
    export LD_LIBRARY_PATH=/opt/image/lib
    export IMAGE_ONLY=from-image
    export OVERRIDE_ME=image-value
"""


@pytest.fixture(scope="module")
def rootfs_sif(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rootfs-sif")
    rootfs = d / "rootfs"
    for sub in ("bin", "etc", "opt/image/bin"):
        (rootfs / sub).mkdir(parents=True)
    shutil.copy2(shutil.which("busybox"), rootfs / "bin" / "busybox")
    for tool in ("sh", "cat", "env", "ls", "pwd", "echo", "printf", "touch"):
        (rootfs / "bin" / tool).symlink_to("busybox")
    _copy_with_libraries(Path("/bin/bash"), rootfs)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    tool = rootfs / "opt" / "image" / "bin" / "image-tool"
    tool.write_text("#!/bin/sh\necho image-tool ran\n")
    tool.chmod(0o755)
    (d / "image.def").write_text(DEF)
    env = dict(os.environ, SHIPYARD_DOUBLE_APPTAINER_ROOTFS=str(rootfs))
    env.pop("SHIPYARD_DOUBLE_CALLS", None)
    subprocess.run([str(DOUBLE), "build", str(d / "image.sif"), "image.def"], cwd=d, env=env, check=True,
                   capture_output=True)
    listing = subprocess.run(["siftool", "list", str(d / "image.sif")], capture_output=True, text=True).stdout
    assert "FS (Squashfs/*System/" in listing and "Def.FILE" in listing
    return d / "image.sif"


def run(sif, *args, opts=(), env=None, cwd=None):
    calls = Path(cwd or os.getcwd()) / "calls.jsonl" if cwd else None
    full = {"PATH": f"/host/only/bin:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/root"),
            "USER": os.environ.get("USER", "root"), "LD_LIBRARY_PATH": "/host/lib", "HOST_ONLY": "from-host",
            **(env or {})}
    if calls:
        full["SHIPYARD_DOUBLE_CALLS"] = str(calls)
    res = subprocess.run([str(DOUBLE), "exec", "--nv", *opts, str(sif), *args], capture_output=True, text=True,
                         env=full, cwd=cwd, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout, (read_calls(calls) if calls else None)


def env_inside(sif, **kw):
    out, calls = run(sif, "/bin/env", **kw)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line), calls


def test_image_path_and_environment_not_the_hosts(rootfs_sif, tmp_path):
    env, calls = env_inside(rootfs_sif, cwd=tmp_path)
    assert env["PATH"] == "/opt/image/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["LD_LIBRARY_PATH"] == "/opt/image/lib:/.singularity.d/libs"  # the host's /host/lib never arrives
    assert env["IMAGE_ONLY"] == "from-image" and env["HOST_ONLY"] == "from-host"
    assert env["APPTAINER_CONTAINER"] == str(rootfs_sif) and env["PWD"] == str(tmp_path)
    assert "CH_RUNNING" not in env  # nothing of the engine under the double shows
    assert calls[-1]["rootfs"] is True and calls[-1]["engine"] == "ch-run"
    out, _ = run(rootfs_sif, "image-tool")  # found on the image's PATH only
    assert out == "image-tool ran\n"
    assert not (tmp_path / "image-tool").exists() and shutil.which("image-tool") is None


def test_overrides_win_over_the_image_and_env_wins_over_apptainerenv(rootfs_sif):
    env, _ = env_inside(rootfs_sif, opts=["--env", "OVERRIDE_ME=from-flag", "--env", "FLAG_ONLY=$HOME/x"],
                        env={"APPTAINERENV_OVERRIDE_ME": "from-prefix", "APPTAINERENV_LD_LIBRARY_PATH": "/inj",
                             "APPTAINERENV_PREPEND_PATH": "/pre", "APPTAINERENV_IMAGE_ONLY": "prefix-wins"})
    assert env["OVERRIDE_ME"] == "from-flag" and env["IMAGE_ONLY"] == "prefix-wins"
    # injected after the image's environment: the image's library path is *replaced* (issue 18 point 6)
    assert env["LD_LIBRARY_PATH"] == "/inj:/.singularity.d/libs"
    assert env["PATH"].startswith("/pre:/opt/image/bin:")
    assert env["FLAG_ONLY"] == f"{os.environ.get('HOME', '/root')}/x"  # Apptainer evaluates override values


def test_cleanenv_keeps_only_term_proxies_and_the_image(rootfs_sif):
    env, _ = env_inside(rootfs_sif, opts=["--cleanenv"], env={"TERM": "dumb", "https_proxy": "http://p:3128"})
    assert "HOST_ONLY" not in env and env["TERM"] == "dumb" and env["https_proxy"] == "http://p:3128"
    assert env["LANG"] == "C" and env["IMAGE_ONLY"] == "from-image"


def test_pwd_bind_and_hostile_arguments(rootfs_sif, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "file.txt").write_text("bound\n")
    hostile = ["a b", "$(touch /tmp/pwned)", "'\"", "*", "-n", "", "line\nbreak"]
    out, calls = run(rootfs_sif, "/bin/sh", "-c", 'pwd; cat file.txt; printf "[%s]\\n" "$@"', "sh", *hostile,
                     opts=["--bind", f"{data}:/mnt/data:ro", "--pwd", "/mnt/data"], cwd=tmp_path)
    assert out == "/mnt/data\nbound\n" + "".join(f"[{a}]\n" for a in hostile)
    assert f"{data}:/mnt/data" in calls[-1]["mounts"] and calls[-1]["pwd"] == "/mnt/data"
    # the current directory is bound by default (Apptainer's `mount cwd`), also where the image lacks it
    out, _ = run(rootfs_sif, "/bin/cat", "data/file.txt", cwd=tmp_path)
    assert out == "bound\n"


def test_shell_starts_bash_inside(rootfs_sif):
    res = subprocess.run([str(DOUBLE), "shell", "--nv", str(rootfs_sif)], input="echo $SHELL $BASH_VERSION; "
                         "command -v image-tool\n", capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, USER=os.environ.get("USER", "root")))
    assert res.returncode == 0, res.stderr
    shell, version = res.stdout.splitlines()[0].split()[:2]
    assert shell == "/bin/bash" and version
    assert res.stdout.splitlines()[1] == "/opt/image/bin/image-tool"


def test_cache_is_reused_and_a_definition_only_sif_runs_on_the_host(rootfs_sif, tmp_path):
    cache = tmp_path / "cache"
    for _ in range(2):
        out, _ = run(rootfs_sif, "image-tool", env={"SHIPYARD_DOUBLE_APPTAINER_CACHE": str(cache)})
        assert out == "image-tool ran\n"
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1
    plain = tmp_path / "plain.sif"
    (tmp_path / "plain.def").write_text(DEF)
    env = dict(os.environ, SHIPYARD_DOUBLE_CALLS=str(tmp_path / "c.jsonl"))
    env.pop("SHIPYARD_DOUBLE_APPTAINER_ROOTFS", None)
    subprocess.run([str(DOUBLE), "build", str(plain), "plain.def"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    subprocess.run([str(DOUBLE), "exec", "--nv", str(plain), "true"], env=env, check=True)
    assert [c.get("rootfs") for c in read_calls(tmp_path / "c.jsonl")] == [False, False]
    res = subprocess.run([str(DOUBLE), "exec", "--nv", "--cleanenv", str(plain), "true"], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 64 and "--cleanenv" in res.stderr
    assert json.loads((tmp_path / "c.jsonl").read_text().splitlines()[0])["argv"][0] == "build"
