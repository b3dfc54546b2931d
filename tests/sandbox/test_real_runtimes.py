"""Real pyxis 0.24.0 + enroot 4.1.2 (built from ../shared/vendor by `invoke sandbox.runtimes`) on the real 2-node
sandbox: container steps on both nodes, each node with its own enroot/pyxis paths, the epilog leaving the nodes idle,
pyxis's options checked inside the container, and a named container reused by a later job on the same node."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shipyard.sandbox import runtimes

pytestmark = [pytest.mark.slurm, pytest.mark.real_runtimes]


def _srun(sandbox, image: Path, *args: str, env: dict | None = None):
    argv = ["srun", "-N2", "--ntasks-per-node=1", f"--container-image={image}", *args]
    res = sandbox.run(argv, client_timeout=120, env={**sandbox.env(), **(env or {})})
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _wait_idle(sandbox, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while True:
        out = sandbox.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
        if all(line.endswith(" idle") for line in out.split("\n")[:-1]) or time.monotonic() > deadline:
            return out
        time.sleep(0.3)


def test_two_node_step_in_the_real_container_each_node_its_own_paths(sandbox, real_pyxis, busybox_sqsh):
    out = _srun(sandbox, busybox_sqsh, "sh", "-c", 'echo "$(hostname) $IMAGE_ONLY $(ls /bin/busybox)"')
    assert sorted(out.split("\n")[:-1]) == [f"{n} from-image /bin/busybox" for n in sandbox.nodes]
    # the epilog (pyxis runs enroot with no PATH) did not drain a node
    assert _wait_idle(sandbox).split("\n")[:-1] == [f"{n} idle" for n in sandbox.nodes]
    # enroot is where the epilog finds it, and each node kept its own runtime path
    assert Path("/usr/bin/enroot").is_file()
    for n in sandbox.nodes:
        assert (runtimes.node_dir(sandbox.directory, n) / "pyxis").is_dir()
    line = (Path(sandbox.directory) / "etc" / "plugstack.conf").read_text()
    assert line.startswith("required ") and "runtime_path=" in line and "container_scope=global" in line


def test_the_images_path_finds_the_images_commands(sandbox, real_pyxis, busybox_sqsh):
    """The image's PATH (its /etc/environment) is the step's PATH: a bare command the image has on its own PATH runs,
    as the launcher's `exec torchrun` needs, with the job's PATH set to the host's."""
    out = _srun(sandbox, busybox_sqsh, "sh", "-c", 'image-tool; echo "$PATH"', env={"PATH": "/usr/bin:/bin"})
    assert sorted(out.split("\n")[:-1]) == sorted(["image-tool ran", "/opt/image/bin:/bin"] * 2)


