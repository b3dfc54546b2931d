"""`invoke course.handout` for real: two Unix users (created here) copy the same handout and submit it at once to
the Slurm sandbox, as themselves, with the line STUDENTS.md gives; both jobs train on 2 nodes, and each user's logs and checkpoint are in that user's own copy,
owned by that user, while the handout folder and the instructor's course folder get nothing.

The jobs run as the students, so the Python that runs shipyard (and torch) must be reachable by them. Where it lies
under a directory other users cannot search (a Python in /root), the test adds the search bit (o+x, never read) to
exactly those directories for its duration and restores their modes afterwards.
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
from fixtures_launch import as_user, make_user, searchable_for_others, wait_job

from shipyard.commands import demo

ROOT = Path(__file__).resolve().parents[2]
COURSE = ROOT / "examples" / "course"

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_two_students_run_the_same_handout_at_once(sandbox):
    if os.geteuid() != 0:
        pytest.fail("creating the student users needs root (the sandbox does too)")
    base = Path(tempfile.mkdtemp(prefix="shipyard-handout-"))
    base.chmod(0o755)
    tag = uuid.uuid4().hex[:6]
    names = [f"sy-stu-a{tag}", f"sy-stu-b{tag}"]
    python = Path(sys.executable).resolve()
    # sys.prefix itself too (its bin/ is the argument): CI's virtual environment is a mktemp -d folder, mode 0700
    restore = searchable_for_others([python, Path(sys.prefix) / "bin",
                                      Path(shutil.which("torchrun") or sys.executable)])
    course = base / "course"
    shutil.copytree(COURSE, course, ignore=shutil.ignore_patterns("launch", "containers", "train.py"))
    shutil.copy(ROOT / "examples" / "train.py", course / "train.py")
    env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
    env["SHIPYARD_SANDBOX_DIR"] = str(sandbox.directory)
    out = base / "handout"
    try:
        res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "course.handout", "--cluster", "sandbox",
                              "--nodes", "2", "--gpus-per-node", "1", "--out", str(out), "--", "train.py", "--steps",
                              "20", "--checkpoint-every", "10"], cwd=course, env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        handout_files = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
        assert handout_files == ["STUDENTS.md", "logs", "train-sandbox.sbatch", "train.py"]
        assert str(course) not in (out / "train-sandbox.sbatch").read_text()
        students_md = (out / "STUDENTS.md").read_text()
        conf_line = next(line.strip() for line in students_md.splitlines()
                         if line.strip().startswith("export SLURM_CONF="))
        student_env = {k: v for k, v in sandbox.env().items() if k != "SLURM_CONF"}
        users = [make_user(n, base / n) for n in names]
        jobs = {}
        # the second student changes a hyper-parameter after the launcher's name, as STUDENTS.md says
        extra = {names[0]: "", names[1]: " --steps 30"}

        def submit(u, args: str) -> str:
            # as the student itself, with STUDENTS.md's own line for the sandbox's Slurm (no root, no nsenter)
            sub = subprocess.run([*as_user(u), "bash", "-c", f"{conf_line} && cd {u.pw_dir}/course && "
                                  f"sbatch --parsable train-sandbox.sbatch{args}"],
                                 capture_output=True, text=True, timeout=60, env=student_env)
            assert sub.returncode == 0, sub.stderr
            return sub.stdout.strip().split(";")[0]

        for u in users:  # each copies the handout as itself, then submits from its copy, both before either ends
            # homes anyone may enter and list: only the launcher's umask keeps one student's work from the other
            Path(u.pw_dir).chmod(0o755)
            subprocess.run([*as_user(u), "cp", "-r", str(out), f"{u.pw_dir}/course"], check=True, timeout=60)
            jobs[u.pw_name] = submit(u, extra[u.pw_name])
        for u in users:
            fields = wait_job(sandbox, jobs[u.pw_name], timeout=300)
            mine = Path(u.pw_dir) / "course"
            log = mine / "logs" / f"train-sandbox-{jobs[u.pw_name]}.out"
            text = log.read_text() if log.exists() else "(no log)"
            assert fields.get("JobState") == "COMPLETED", text[-3000:]
            assert fields.get("UserId", "").startswith(u.pw_name), fields.get("UserId")
            result = demo.parse_result(text)
            assert result["world_size"] == 2, text[-2000:]
            assert result["end_step"] == (30 if extra[u.pw_name] else 20), text[-2000:]
            assert (mine / "checkpoints" / "train.pt").is_file()
            for p in mine.rglob("*"):  # everything in a student's copy is that student's
                assert p.lstat().st_uid == u.pw_uid, p
        other = {users[0].pw_name: users[1], users[1].pw_name: users[0]}
        for u in users:  # neither can read what the other's job wrote
            theirs = Path(other[u.pw_name].pw_dir) / "course"
            for path in (theirs / "logs" / f"train-sandbox-{jobs[other[u.pw_name].pw_name]}.out",
                         theirs / "checkpoints" / "train.pt"):
                peek = subprocess.run([*as_user(u), "cat", str(path)], capture_output=True, timeout=60)
                assert peek.returncode != 0 and b"Permission denied" in peek.stderr, (path, peek.stderr)
        # continuing a run that ended: more steps than it reached, from its checkpoint
        b = users[1]
        more = submit(b, " --steps 40")
        fields = wait_job(sandbox, more, timeout=300)
        text = (Path(b.pw_dir) / "course" / "logs" / f"train-sandbox-{more}.out").read_text()
        assert fields.get("JobState") == "COMPLETED", text[-3000:]
        result = demo.parse_result(text)
        assert (result["start_step"], result["end_step"]) == (30, 40), text[-2000:]
        for u in users:  # no job wrote into the other student's copy
            logs = {p.name for p in (Path(other[u.pw_name].pw_dir) / "course" / "logs").iterdir()}
            assert not any(jobs[u.pw_name] in n for n in logs)
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == handout_files  # handout untouched
        assert not (course / "launch").exists() and not (course / "checkpoints").exists()
        assert not re.search(r"Permission denied", "".join(
            (Path(u.pw_dir) / "course" / "logs" / f"train-sandbox-{jobs[u.pw_name]}.out").read_text()
            for u in users))
    finally:
        for name in names:
            subprocess.run(["userdel", "--remove", name], capture_output=True)
        for d, mode in reversed(restore):
            d.chmod(mode)
        shutil.rmtree(base, ignore_errors=True)
