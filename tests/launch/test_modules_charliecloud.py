"""Module wrappers on a Charliecloud cluster, for real: Debian's ch-run 0.31 and Lmod 8.6, no Slurm.

A SquashFS image (Debian's static busybox, made with mksquashfs in a fraction of a second, as the sandbox ch-run tests
make theirs) stands at the path the charliecloud runtime names, ``<storage>/<env>.sqsh``; ``invoke modules``'s own
writer generates the modulefile and wrappers for it; each test runs a wrapper from a student's directory (a space in
its path) and proves, from inside the container, that it ran in the image (a file only the image has, the image's
PATH), in that directory (``pwd`` and ch-run's bind of it in the container's mount table), with the cluster's bind,
the module's variable over the image's, the host injection's library path in front of the image's (never the
caller's own), ``$USER`` set though the caller had none, and the arguments exactly as given.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fixtures_invoke import invoke_cli
from fixtures_launch import stage_record
from helpers_registry import ROOT

from shipyard import registry
from shipyard.launch import modules
from shipyard.registry.model import Cluster

SHIPPED = registry.load(ROOT / "registry.yaml")
ENV = SHIPPED.environment("pytorch-2.3")
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
INJECTED = "/opt/efa/lib"  # the site's fabric libraries (fabric_options.host_injection.env)
HOST_LD = "/host/lib:/other/module/lib"  # the student's shell before `module load`: never inside the container
HOSTILE = ["two words", "$(touch pwned)", "it's", '"q"', "`touch pwned2`", "*", "", "-c", "a\\b"]

# The image's `python`: found only through the image's own PATH (its /etc/environment), it reports what it sees.
TOOL = """#!/bin/sh
echo "marker=$(cat /image-only)"
echo "cwd=$(pwd)"
echo "site=$(cat /site/f.txt)"
echo "nccl_debug=$NCCL_DEBUG"
echo "ld=$LD_LIBRARY_PATH"
echo "user=$USER"
for a in "$@"; do printf 'arg=[%s]\\n' "$a"; done
cat /proc/self/mountinfo
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    assert shutil.which("ch-run"), "charliecloud-runtime is in shipyard/data/test-packages.txt"
    busybox = shutil.which("busybox")
    assert busybox, "busybox-static is in shipyard/data/test-packages.txt"
    d = tmp_path_factory.mktemp("ch-modules")
    d.chmod(0o755)
    rootfs = d / "rootfs"
    for sub in ("bin", "etc", "tmp", "proc", "sys", "dev", "site", "opt/image/bin"):
        (rootfs / sub).mkdir(parents=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for tool in ("sh", "cat", "pwd"):
        (rootfs / "bin" / tool).symlink_to("busybox")
    for f in ("passwd", "group"):  # ch-run binds its own over them: they must exist
        (rootfs / "etc" / f).write_text("root:x:0:0:root:/root:/bin/sh\n" if f == "passwd" else "root:x:0:\n")
    (rootfs / "image-only").write_text("inside the image\n")
    (rootfs / "opt" / "image" / "bin" / "python").write_text(TOOL)
    (rootfs / "opt" / "image" / "bin" / "python").chmod(0o755)
    (rootfs / "etc" / "environment").write_text("PATH=/opt/image/bin:/bin\nNCCL_DEBUG=from-image\n"
                                                  "LD_LIBRARY_PATH=/opt/image/lib\n")
    storage = d / "storage"
    storage.mkdir()
    subprocess.run(["mksquashfs", str(rootfs), str(storage / f"{ENV.name}.sqsh"), "-noappend", "-quiet", "-all-root"],
                   check=True, stdout=subprocess.DEVNULL)
    (d / "site-data").mkdir()
    (d / "site-data" / "f.txt").write_text("site data\n")
    base = SHIPPED.cluster("grete")
    cluster = Cluster(**{**base.__dict__, "name": "ch-site", "runtime": "charliecloud", "storage": str(storage),
                         "binds": (f"{d}/site-data:/site:ro",), "env": (("NCCL_DEBUG", "WARN"),), "modules": (),
                         "fabric_options": {**base.fabric_options,
                                            "host_injection": {"env": {"LD_LIBRARY_PATH": INJECTED}}}})
    stage_record(storage / f"{ENV.name}.sqsh")  # staged: the wrappers check the image before ch-run opens it
    modules.write_modules(SHIPPED, [ENV], cluster, d / "prefix")
    student = d / "home" / "alice" / "course dir"
    student.mkdir(parents=True)
    return {"dir": d, "student": student, "wrapper": modules.wrapper_dir(d / "prefix", ENV.name) / "python",
            "image": str(storage / f"{ENV.name}.sqsh")}


def _no_user_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("USER", "NCCL_DEBUG") and not k.startswith(("LMOD", "MODULE", "_LMFILES_", "LOADEDMODULES"))}
    return {**env, **extra}