def test_a_debian_profile_resets_the_path_and_both_fixes_bring_it_back(sandbox, real_pyxis, debian_profile_sqsh,
                                                                        debian_profile_recipe_sqsh):
    """What the real Debian 12 image hit: enroot starts the container through a login shell (ENROOT_LOGIN_SHELL
    defaults to yes), /etc/profile resets PATH, and every task gets that PATH, so the image's command is not found.
    Shipyard's images carry the recipe's /etc/profile.d file; for an external image the pyxis launcher puts the
    PATH of /etc/environment (the image's ENV, as `enroot import` writes it) back in front."""
    from shipyard.runtimes import pyxis

    lost = _srun(sandbox, debian_profile_sqsh, "sh", "-c", 'echo "$PATH"; command -v image-tool || echo missing')
    assert sorted(lost.split("\n")[:-1]) == sorted(["/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                                    "missing"] * 2)
    prelude = pyxis.Pyxis().image_path_prelude()
    fixed = _srun(sandbox, debian_profile_sqsh, "sh", "-c", f'{prelude}; exec "$@"', "x", "image-tool")
    assert fixed.split("\n")[:-1] == ["image-tool ran"] * 2
    recipe = _srun(sandbox, debian_profile_recipe_sqsh, "sh", "-c", 'image-tool; echo "$PATH"')
    assert sorted(recipe.split("\n")[:-1]) == sorted(["image-tool ran", "/opt/image/bin:/usr/local/sbin:/usr/local/bin:"
                                                      "/usr/sbin:/usr/bin:/sbin:/bin"] * 2)


def test_mounts_workdir_env_and_hostile_arguments_inside_the_container(sandbox, real_pyxis, busybox_sqsh,
                                                                       tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    tmp_path.chmod(0o755)
    (data / "in.txt").write_text("mounted\n")
    hostile = "a b;$(touch /tmp/pwned)'\"`x`"
    script = ('printf "%s|%s|%s|%s|%s\\n" "$(cat /mnt/in.txt)" "$(pwd)" "$FOO" "$IMAGE_ONLY" "$1"; '
              'test ! -e /tmp/pwned')
    out = _srun(sandbox, busybox_sqsh, f"--container-mounts={data}:/mnt:ro", "--container-workdir=/work",
                "--container-env=FOO,IMAGE_ONLY", "--no-container-mount-home",
                "sh", "-c", script, "sh", hostile, env={"FOO": "from-job", "IMAGE_ONLY": "overridden"})
    assert out.split("\n")[:-1] == [f"mounted|/work|from-job|overridden|{hostile}"] * 2


def test_a_named_container_is_reused_by_a_later_job_on_the_same_node(sandbox, real_pyxis, busybox_sqsh):
    """container_scope=global: the second job finds what the first wrote in the container (no new unpack)."""
    name = f"shipyard-reuse-{time.monotonic_ns()}"
    _srun(sandbox, busybox_sqsh, f"--container-name={name}", "--container-writable", "sh", "-c",
          "echo first > /root/marker")
    out = _srun(sandbox, busybox_sqsh, f"--container-name={name}", "sh", "-c", 'echo "$(hostname) $(cat /root/marker)"')
    assert sorted(out.split("\n")[:-1]) == [f"{n} first" for n in sandbox.nodes]
    for n in sandbox.nodes:  # the unpacked container lives in that node's own data path
        assert (runtimes.node_dir(sandbox.directory, n) / "enroot" / "data" / f"pyxis_{name}").is_dir()


def test_injected_library_path_is_prepended_to_the_images_inside_the_real_container(sandbox, real_pyxis,
                                                                                   busybox_sqsh):
    """The host-injection prepend, checked in a real pyxis container whose image sets LD_LIBRARY_PATH=/opt/image/lib: the launcher's
    in-container prefix keeps the image's path; the old way (export + --container-env) replaced it."""
    from types import SimpleNamespace

    from shipyard.launch.fabric import EnvVar
    from shipyard.launch.launcher import _prepend_exports

    script = _prepend_exports(SimpleNamespace(env=[EnvVar("LD_LIBRARY_PATH", "/opt/host/lib", prepend=True)]))
    out = _srun(sandbox, busybox_sqsh, "sh", "-c", script + '; exec "$@"', "shipyard-env",
                "sh", "-c", 'echo "$LD_LIBRARY_PATH"', env={"LD_LIBRARY_PATH": "/host/only"})
    assert out.split("\n")[:-1] == ["/opt/host/lib:/opt/image/lib"] * 2
    old = _srun(sandbox, busybox_sqsh, "--container-env=LD_LIBRARY_PATH", "sh", "-c", 'echo "$LD_LIBRARY_PATH"',
                env={"LD_LIBRARY_PATH": "/opt/host/lib"})
    assert old.split("\n")[:-1] == ["/opt/host/lib"] * 2  # the image's /opt/image/lib is gone: what the prepend prevents


def test_invoke_shell_command_runs_in_the_real_container(sandbox, real_pyxis, busybox_sqsh, tmp_path, invoke):
    """`invoke shell --runtime pyxis --command` on the sandbox with the real pyxis: the command runs in the image on
    a node (the image's own environment and PATH, the submit directory mounted as the workdir)."""
    import os
    import shutil

    from fixtures_tools import write_tools_registry

    from shipyard import sandbox as sb

    from fixtures_launch import stage_record

    image = tmp_path / ".sandbox" / "images" / "pytorch-2.3.sqsh"
    image.parent.mkdir(parents=True)
    shutil.copy(busybox_sqsh, image)
    stage_record(image)  # staged: the shell checks the image before srun
    env = {**os.environ, "SHIPYARD_REGISTRY": str(write_tools_registry(tmp_path)),
           sb.DIR_ENV: str(sandbox.directory)}
    proc = invoke("shell", "--cluster", "sandbox", "--runtime", "pyxis", "--command",
                  'echo "$IMAGE_ONLY $(hostname) $PWD"; image-tool; ls /bin/busybox', cwd=tmp_path, env=env,
                  timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second, third = proc.stdout.splitlines()[-3:]
    only, host, pwd = first.split()
    assert only == "from-image" and host in sandbox.nodes and pwd == str(tmp_path)
    assert second == "image-tool ran" and third == "/bin/busybox"
