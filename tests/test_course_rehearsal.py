"""The course README's rehearsal (examples/course/README.md, section 7), run exactly as written from the course
folder against the real Slurm sandbox: its commands are read from the README, not copied here, so the README cannot
drift from what works.

The folder is a course folder outside the checkout, set up as the README's start says (registry.yaml, the locks and
examples/train.py copied in), and the commands run as `shipyard` (`python -m shipyard`, what the console command runs).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shipyard.commands import demo

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "examples" / "course"

pytestmark = pytest.mark.slurm


def rehearsal_commands() -> list[str]:
    """The indented command lines of section 7, up to "Then on the clusters" (the real clusters are not here)."""
    text = (COURSE / "README.md").read_text()
    section = text.split("## 7. The first multi-node job", 1)[1].split("Then on the clusters", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]


def test_readme_shows_shell_monitor_usage_and_down():
    cmds = rehearsal_commands()
    assert any(c.startswith("shipyard shell") for c in cmds)
    assert any("--monitor" in c for c in cmds) and any(c.startswith("shipyard usage") for c in cmds)
    assert cmds[-1] == "shipyard sandbox.down"


def test_rehearsal_runs_as_written_from_the_course_folder(sandbox):
    base = Path(tempfile.mkdtemp(prefix="shipyard-rehearsal-"))
    base.chmod(0o755)
    here = base / "dl-course"
    shutil.copytree(COURSE, here, ignore=shutil.ignore_patterns("README.md", "launch", "train.py", "containers"))
    shutil.copy(ROOT / "examples" / "train.py", here / "train.py")
    env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
    env["SHIPYARD_SANDBOX_DIR"] = str(sandbox.directory)
    jobid = None
    outputs = []
    try:
        for line in rehearsal_commands():
            words = shlex.split(line)
            if words[0] == "cp":
                subprocess.run(words, cwd=here, check=True)
                continue
            assert words[0] == "shipyard", line
            if words[1] == "sandbox.down":
                continue  # the session's shared sandbox: other tests still need it (sandbox.down has its own tests)
            words = [jobid if w == "JOBID" else w for w in words]
            res = subprocess.run([sys.executable, "-m", "shipyard", *words[1:]], cwd=here, env=env,
                                 capture_output=True, text=True, timeout=600)
            assert res.returncode == 0, f"{line}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
            outputs.append((line, res.stdout))
            m = re.search(r"submitted job (\d+)", res.stdout)
            if m:
                jobid = m.group(1)
        logs = [out for line, out in outputs if line.startswith("shipyard logs")]
        assert len(logs) == 2
        for out in logs:  # 2 nodes x 2 (fake) GPUs = 4 ranks trained to the end
            assert demo.parse_result(out)["world_size"] == 4, out[-2000:]
            assert "shipyard: job step exit code 0" in out, out[-2000:]
        usage = next(out for line, out in outputs if line.startswith("shipyard usage"))
        assert "node1" in usage and "node2" in usage
        shell = next(out for line, out in outputs if line.startswith("shipyard shell --cluster sandbox"))
        assert shell.strip() in ("node1", "node2")
        assert (here / "launch" / "train-sandbox.sbatch").is_file()
    finally:
        shutil.rmtree(base, ignore_errors=True)
