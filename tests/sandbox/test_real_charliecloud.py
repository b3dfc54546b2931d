"""Real Charliecloud (Debian 12's ch-run 0.31, which mounts a SquashFS itself through libsquashfuse) on the real
2-node sandbox: the words shipyard's charliecloud runtime renders run a container step on both nodes, from the same
kind of ``.sqsh`` a pyxis cluster stages (enroot's ``/etc/environment``) and from one with Charliecloud's own
``/ch/environment``; binds, the working directory, the job's variables over the image's, hostile arguments, the
image's PATH and the host-injection library prepend are checked inside the container, on each node."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from shipyard import runtimes
from shipyard.launch.fabric import EnvVar
from shipyard.launch.launcher import _prepend_exports
from shipyard.runtimes import Placement
from shipyard.runtimes.mounts import Mount

pytestmark = [pytest.mark.slurm]


@pytest.fixture(scope="module")
def ch_run():
    path = shutil.which("ch-run")
    assert path, "charliecloud-runtime is in shipyard/data/test-packages.txt"
    return path


@pytest.fixture(scope="module")
def ch_environment_sqsh(busybox_sqsh, tmp_path_factory) -> Path:
    """The busybox image again, with Charliecloud's /ch/environment (other values) beside enroot's
    /etc/environment: ch-run's convention wins."""
    d = tmp_path_factory.mktemp("ch-image")
    d.chmod(0o755)
    rootfs = d / "rootfs"
    subprocess.run(["unsquashfs", "-q", "-d", str(rootfs), str(busybox_sqsh)], check=True, stdout=subprocess.DEVNULL)
    (rootfs / "ch").mkdir()
    (rootfs / "ch" / "environment").write_text("PATH=/opt/image/bin:/bin\nLD_LIBRARY_PATH=/opt/ch/lib\n"
                                               "IMAGE_ONLY='from ch'\n")
    out = d / "ch.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(out), "-noappend", "-quiet", "-all-root"], check=True,
                   stdout=subprocess.DEVNULL)
    out.chmod(0o644)
    return out


def _srun(sandbox, image: Path, command: list[str], mounts=(), workdir="/", env_names=(), env=None) -> list[str]:
    """One 2-node step running ``command`` through exactly the words the charliecloud runtime renders."""
    words = runtimes.get("charliecloud").exec_words(Placement(str(image), tuple(mounts), workdir, tuple(env_names)))
    argv = ["srun", "-N2", "--ntasks-per-node=1", *words, *command]
    res = sandbox.run(argv, client_timeout=120, env={**sandbox.env(), "USER": "root", **(env or {})})
    assert res.returncode == 0, res.stdout + res.stderr
    return sorted(res.stdout.split("\n")[:-1])


def test_two_node_step_from_the_pyxis_sqsh_runs_the_images_path_each_node_its_own(sandbox, ch_run, busybox_sqsh):
    """The same .sqsh pyxis runs: its /etc/environment applies, so a bare command only the image's PATH finds runs
    (as the launcher's `exec torchrun` needs), with the job's PATH the host's; one container per node."""
    out = _srun(sandbox, busybox_sqsh, ["sh", "-c", 'image-tool; echo "$(hostname)|$PATH|$IMAGE_ONLY|$CH_RUNNING"'],
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "IMAGE_ONLY": "host"})
    assert out == sorted(["image-tool ran"] * 2 + [f"{n}|/opt/image/bin:/bin|from-image|Weird Al Yankovic"
                                                   for n in sandbox.nodes])


def test_ch_environment_wins_over_etc_environment(sandbox, ch_run, ch_environment_sqsh):
    out = _srun(sandbox, ch_environment_sqsh, ["sh", "-c", 'echo "$IMAGE_ONLY|$LD_LIBRARY_PATH"'])
    assert out == ["from ch|/opt/ch/lib"] * 2


def test_binds_workdir_job_variables_and_hostile_arguments_inside_the_container(sandbox, ch_run, busybox_sqsh,
                                                                                tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    tmp_path.chmod(0o755)
    (data / "in.txt").write_text("mounted\n")
    hostile = "a b;$(touch /tmp/pwned-ch)'\"`x`"
    script = ('printf "%s|%s|%s|%s|%s|%s\\n" "$(hostname)" "$(cat in.txt)" "$(pwd)" "$FOO" "$IMAGE_ONLY" "$1"; '
              'test ! -e /tmp/pwned-ch')
    out = _srun(sandbox, busybox_sqsh, ["sh", "-c", script, "sh", hostile], mounts=[Mount(str(data), "/work", True)],
                workdir="/work", env_names=("FOO", "IMAGE_ONLY"),
                env={"FOO": "from-job $(x) 'q'", "IMAGE_ONLY": "overridden"})
    assert out == [f"{n}|mounted|/work|from-job $(x) 'q'|overridden|{hostile}" for n in sorted(sandbox.nodes)]
    assert not Path("/tmp/pwned-ch").exists()


def test_injected_library_path_is_prepended_to_the_images_inside_the_real_container(sandbox, ch_run, busybox_sqsh):
    """The host-injection prepend with Charliecloud: the launcher's in-container prefix keeps the image's /opt/image/lib, and the
    host's own LD_LIBRARY_PATH (which ch-run passes through) does not leak in front of the image's."""
    script = _prepend_exports(SimpleNamespace(env=[EnvVar("LD_LIBRARY_PATH", "/opt/host/lib", prepend=True)]))
    out = _srun(sandbox, busybox_sqsh, ["sh", "-c", script + '; exec "$@"', "shipyard-env",
                                        "sh", "-c", 'echo "$LD_LIBRARY_PATH"'],
                env={"LD_LIBRARY_PATH": "/host/only"})
    assert out == ["/opt/host/lib:/opt/image/lib"] * 2


def test_a_bare_set_env_cannot_run_the_pyxis_sqsh(sandbox, ch_run, busybox_sqsh):
    """Why the runtime reads the image's variables itself: ch-run's bare --set-env reads only /ch/environment, which
    an image `enroot import` made does not have, and stops."""
    res = sandbox.run(["srun", "-N1", "ch-run", "--set-env", str(busybox_sqsh), "--", "true"], client_timeout=60,
                      env={**sandbox.env(), "USER": "root"})
    assert res.returncode != 0 and "/ch/environment" in res.stderr, res.stdout + res.stderr
