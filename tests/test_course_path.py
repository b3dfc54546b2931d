"""The instructor's path of the READMEs, end to end on the Slurm sandbox, from a course folder outside the checkout
through `python -m shipyard` (what the `shipyard` command runs): check, render, build as a batch job, a 2-node
launch, its log, the student handout, and a job submitted from a copy of the handout. The build alone goes through
the strict apptainer double on a node: the course image's base is nvidia/cuda on Docker Hub, which the real
Apptainer cannot reach here; the launches run the host runtime. Stage is not part of it here: the course's sandbox
cluster runs the host's Python, so there is no image to stage (staging is tested on its own, tests/staging/)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import fixtures_build as fb
import pytest
from fixtures_launch import wait_job

from shipyard.commands import demo

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "examples" / "course"

pytestmark = [pytest.mark.slurm, pytest.mark.double, pytest.mark.slow]


def test_instructor_path_from_a_course_folder_outside_the_checkout(sandbox):
    base = Path(tempfile.mkdtemp(prefix="shipyard-course-"))
    base.chmod(0o755)
    course = base / "dl-course"
    shutil.copytree(COURSE, course, ignore=shutil.ignore_patterns("README.md"))
    shutil.copy(ROOT / "examples" / "train.py", course / "train.py")
    env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
    env |= {"SHIPYARD_SANDBOX_DIR": str(sandbox.directory), "APPTAINER_TMPDIR": str(base),
            "APPTAINER_CACHEDIR": str(base), "PATH": f"{fb.APPTAINER_DOUBLE}{os.pathsep}{os.environ['PATH']}"}

    def shipyard(*args: str, timeout: float = 600) -> str:
        res = subprocess.run([sys.executable, "-m", "shipyard", *args], cwd=course, env=env, capture_output=True,
                             text=True, timeout=timeout)
        assert res.returncode == 0, f"shipyard {' '.join(args)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        return res.stdout

    try:
        shipyard("check", "course", "--cluster", "sandbox")
        shipyard("render", "course")
        built = shipyard("build", "course", "--slurm", "--cluster", "sandbox", "--wait")
        assert "built containers/course.sif" in built, built[-2000:]
        out = shipyard("launch", "course", "--cluster", "sandbox", "--nodes", "2", "--submit", "--", "train.py",
                       "--steps", "20")
        job = re.search(r"submitted job (\d+)", out)[1]
        log = shipyard("logs", job, "--cluster", "sandbox", "--follow")
        assert demo.parse_result(log)["world_size"] == 4, log[-2000:]
        handout = base / "handout"
        shipyard("course.handout", "course", "--cluster", "sandbox", "--nodes", "2", "--out", str(handout), "--",
                 "train.py", "--steps", "20")
        student = base / "student"
        shutil.copytree(handout, student)
        sub = subprocess.run(sandbox.argv(["bash", "-c", f"cd {student} && sbatch --parsable train-sandbox.sbatch"]),
                             capture_output=True, text=True, timeout=60, env=sandbox.env())
        assert sub.returncode == 0, sub.stderr
        sjob = sub.stdout.strip().split(";")[0]
        assert wait_job(sandbox, sjob).get("JobState") == "COMPLETED"
        slog = (student / "logs" / f"train-sandbox-{sjob}.out").read_text()
        assert demo.parse_result(slog)["world_size"] == 4, slog[-2000:]
        assert (student / "checkpoints" / "train.pt").is_file()
        assert not (handout / "checkpoints").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)
