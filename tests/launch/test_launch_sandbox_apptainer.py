"""Launchers written by `invoke launch --runtime apptainer` on the real 2-node sandbox with the real Apptainer 1.4.5,
in a real SIF (tests/fixtures_runtimes.py's busybox_sif: static busybox, the host's bash, a torchrun stand-in that
records what it received, and an image environment of its own). What the real pyxis tests check, inside the
container on both nodes: the cluster's module puts apptainer on PATH, mounts, workdir, the launcher's variables over
the image's, no home, hostile arguments, the image check before srun, a missing image; the host-injection prefix;
an unprivileged user in setuid mode and in user-namespace mode."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from fixtures_launch import HOSTILE_ARGS, as_user, make_user, run_launch, stage_record, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.real_apptainer]

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def stand_in_records(project: Path, job: str) -> dict[str, dict]:
    """What the torchrun stand-in recorded on each node (by node name): argv and env as lists/dicts, the rest text."""
    out = {}
    for d in sorted((project / "probe-out").glob(f"{job}-*")):
        rec = {f.name: f.read_bytes() for f in d.iterdir()}
        env = dict(kv.split("=", 1) for kv in rec["env"].decode().split("\0")[:-1])
        out[rec["host"].decode().strip()] = {
            "argv": rec["argv"].decode().split("\0")[:-1], "options": rec["options"].decode().split("\0")[:-1],
            "env": env, "cwd": rec["cwd"].decode().strip(), "uid": int(rec["uid"]), "data": rec["data"].decode(),
            "mount_points": [line.split()[4] for line in rec["mounts"].decode().splitlines()]}
    return out


def _submit_written(sandbox, launcher: Path, user: list[str] = ()) -> str:
    res = subprocess.run(sandbox.argv([*user, "sbatch", "--parsable", str(launcher)]), capture_output=True, text=True,
                         timeout=60, env=sandbox.env())
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


@pytest.fixture
def staged_sif(sandbox_project, busybox_sif) -> Path:
    """The busybox SIF staged where the sandbox cluster's storage keeps pytorch-2.3's image, with its stage record."""
    image = sandbox_project / ".sandbox" / "images" / "pytorch-2.3.sif"
    image.parent.mkdir(parents=True)
    shutil.copy(busybox_sif, image)
    stage_record(image)
    return image


def test_launcher_runs_in_the_real_container_on_both_nodes(sandbox, sandbox_project, staged_sif, real_apptainer,
                                                           monkeypatch):
    """The cluster's `module load apptainer` runs in real Lmod and puts the real apptainer on PATH (as a site's
    module does); the job's own PATH has none. Inside the container on each node: the image's PATH and variables,
    the launcher's variables over the image's (APPTAINERENV_), the host's LD_LIBRARY_PATH dropped, the project bound
    and the workdir, the --mounts bind read-only, no home directory mounted, every hostile argument unchanged."""
    import yaml

    if not LMOD_INIT.exists():
        pytest.skip("Lmod is not installed (apt-get install lmod)")
    data = yaml.safe_load((sandbox_project / "registry.yaml").read_text())
    data["clusters"]["sandbox"]["modules"] = ["apptainer"]
    (sandbox_project / "registry.yaml").write_text(yaml.safe_dump(data))
    modules = sandbox_project / "modulefiles"
    modules.mkdir()
    (modules / "apptainer.lua").write_text(f'prepend_path("PATH", "{real_apptainer}")\n')
    monkeypatch.setenv("MODULEPATH", str(modules))
    monkeypatch.setenv("BASH_ENV", str(LMOD_INIT))  # how a site gives non-interactive batch shells `module`
    assert shutil.which("apptainer") is None or Path(shutil.which("apptainer")).parent != real_apptainer
    monkeypatch.setenv("LD_LIBRARY_PATH", "/host/only/lib")
    monkeypatch.setenv("IMAGE_ONLY", "from-the-host")
    (sandbox_project / "data").mkdir()
    (sandbox_project / "data" / "in.txt").write_text("mounted\n")
    probe = str(sandbox_project / "probe.py")
    out = run_launch([probe, *HOSTILE_ARGS], submit=True, cluster="sandbox", runtime="apptainer", nodes=2,
                     mounts="data:/data:ro", env=["FOO=from launcher"], name="appt")
    job = re.search(r"submitted job (\d+)", out).group(1)
    log = sandbox_project / "launch" / "logs" / f"appt-{job}.out"
    info = wait_job(sandbox, job, log=log)
    text = log.read_text()
    assert info["ExitCode"] == "0:0", text[-3000:]
    assert "module load apptainer" in (sandbox_project / "launch" / "appt.sbatch").read_text()
    assert f"image {staged_sif} matches its stage record" in text
    assert text.count("torchrun stand-in on ") == 2, text[-3000:]
    recs = stand_in_records(sandbox_project, job)
    assert sorted(recs) == sorted(sandbox.nodes), recs.keys()
    for node, r in recs.items():
        assert r["argv"] == [probe, *HOSTILE_ARGS], node
        assert "--nproc_per_node=2" in r["options"] and f"--rdzv_id={job}" in r["options"]
        env = r["env"]
        assert env["FOO"] == "from launcher"  # the image says from-image: the launcher's APPTAINERENV_FOO wins
        assert env["IMAGE_ONLY"] == "from-image"  # the host's value does not reach the container
        assert env["LD_LIBRARY_PATH"] == "/opt/image/lib:/.singularity.d/libs"
        assert env["PATH"] == "/opt/image/bin:/bin"
        assert env["NCCL_IB_DISABLE"] == "1" and env["APPTAINER_CONTAINER"] == str(staged_sif)
        assert r["cwd"] == str(sandbox_project) and r["uid"] == 0
        assert r["data"] == "mounted\n"
        assert str(sandbox_project) in r["mount_points"] and "/data" in r["mount_points"]
        assert env["HOME"] not in r["mount_points"], r["mount_points"]  # --no-home
    assert not Path("/tmp/pwned").exists()


def test_a_replaced_image_is_stopped_before_srun(sandbox, sandbox_project, staged_sif, busybox_sif,
                                                 apptainer_on_path):
    """The launcher is written for the staged image; another SIF put at its path (a new file, record untouched)
    stops the job before srun: apptainer never runs."""
    run_launch([str(sandbox_project / "probe.py")], cluster="sandbox", runtime="apptainer", nodes=2, name="appt-swap")
    replacement = staged_sif.with_name("other.sif")
    shutil.copy(busybox_sif, replacement)
    with open(replacement, "ab") as fh:
        fh.write(b"another image")
    replacement.replace(staged_sif)
    job = _submit_written(sandbox, sandbox_project / "launch" / "appt-swap.sbatch")
    log = sandbox_project / "launch" / "logs" / f"appt-swap-{job}.out"
    info = wait_job(sandbox, job, log=log)
    text = log.read_text()
    assert info["ExitCode"] == "3:0", text[-3000:]
    assert f"shipyard: error: staged image {staged_sif} changed after it was staged" in text
    assert "job step exit code" not in text and "torchrun stand-in" not in text
    assert not (sandbox_project / "probe-out").exists()


def test_a_job_queued_before_a_stage_runs_the_version_it_was_written_for(sandbox, sandbox_project, busybox_sif,
                                                                          apptainer_on_path):
    """Versioned staging on real Slurm and Apptainer: the launcher is written while the pointer names v1; its job
    waits in the queue (held) while v2 is staged and the pointer moves; released, it checks and runs v1."""
    from shipyard.files import sha256_file
    from shipyard.staging import versions

    pointer = sandbox_project / ".sandbox" / "images" / "pytorch-2.3.sif"
    pointer.parent.mkdir(parents=True)

    def stage_version(extra: bytes) -> Path:
        tmp = pointer.with_name("incoming.sif")
        shutil.copy(busybox_sif, tmp)
        with open(tmp, "ab") as fh:
            fh.write(extra)
        version = versions.version_path(pointer, sha256_file(tmp))
        tmp.replace(version)
        stage_record(version)
        versions.point(pointer, version)
        return version

    v1 = stage_version(b"")
    run_launch([str(sandbox_project / "probe.py")], cluster="sandbox", runtime="apptainer", nodes=1, name="appt-v1")
    launcher = sandbox_project / "launch" / "appt-v1.sbatch"
    assert str(v1) in launcher.read_text() and str(pointer) + " " not in launcher.read_text()
    res = subprocess.run(sandbox.argv(["sbatch", "--parsable", "--hold", str(launcher)]), capture_output=True,
                         text=True, timeout=60, env=sandbox.env())
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    v2 = stage_version(b"version two")  # the course's update, while the job waits
    assert versions.current(pointer) == v2 and v1.is_file()
    assert sandbox.run(["scontrol", "release", job]).returncode == 0
    log = sandbox_project / "launch" / "logs" / f"appt-v1-{job}.out"
    info = wait_job(sandbox, job, log=log)
    text = log.read_text()
    assert info["ExitCode"] == "0:0", text[-3000:]
    assert f"image {v1} matches its stage record" in text
    recs = stand_in_records(sandbox_project, job)
    assert [r["env"]["APPTAINER_CONTAINER"] for r in recs.values()] == [str(v1)], recs


def test_a_missing_image_fails_the_job_with_one_line(sandbox, sandbox_project, apptainer_on_path):
    """An image given with --image (not checked against a stage record) that is not there: real Apptainer's one
    FATAL line names it, and the step fails."""
    missing = sandbox_project / ".sandbox" / "images" / "missing.sif"
    out = run_launch([str(sandbox_project / "probe.py")], submit=True, cluster="sandbox", runtime="apptainer",
                     nodes=1, image=str(missing), name="appt-missing")
    job = re.search(r"submitted job (\d+)", out).group(1)
    log = sandbox_project / "launch" / "logs" / f"appt-missing-{job}.out"
    info = wait_job(sandbox, job, log=log)
    text = log.read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", text[-3000:]
    fatal = [line for line in text.splitlines() if "FATAL" in line]
    assert len(fatal) == 1 and f"could not open image {missing}" in fatal[0], text[-3000:]
    assert "no such file or directory" in fatal[0] and "torchrun stand-in" not in text


def test_injected_library_path_is_prepended_to_the_images_inside_the_real_container(sandbox, busybox_sif,
                                                                                   apptainer_on_path):
    """Real Apptainer drops the host's LD_LIBRARY_PATH and keeps the image's plus /.singularity.d/libs. The launcher's
    in-container prefix (and a module wrapper's, Apptainer.tool_words ``inside``) puts the injected path in front of
    both; an APPTAINERENV_LD_LIBRARY_PATH would replace the image's."""
    from types import SimpleNamespace

    from shipyard.launch.fabric import EnvVar
    from shipyard.launch.launcher import _prepend_exports
    from shipyard.runtimes.apptainer import Apptainer

    script = _prepend_exports(SimpleNamespace(env=[EnvVar("LD_LIBRARY_PATH", "/opt/host/lib", prepend=True)]))
    site = SimpleNamespace(name="sandbox", storage=None, binds=(), modules=())
    wrapper = Apptainer().tool_words(str(busybox_sif), site, "sh", inside=script)
    host = {**sandbox.env(), "LD_LIBRARY_PATH": "/host/only"}

    def srun(argv, env=host):
        res = sandbox.run(["srun", "-N2", "--ntasks-per-node=1", *argv], client_timeout=120, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        return sorted(res.stdout.split("\n")[:-1])

    plain = srun(["apptainer", "exec", str(busybox_sif), "sh", "-c", 'echo "$LD_LIBRARY_PATH"'])
    assert plain == ["/opt/image/lib:/.singularity.d/libs"] * 2
    launcher = srun(["apptainer", "exec", str(busybox_sif), "sh", "-c", script + '; exec "$@"', "shipyard-env",
                     "sh", "-c", 'echo "$LD_LIBRARY_PATH"'])
    assert launcher == ["/opt/host/lib:/opt/image/lib:/.singularity.d/libs"] * 2
    assert srun([*wrapper, "-c", 'echo "$LD_LIBRARY_PATH"']) == launcher
    replaced = srun(["apptainer", "exec", str(busybox_sif), "sh", "-c", 'echo "$LD_LIBRARY_PATH"'],
                    env={**host, "APPTAINERENV_LD_LIBRARY_PATH": "/opt/host/lib"})
    assert replaced == ["/opt/host/lib:/.singularity.d/libs"] * 2  # the image's /opt/image/lib is gone


@pytest.fixture
def unprivileged_project(sandbox, sandbox_project, busybox_sif, monkeypatch):
    """A test user (created here, removed afterwards) and a project of its own outside pytest's 0700 temp folder,
    with this checkout's registry, the probe and the busybox SIF: ``(pwd entry, project, image)``."""
    base = Path(tempfile.mkdtemp(prefix="shipyard-appt-user-"))
    base.chmod(0o755)
    name = f"sy-appt-{uuid.uuid4().hex[:6]}"
    try:
        user = make_user(name, base / name)
        project = base / "project"
        project.mkdir()
        for f in ("registry.yaml", "probe.py"):
            shutil.copy(sandbox_project / f, project / f)
        image = project / "busybox.sif"
        shutil.copy(busybox_sif, image)
        monkeypatch.chdir(project)
        yield user, project, image
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_an_unprivileged_users_job_runs_in_the_real_container(sandbox, unprivileged_project, apptainer_on_path):
    """A job submitted by an unprivileged user: Apptainer starts the container in setuid mode (this machine's
    /dev/fuse is root-only; apptainer.conf allows setuid SquashFS mounts), the stand-in runs as that user on both
    nodes, in the project, with the image's environment."""
    user, project, image = unprivileged_project
    run_launch([str(project / "probe.py"), "two words"], registry_path=str(project / "registry.yaml"),
               cluster="sandbox", runtime="apptainer", nodes=2, image=str(image), name="appt-user")
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(project)], check=True)
    job = _submit_written(sandbox, project / "launch" / "appt-user.sbatch", as_user(user))
    log = project / "launch" / "logs" / f"appt-user-{job}.out"
    info = wait_job(sandbox, job, log=log)
    text = log.read_text()
    assert info["ExitCode"] == "0:0", text[-3000:]
    assert info["UserId"].startswith(user.pw_name), info["UserId"]
    recs = stand_in_records(project, job)
    assert sorted(recs) == sorted(sandbox.nodes), text[-3000:]
    for r in recs.values():
        assert r["uid"] == user.pw_uid and r["argv"] == [str(project / "probe.py"), "two words"]
        assert r["cwd"] == str(project) and r["env"]["IMAGE_ONLY"] == "from-image"
        assert user.pw_dir not in r["mount_points"]