def _check_ran_inside(out: str, student: Path) -> None:
    lines = out.splitlines()
    assert "marker=inside the image" in lines, out
    assert f"cwd={student}" in lines and "site=site data" in lines
    assert "nccl_debug=WARN" in lines, "the module's variable must win over the image's /etc/environment"
    assert f"ld={INJECTED}:/opt/image/lib" in lines, "the injected path goes in front of the image's, nothing else"
    assert "user=root" in lines, "the wrapper exports $USER (ch-run stops without it)"
    assert [ln[5:-1] for ln in lines if ln.startswith("arg=[")] == HOSTILE
    mount_points = {ln.split()[4] for ln in lines if len(ln.split()) > 4 and ln.split()[3].startswith("/")}
    assert str(student).replace(" ", "\\040") in mount_points, "ch-run did not bind the student's directory"
    assert not list(student.glob("pwned*"))


def test_wrapper_runs_the_tool_in_the_image_in_the_students_directory_with_exact_arguments(site):
    res = subprocess.run([str(site["wrapper"]), *HOSTILE], cwd=site["student"], capture_output=True, text=True,
                         env=_no_user_env(NCCL_DEBUG="WARN", LD_LIBRARY_PATH=f"{INJECTED}:{HOST_LD}"),
                         timeout=30)  # as the modulefile sets them
    assert res.returncode == 0, res.stdout + res.stderr
    _check_ran_inside(res.stdout, site["student"])


def test_lmod_loads_the_module_and_the_tool_runs_by_name(site):
    if not LMOD_INIT.exists():
        pytest.fail("Lmod is required: apt-get install lmod (`invoke test` installs it)")
    script = (f"set -e; source {LMOD_INIT}; module use {shlex.quote(str(site['dir'] / 'prefix' / 'modulefiles'))}; "
              f"module load shipyard/{ENV.name}; unset USER; cd {shlex.quote(str(site['student']))}; "
              'echo "which=$(command -v python)"; echo "image=$SHIPYARD_IMAGE"; echo "host_ld=$LD_LIBRARY_PATH"; '
              f"python {' '.join(shlex.quote(a) for a in HOSTILE)}; "
              f'module unload shipyard/{ENV.name}; echo "unloaded_ld=$LD_LIBRARY_PATH"')
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         env=_no_user_env(LD_LIBRARY_PATH=HOST_LD), timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"which={site['wrapper']}" in res.stdout.splitlines() and f"image={site['image']}" in res.stdout
    # prepend_path: the shell's own path stays behind the injected one, and unload gives back exactly the old one
    assert f"host_ld={INJECTED}:{HOST_LD}" in res.stdout.splitlines()
    assert f"unloaded_ld={HOST_LD}" in res.stdout.splitlines()
    _check_ran_inside(res.stdout, site["student"])


def test_a_directory_with_a_colon_is_refused_in_one_line(site):
    """ch-run would split ``-b a:b`` at the colon and bind the wrong directory: the wrapper says so instead."""
    odd = site["dir"] / "home" / "a:b"
    odd.mkdir(parents=True)
    res = subprocess.run([str(site["wrapper"]), "x"], cwd=odd, capture_output=True, text=True, env=_no_user_env(),
                         timeout=30)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == f"python: ch-run cannot bind a directory whose path has a ':' ({odd}); run it from another " \
                         "directory\n"


def test_invoke_modules_writes_a_charliecloud_clusters_module(tmp_path):
    """`invoke modules ENV --cluster C` for a `runtime: charliecloud` cluster (it was refused)."""
    reg = yaml.safe_load((ROOT / "registry.yaml").read_text())
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / f"{ENV.name}.sqsh").write_bytes(b"staged\n")
    stage_record(storage / f"{ENV.name}.sqsh")
    reg["clusters"]["ch-site"] = {**reg["clusters"]["grete"], "runtime": "charliecloud", "modules": [],
                                  "storage": str(storage),
                                  "gpu_injection": "ch-fromhost --nvidia on the staged images"}  # else check ERRORs
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump(reg))
    res = invoke_cli("modules", ENV.name, "--cluster", "ch-site", "--prefix", str(tmp_path / "m"), cwd=ROOT,
                     env={**os.environ, "SHIPYARD_REGISTRY": str(tmp_path / "registry.yaml")}, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "wrote 1 modulefile(s) and 5 wrapper(s), which run 1 image check(s) first" in res.stdout
    assert f"module load shipyard/{ENV.name}" in res.stdout
    wrapper = (modules.wrapper_dir(tmp_path / "m", ENV.name) / "torchrun").read_text()
    assert "\nexec ch-run -b /scratch:/scratch -b /mnt/lustre-grete:/mnt/lustre-grete -b \"$PWD\" --cd \"$PWD\" " \
           f"{storage}/{ENV.name}.sqsh -- /bin/sh -c " in wrapper
