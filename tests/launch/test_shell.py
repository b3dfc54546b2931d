"""invoke shell: command construction per runtime, quoting of hostile site values, the ssh snippet, bad input."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest
from fixtures_launch import fake_build_manifest, replace_staged_image, stage_record
from fixtures_tools import HOSTILE_STORAGE, write_tools_registry
from helpers_registry import GOLDEN, ROOT, golden

from shipyard.errors import ShipyardError
from shipyard.launch import shell


def bash_words(line: str) -> list[str]:
    """What bash makes of a command line: the words it would pass to the program, without running it."""
    res = subprocess.run(["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, text=True, check=True)
    return res.stdout.split("\0")[:-1]


CASES = [
    ("grete", None), ("grete", "nvidia-smi -L"),
    ("aws-pcluster", None), ("aws-pcluster", "python -c 'import torch; print(torch.__version__)'"),
    ("sandbox", None), ("sandbox", "hostname"),
]



def _plan(reg, env, cluster, **kw) -> shell.ShellPlan:
    """``shell.build`` as the shell command calls it: the names resolved to objects first."""
    return shell.build(reg, reg.environment(env), reg.cluster(cluster), **kw)

@pytest.mark.parametrize("cluster,command", CASES)
def test_dry_run_golden(tools_registry, cluster, command):
    plan = _plan(tools_registry, None, cluster, command=command, user="alice")
    text = shell.command_line(plan) + "\n\n" + plan.snippet + "\n"
    name = f"{cluster}.{'command' if command else 'interactive'}.txt"
    golden(GOLDEN / "shell" / name, text.replace(str(tools_registry.root), "<root>"))


@pytest.mark.parametrize("cluster,command", CASES)
def test_printed_line_is_exactly_the_argv(tools_registry, cluster, command):
    plan = _plan(tools_registry, None, cluster, command=command, user="alice")
    line = shell.command_line(plan)
    srun_part = line.split(" && ")[-1]
    assert bash_words(srun_part) == list(plan.argv)


def test_runtimes_follow_the_launcher_rules(tools_registry):
    ap = _plan(tools_registry, None, "grete", user="alice")
    argv = list(ap.argv)
    assert argv[:2] == ["srun", "--partition=grete-interactive"]  # the interactive partition, not the batch one
    assert "--pty" in argv
    i = argv.index("apptainer")
    assert argv[i:i + 3] == ["apptainer", "shell", "--nv"]
    assert argv[i + 4] == f"{tools_registry.root}:{tools_registry.root},/scratch:/scratch,/mnt/lustre-grete:/mnt/lustre-grete"
    assert argv[-1] == "/scratch/projects/shipyard/images/pytorch-2.3.sif"
    assert not [a for a in argv if a.startswith("--contain")]
    assert ap.modules == ("apptainer",)
    px = list(_plan(tools_registry, "pytorch-2.5", "aws-pcluster", user="alice").argv)
    assert "--container-image=/fsx/shipyard/images/pytorch-2.5.sqsh" in px
    assert px.index("--pty") < px.index("bash") and px[-1] == "bash"
    host = list(_plan(tools_registry, None, "sandbox", command="hostname", user="alice").argv)
    assert host == ["srun", "--partition=debug", "--nodes=1", "--ntasks=1", "--job-name=shipyard-shell",
                    "--gpus-per-node=1", "--time=00:10:00", "bash", "-c", "hostname"]


def test_hostile_site_values_stay_words_and_never_run(tools_registry, tmp_path):
    cmd = "python t.py 'a b' '$(touch PWNED)' ';' \"it's\" 'ü\nx'"
    for cluster in ("hostile", "hostile-pyxis"):
        for command in (None, cmd):
            plan = _plan(tools_registry, None, cluster, command=command, user="o'neil")
            line = shell.command_line(plan)
            words = bash_words(line.split(" && ")[-1])
            assert words == list(plan.argv)
            assert any(HOSTILE_STORAGE in w for w in words)
            if command:
                assert words[-3:] == ["bash", "-c", cmd]  # one shell string, run by bash on the node
    loads = shell.command_line(_plan(tools_registry, None, "hostile", user="x")).split(" && ")[:-1]
    assert [bash_words(l) for l in loads] == [["module", "load", "apptainer/1.3 $(id)"], ["module", "load", "cuda;12"]]
    assert not list(tmp_path.rglob("PWNED")) and not (ROOT / "PWNED").exists()


def test_dry_run_line_passes_shellcheck(tools_registry, tmp_path):
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck is required"
    for cluster in ("grete", "hostile", "aws-pcluster", "sandbox"):
        for command in (None, "echo 'a b' \"$HOME\""):
            script = tmp_path / f"{cluster}.sh"
            script.write_text("#!/bin/bash\n" + shell.command_line(
                _plan(tools_registry, None, cluster, command=command, user="alice")) + "\n")
            res = subprocess.run([exe, "-S", "warning", str(script)], capture_output=True, text=True)
            assert res.returncode == 0, res.stdout


def test_prelude_prints_the_snippet_with_this_hosts_name(tools_registry):
    """The node-side part of the interactive command, run here with a stand-in for the shell it execs."""
    plan = _plan(tools_registry, None, "grete", user="alice")
    argv = list(plan.argv)
    start = argv.index("bash")
    node = argv[start:start + 5] + ["echo", "shell started"]
    out = subprocess.run(node, capture_output=True, text=True, check=True).stdout
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert f"    HostName {host}\n" in out
    assert "    ProxyJump alice@login.grete.example\n" in out
    assert out.endswith("shell started\n")


def test_snippet_without_login_says_where_to_set_it(tools_registry):
    text = shell.ssh_snippet(tools_registry.cluster("aws-pcluster"), "bob")
    assert "ProxyJump <login node of aws-pcluster: set clusters.aws-pcluster.login in registry.yaml>" in text


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"cluster_name": "grete", "gpus": 5}, "--gpus 5: partition grete-interactive of cluster grete has 4 GPUs per node"),
        ({"cluster_name": "grete", "gpus": "two"}, "--gpus 'two': expected an integer"),
        ({"cluster_name": "nope"}, "nope"),
        ({"env_name": "nope"}, "nope"),
        ({"command": "  "}, "--command '': give the command"),
        ({"command": "echo 'unterminated"}, "--command"),
    ],
)
def test_bad_input(tools_registry, kwargs, message):
    with pytest.raises(ShipyardError, match=message.replace("(", r"\(")):
        _plan(tools_registry, kwargs.pop("env_name", None), kwargs.pop("cluster_name", None), **kwargs)


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_task_dry_run_prints_command_and_snippet(tmp_path, invoke):
    reg = write_tools_registry(tmp_path)
    # a preview before anything is built: the line, and a note that running it is refused until then
    unbound = invoke("shell", "--cluster", "grete", "--dry-run", cwd=tmp_path, env=_env(reg))
    assert unbound.returncode == 0, unbound.stderr
    assert "no image to check the shell's image against" in unbound.stdout and "refuses to start it" in unbound.stdout
    assert "check-image.sh" not in unbound.stdout.splitlines()[0]
    refused = invoke("shell", "--cluster", "grete", "--command", "true", cwd=tmp_path, env=_env(reg))
    assert refused.returncode == 2 and "no image to check the shell's image against" in refused.stderr
    fake_build_manifest(tmp_path, "pytorch-2.3", "sif")
    proc = invoke("shell", "--cluster", "grete", "--dry-run", cwd=tmp_path, env=_env(reg))
    assert proc.returncode == 0, proc.stderr
    first, _, rest = proc.stdout.partition("\n")
    check = tmp_path / "launch" / f"pytorch-2.3-{'a' * 16}.check-image.sh"
    assert first.startswith(f"bash {check} && module load apptainer && srun --partition=grete-interactive")
    assert f"want_sha={'a' * 64}" in check.read_text() and os.access(check, os.X_OK)
    assert "HostName <the node srun allocates; the shell prints it when it starts>" in rest
    bad = invoke("shell", "--cluster", "grete", "--gpus", "9", "--dry-run", cwd=tmp_path, env=_env(reg))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--gpus 9" in bad.stderr


# one runtime in the quick loop, the others (the same check, other words around it) with the slow tests
@pytest.mark.parametrize("runtime,suffix", [("apptainer", "sif"), pytest.param("pyxis", "sqsh", marks=pytest.mark.slow),
                                            pytest.param("charliecloud", "sqsh", marks=pytest.mark.slow)])
def test_a_replaced_image_is_refused_before_srun(tmp_path, invoke, runtime, suffix):
    """The shell (and --command) runs the image check on the login node first: a staged image replaced with its
    record rewritten stops there, exit 3 and one line, and srun is never asked (no Slurm here to ask)."""
    reg = write_tools_registry(tmp_path)
    image = tmp_path / ".sandbox" / "images" / f"pytorch-2.3.{suffix}"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"the staged image\n" * 500)
    stage_record(image)
    replace_staged_image(image)
    env = {**_env(reg), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for extra in (["--command", "true"], []):
        proc = invoke("shell", "--cluster", "sandbox", "--runtime", runtime, *extra, cwd=tmp_path, env=env)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert [ln for ln in proc.stderr.splitlines() if "error" in ln] == [
            ln for ln in proc.stderr.splitlines() if ln.startswith(f"shipyard: error: staged image {image} has content")]
        assert "srun" not in proc.stderr


def _env(reg):
    return {**os.environ, "SHIPYARD_REGISTRY": str(reg)}


# ------------------------------------------------------------------------------------------------ real Slurm


@pytest.fixture
def sandbox_env(sandbox, tmp_path):
    from shipyard import sandbox as sb

    reg = write_tools_registry(tmp_path)
    return {**os.environ, "SHIPYARD_REGISTRY": str(reg), sb.DIR_ENV: str(sandbox.directory)}


@pytest.mark.slurm
def test_command_runs_on_a_sandbox_node(sandbox, sandbox_env, tmp_path, invoke):
    cmd = "sh -c 'echo $SLURM_JOB_NAME $(hostname) gpus=$CUDA_VISIBLE_DEVICES; printf \"%s|\" \"$@\"' x 'a b' '$(id)'"
    proc = invoke("shell", "--cluster", "sandbox", "--command", cmd, cwd=tmp_path, env=sandbox_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    name, host, gpus = first.split()
    assert name == "shipyard-shell" and host in sandbox.nodes and gpus == "gpus=0"  # one GPU requested by default
    assert second == "a b|$(id)|"
    failed = invoke("shell", "--cluster", "sandbox", "--gpus", "0", "--command", "sh -c 'exit 3'", cwd=tmp_path,
                    env=sandbox_env, timeout=120)
    assert failed.returncode == 3


@pytest.mark.slurm
def test_interactive_shell_on_a_node_prints_the_snippet(sandbox, sandbox_env, tmp_path, invoke):
    """`srun --pty` needs a terminal: util-linux `script` gives the task one, and the typed lines go to the shell."""
    inner = shlex.join(invoke.argv("shell", "--cluster", "sandbox"))
    proc = subprocess.run(["script", "-qec", inner, "/dev/null"], input="echo inside-$SLURM_JOB_NAME-$(hostname)\nexit\n",
                          cwd=tmp_path, capture_output=True, text=True, env=sandbox_env, timeout=120)
    out = proc.stdout.replace("\r", "")
    assert proc.returncode == 0, out + proc.stderr
    node = [line.split()[1] for line in out.splitlines() if line.strip().startswith("HostName ")]
    assert node and node[0] in sandbox.nodes
    assert f"inside-shipyard-shell-{node[0]}" in out
    assert "Host shipyard-sandbox-node" in out


@pytest.mark.slurm
@pytest.mark.real_apptainer
def test_apptainer_runtime_on_a_sandbox_node_in_the_real_container(sandbox, sandbox_env, busybox_sif, tmp_path,
                                                                   apptainer_on_path, invoke):
    """`--runtime apptainer` on the sandbox with the real Apptainer: `--command` runs in the image on a node (the
    image's environment and PATH, the submit directory bound as the workdir, the home directory kept: a shell is
    the user's); the interactive form starts `apptainer shell` in the container under a terminal."""
    image = tmp_path / ".sandbox" / "images" / "pytorch-2.3.sif"
    image.parent.mkdir(parents=True)
    shutil.copy(busybox_sif, image)
    stage_record(image)  # staged: the shell checks the image before srun
    env = {**sandbox_env, "PATH": f"{apptainer_on_path}{os.pathsep}{sandbox_env['PATH']}"}
    proc = invoke("shell", "--cluster", "sandbox", "--runtime", "apptainer", "--command",
                  'echo "$APPTAINER_CONTAINER $(hostname) $PWD $IMAGE_ONLY"; image-tool; '
                  'grep -c " $HOME " /proc/self/mountinfo', cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second, third = proc.stdout.splitlines()[-3:]
    container, host, pwd, only = first.split()
    assert container == str(image) and host in sandbox.nodes and pwd == str(tmp_path) and only == "from-image"
    assert second == "image-tool ran" and third == "1"  # the home directory is mounted
    # The interactive form: `apptainer shell` under a terminal, the snippet printed first.
    inner = shlex.join(invoke.argv("shell", "--cluster", "sandbox", "--runtime", "apptainer"))
    res = subprocess.run(["script", "-qec", inner, "/dev/null"],
                         input="echo in-$APPTAINER_CONTAINER-$APPTAINER_COMMAND\nexit\n", cwd=tmp_path,
                         capture_output=True, text=True, env={**env, "SHELL": "/bin/bash"}, timeout=120)
    out = res.stdout.replace("\r", "")
    assert res.returncode == 0, out + res.stderr
    assert f"in-{image}-shell" in out and "Host shipyard-sandbox-node" in out


@pytest.mark.slurm
@pytest.mark.double
def test_pyxis_runtime_flags_reach_the_node(sandbox, sandbox_env, tmp_path, pyxis_double, invoke):
    """`--runtime pyxis` on the sandbox: srun accepts the pyxis flags (the SPANK **test double** registers them and
    hands each task what it received); no container is started."""
    image = tmp_path / ".sandbox" / "images" / "pytorch-2.3.sqsh"
    image.parent.mkdir(parents=True)
    (tmp_path / "rootfs").mkdir()
    subprocess.run(["mksquashfs", str(tmp_path / "rootfs"), str(image), "-noappend", "-quiet"], check=True,
                   capture_output=True)
    stage_record(image)
    proc = invoke("shell", "--cluster", "sandbox", "--runtime", "pyxis", "--command", "env", cwd=tmp_path,
                  env=sandbox_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split("=", 1) for line in proc.stdout.splitlines() if line.startswith("SHIPYARD_PYXIS_DOUBLE_"))
    assert got["SHIPYARD_PYXIS_DOUBLE_CONTAINER_IMAGE"] == str(image)
    assert got["SHIPYARD_PYXIS_DOUBLE_CONTAINER_MOUNTS"] == f"{tmp_path}:{tmp_path}"
    assert got["SHIPYARD_PYXIS_DOUBLE_CONTAINER_WORKDIR"] == str(tmp_path)


def test_command_is_one_shell_string_and_shells_have_a_time_limit(tools_registry):
    """`--command 'hostname; nproc'` runs as one bash command line on the node; without --time a shell gets
    launch.yaml's shell_time, or the cluster's shorter scheduler.time (a forgotten shell must not hold a node)."""
    from dataclasses import replace

    from shipyard.launch import options

    plan = _plan(tools_registry, None, "sandbox", command="hostname; nproc", user="alice")
    assert list(plan.argv[-3:]) == ["bash", "-c", "hostname; nproc"]
    assert "--time=00:10:00" in plan.argv  # the sandbox's scheduler.time is shorter than shell_time
    cl = replace(tools_registry.cluster("grete"), time=None)
    no_time = shell.build(tools_registry, tools_registry.environment(None), cl, user="alice")
    assert f"--time={options.defaults()['shell_time']}" in no_time.argv
    assert "--time=00:05:00" in _plan(tools_registry, None, "grete", time="00:05:00", user="alice").argv


def test_command_gets_the_host_injections_paths_in_front_of_the_images(tools_registry):
    """A host-injected library path goes in front of the container's own value inside it, as in a launcher,
    also for `invoke shell --command`; nothing of it is exported from the host."""
    from dataclasses import replace

    cl = tools_registry.cluster("sandbox")
    cl = replace(cl, fabric_options={**cl.fabric_options, "host_injection": {
        "binds": ["/opt/amazon/efa"], "env": {"LD_LIBRARY_PATH": "/opt/amazon/efa/lib"}}})
    plan = shell.build(tools_registry, tools_registry.environment(None), cl, command="ldd x", user="alice")
    assert plan.argv[-3:] == ("bash", "-c", "export LD_LIBRARY_PATH=/opt/amazon/efa/lib\"${LD_LIBRARY_PATH:+:"
                                            "$LD_LIBRARY_PATH}\"; ldd x")
    out = subprocess.run(["bash", "-c", plan.argv[-1].replace("ldd x", 'echo "$LD_LIBRARY_PATH"')],
                         env={"LD_LIBRARY_PATH": "/opt/image/lib", "PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True).stdout
    assert out == "/opt/amazon/efa/lib:/opt/image/lib\n"
