"""A course's whole semester on the Slurm sandbox, with two real unprivileged student accounts and real image versions.

The instructor (root, the `shipyard` command in a course folder) stages image v1 for everyone and writes the handout;
each student copies it with STUDENTS.md's own line and submits with STUDENTS.md's own `sbatch` line, as itself (its
uid, SLURM_CONF, no nsenter). While one student's v1 job is held in the queue the instructor stages v2; that job
still runs v1. The instructor hands out again, both students follow STUDENTS.md's update step and train on v2; a
rollback and another handout bring v1 back. Every job trains the steps its `--steps` asked for, continuing from the
checkpoint the previous one left (start_step/end_step in its log), and neither student can read the other's log or
checkpoint.

The two images are real SIFs (tests/fixtures_sif.py): the host-userland image and a build on top of it that differs
only by a label, each recorded as `tiny`'s build in turn; the jobs run inside them with the host's /usr and Python
environment bound in (the cluster's binds), so each version's job names its own version file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from fixtures_build import PROJECT_REGISTRY
from fixtures_launch import as_user, make_user, searchable_for_others, wait_job
from fixtures_sif import build_sif, host_userland_mounts, record_build

from shipyard import registry
from shipyard.commands import demo
from shipyard.containers import manifest as mf

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.real_apptainer]

SANDBOX_PROFILE = "  sandbox:\n    local_sandbox: true\n    runtime: host\n"


def _lines(md: str) -> dict:
    """STUDENTS.md's command lines a student types: the Slurm line, the copy (step 1), the submit (step 2) and the
    update (step 5)."""
    step5 = md.split("## 5.", 1)[1]
    copy = [ln.strip() for ln in md.splitlines() if ln.strip().startswith("mkdir -p ~/")]
    folder = re.fullmatch(r".* && cd ~/([\w.-]+)", copy[0])
    assert folder, copy[0]
    return {"folder": folder[1],
            "conf": next(ln.strip() for ln in md.splitlines() if ln.strip().startswith("export SLURM_CONF=")),
            "copy": copy[0],
            "submit": next(ln.strip() for ln in md.split("## 2.", 1)[1].splitlines()
                           if ln.strip().startswith("sbatch ")),
            "update": next(ln.strip() for ln in step5.splitlines() if ln.strip().startswith("mkdir -p ~/"))}


def test_a_semester_with_two_students_image_updates_a_held_job_and_a_rollback(
        sandbox, apptainer_on_path, real_apptainer, host_userland_sif):
    if os.geteuid() != 0:
        pytest.fail("creating the student users needs root (the sandbox does too)")
    base = Path(tempfile.mkdtemp(prefix="shipyard-semester-"))
    base.chmod(0o755)
    tag = uuid.uuid4().hex[:6]
    names = [f"sy-sem-a{tag}", f"sy-sem-b{tag}"]
    restore = searchable_for_others([Path(sys.executable).resolve(), Path(sys.prefix) / "bin",
                                     Path(shutil.which("torchrun") or sys.executable)])
    storage = base / "storage"
    storage.mkdir(mode=0o755)
    course = base / "course"
    course.mkdir()
    binds = "".join(f"      - {m}:{m}\n" for m in host_userland_mounts())
    text = PROJECT_REGISTRY.format(registry="127.0.0.1:9")
    assert SANDBOX_PROFILE in text and "    storage: .sandbox/images\n" in text
    text = text.replace(SANDBOX_PROFILE, SANDBOX_PROFILE.replace("host", "apptainer") + f"    binds:\n{binds}")
    (course / "registry.yaml").write_text(text.replace("    storage: .sandbox/images\n", f"    storage: {storage}\n"))
    shutil.copy(ROOT / "examples" / "train.py", course / "train.py")
    reg = registry.load(course / "registry.yaml")
    # v2: the same image with one label more (another sha256, the same spec: what a rebuild of registry.yaml gives)
    work = base / "build"
    work.mkdir()
    (work / "v2.def").write_text(f"Bootstrap: localimage\nFrom: {host_userland_sif}\n\n%labels\n    course v2\n")
    v2_sif = build_sif(real_apptainer, work / "v2.sif", work / "v2.def", work)
    env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
    env.update(SHIPYARD_SANDBOX_DIR=str(sandbox.directory), XDG_CACHE_HOME=str(base / "cache"))
    out = base / "handout"

    def shipyard(*args: str) -> str:  # the instructor, in the course folder
        res = subprocess.run([sys.executable, "-m", "shipyard", *args], cwd=course, env=env, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, f"shipyard {' '.join(args)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        return res.stdout

    def build_and_stage(sif: Path, *flags: str) -> str:
        record_build(reg, "tiny", sif)
        shipyard("stage", "tiny", "--cluster", "sandbox", *flags)
        return mf.read_manifest(course / "containers" / "tiny.json").artifacts["sif"].sha256

    def hand_out(*flags: str) -> dict:
        shipyard("course.handout", "--environment", "tiny", "--cluster", "sandbox", "--nodes", "1", "--out",
                 str(out), *flags, "--", "train.py", "--steps", "3", "--checkpoint-every", "1")
        return _lines((out / "STUDENTS.md").read_text())

    student_env = {k: v for k, v in sandbox.env().items() if k not in ("SLURM_CONF", "XDG_CACHE_HOME")}

    def as_student(u, script: str) -> subprocess.CompletedProcess:
        return subprocess.run([*as_user(u), "bash", "-c", script], capture_output=True, text=True, timeout=120,
                              env=student_env)

    def submit(u, lines: dict, args: str = "", hold: bool = False, copy: str = "") -> str:
        """As the student: STUDENTS.md's Slurm line, its copy (or update) line, then its sbatch line."""
        cmd = lines["submit"].replace("sbatch ", "sbatch --parsable " + ("--hold " if hold else ""), 1)
        res = as_student(u, f"{lines['conf']} && {copy or 'cd ~/' + lines['folder']} && {cmd}{args}")
        assert res.returncode == 0, res.stderr
        return res.stdout.strip().split(";")[0]

    def mine(u) -> Path:  # the student's copy, where STUDENTS.md copies it
        return Path(u.pw_dir) / lines["folder"]

    def trained(u, job: str, sha: str) -> tuple[int, int]:
        """The job's (start_step, end_step), after checking it ended well as ``u`` inside the version ``sha``."""
        fields = wait_job(sandbox, job, timeout=300)
        log = next((mine(u) / "logs").glob(f"*-{job}.out"), None)
        text = log.read_text(errors="replace") if log else f"(no log of job {job})"
        assert fields.get("JobState") == "COMPLETED", text[-3000:]
        assert fields.get("UserId", "").startswith(u.pw_name), fields.get("UserId")
        assert re.search(rf"tiny\.{sha[:12]}\.sif matches its stage record", text), (sha[:12], text[-3000:])
        result = demo.parse_result(text)
        assert result, text[-3000:]
        return result["start_step"], result["end_step"]

    try:
        v1 = build_and_stage(host_userland_sif, "--mode", "world")
        lines = hand_out()
        assert str(course) not in (out / "STUDENTS.md").read_text()
        users = [make_user(n, base / n) for n in names]
        a, b = users
        for u in users:
            Path(u.pw_dir).chmod(0o755)  # homes anyone may enter: only the launcher's umask keeps work private
            copied = as_student(u, lines["copy"])
            assert copied.returncode == 0, copied.stderr
        # A trains the steps it asks for; B's v1 job waits in the queue, held, while the instructor stages v2
        a1 = submit(a, lines, " --steps 2")
        b1 = submit(b, lines, hold=True)
        v2 = build_and_stage(v2_sif)  # no --mode: the re-stage keeps the readers v1 had
        assert v2 != v1 and (storage / f"tiny.{v2[:12]}.sif").stat().st_mode & 0o777 == 0o644
        assert os.readlink(storage / "tiny.sif") == f"tiny.{v2[:12]}.sif"
        state = sandbox.run(["scontrol", "show", "job", "-o", b1]).stdout
        assert "JobState=PENDING" in state, state
        released = as_student(b, f"{lines['conf']} && scontrol release {b1}")
        assert released.returncode == 0, released.stderr
        assert trained(a, a1, v1) == (0, 2)
        assert trained(b, b1, v1) == (0, 3)  # queued before the update: still the image it was written for

        # the course is updated: a new handout over the old one, each student runs STUDENTS.md's update step
        lines = hand_out("--replace")
        a2 = submit(a, lines, " --steps 5", copy=lines["update"])
        b2 = submit(b, lines, " --steps 4", copy=lines["update"])
        assert trained(a, a2, v2) == (2, 5)  # continued from its own checkpoint, in the new image
        assert trained(b, b2, v2) == (3, 4)

        # a bad v2: roll back, hand out again, and the next job runs v1
        said = shipyard("stage", "tiny", "--cluster", "sandbox", "--rollback")
        assert f"tiny.{v1[:12]}.sif" in said and os.readlink(storage / "tiny.sif") == f"tiny.{v1[:12]}.sif"
        lines = hand_out("--replace")
        listed = shipyard("stage", "tiny", "--cluster", "sandbox", "--list").splitlines()
        now = next(ln for ln in listed if f"tiny.{v1[:12]}.sif" in ln)
        assert now.startswith("* ") and now.endswith(f"handouts: {out}"), listed  # the handout binds v1 again
        b3 = submit(b, lines, " --steps 6", copy=lines["update"])
        assert trained(b, b3, v1) == (4, 6)

        for u, other, job in ((a, b, b3), (b, a, a2)):  # neither student reads what the other's jobs wrote
            theirs = mine(other)
            for path in (next((theirs / "logs").glob(f"*-{job}.out")), theirs / "checkpoints" / "train.pt"):
                peek = as_student(u, f"cat {path}")
                assert peek.returncode != 0 and "Permission denied" in peek.stderr, (path, peek.stderr)
        for u in users:  # everything in a student's copy is that student's
            for p in mine(u).rglob("*"):
                assert p.lstat().st_uid == u.pw_uid, p
    finally:
        for name in names:
            subprocess.run(["userdel", "--remove", name], capture_output=True)
        for d, mode in reversed(restore):
            d.chmod(mode)
        shutil.rmtree(base, ignore_errors=True)