def test_an_unprivileged_user_namespace_container_with_unsquash(sandbox, unprivileged_project, apptainer_on_path):
    """The other unprivileged mode: ``--userns --unsquash`` (no setuid starter, no FUSE: the SIF is extracted to a
    temporary sandbox in APPTAINER_TMPDIR, which must be the user's) on both nodes."""
    user, project, image = unprivileged_project
    tmp = project / "apptainer-tmp"
    tmp.mkdir()
    os.chown(tmp, user.pw_uid, user.pw_gid)
    res = subprocess.run(sandbox.argv([*as_user(user), f"APPTAINER_TMPDIR={tmp}", "srun", "-N2",
                                       "--ntasks-per-node=1", "apptainer", "exec", "--userns", "--unsquash",
                                       "--no-home", str(image), "sh", "-c",
                                       'echo "$(hostname) $(id -u) $IMAGE_ONLY $(cat /proc/self/uid_map)"']),
                         capture_output=True, text=True, timeout=180, env=sandbox.env())
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Converting SIF file to temporary sandbox" in res.stderr
    lines = sorted(" ".join(line.split()) for line in res.stdout.splitlines())
    uid = user.pw_uid
    assert lines == [f"{n} {uid} from-image {uid} {uid} 1" for n in sandbox.nodes], res.stdout
    assert not list(tmp.iterdir())  # the temporary sandboxes were removed
