"""A launcher written by `invoke launch --runtime pyxis` under the real pyxis + enroot on the 2-node sandbox, with an
image that has no torchrun: the job fails with torchrun's exit code 127 and one line that names the PATH it searched
(before: bash's "exec: torchrun: not found", with nothing about where it looked). The image is the busybox
SquashFS of tests/fixtures_runtimes.py (it has bash, for the launcher's per-node function)."""

from __future__ import annotations

import re
import shutil

import pytest
from fixtures_launch import run_launch, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.real_runtimes]


def test_an_image_without_torchrun_fails_with_one_line(sandbox, sandbox_project, real_pyxis, busybox_sqsh):
    image = sandbox_project / "no-torch.sqsh"
    shutil.copy(busybox_sqsh, image)
    (sandbox_project / "train.py").write_text("raise SystemExit('never runs: the image has no torchrun')\n")
    out = run_launch(["train.py"], submit=True, cluster="sandbox", runtime="pyxis", nodes=2, image=str(image),
                     name="no-torchrun")
    job = re.search(r"submitted job (\d+)", out).group(1)
    info = wait_job(sandbox, job, timeout=180)
    text = (sandbox_project / "launch" / "logs" / f"no-torchrun-{job}.out").read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "127:0", text[-3000:]
    lines = [line for line in text.splitlines() if "torchrun is not on the PATH" in line]
    assert lines, text[-3000:]
    # the image's own PATH (its /etc/environment) is what it searched
    assert all(re.fullmatch(r"shipyard: error: node [01] \(node[12]\): torchrun is not on the PATH inside the image "
                            r"\(/opt/image/bin:/bin[^)]*\); the environment needs torch installed", line)
               for line in lines), lines
    assert "shipyard: job step exit code 127" in text
