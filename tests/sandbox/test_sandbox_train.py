"""examples/train.py run for real (torch CPU, gloo): loss goes down, checkpoint and resume, torchrun world size,
SIGUSR2 -> checkpoint and clean exit."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import sys
import time

import pytest
from helpers_registry import ROOT

from shipyard.commands import demo

TRAIN = ROOT / "examples" / "train.py"
# every test here imports torch and trains (seconds each, the bulk of the fast suite): `-m "not slow"` skips them
pytestmark = pytest.mark.slow


def _checkpoint(path) -> dict:
    """The checkpoint as torch reads it; torch is imported here, not at collection (seconds in every collecting
    process, and every test of this file is slow)."""
    import torch

    return torch.load(path, weights_only=True)


def _run(args, cwd, **kw):
    res = subprocess.run([sys.executable, str(TRAIN), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                         **kw)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_single_process_trains_checkpoints_and_resumes(tmp_path):
    out = _run(["--steps", "20", "--checkpoint", "c.pt"], tmp_path)
    r = demo.parse_result(out)
    assert r["world_size"] == 1 and (r["start_step"], r["end_step"]) == (0, 20)
    assert r["last_loss"] < r["first_loss"] / 5
    assert re.search(r"^rank 0/1 step 20 loss [0-9.]+$", out, re.M)
    assert _checkpoint(tmp_path / "c.pt")["step"] == 20

    out2 = _run(["--steps", "30", "--checkpoint", "c.pt"], tmp_path)
    assert "resumed from c.pt at step 20" in out2
    r2 = demo.parse_result(out2)
    assert (r2["start_step"], r2["end_step"]) == (20, 30)
    assert r2["first_loss"] < r["first_loss"] / 5  # it continued from the trained weights, not from scratch
    assert _checkpoint(tmp_path / "c.pt")["step"] == 30


def test_torchrun_two_processes_world_size_two(tmp_path):
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(TRAIN), "--steps", "10", "--checkpoint", "c.pt"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    r = demo.parse_result(res.stdout)
    assert r["world_size"] == 2 and r["ranks"] == [0, 1]


def test_sigusr2_checkpoints_and_exits_cleanly(tmp_path):
    proc = subprocess.Popen([sys.executable, str(TRAIN), "--steps", "100000", "--step-delay", "0.05",
                             "--checkpoint", "c.pt"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        seen = ""
        while "step 3 " not in seen:  # wait until training runs (torch import and group init take a while)
            assert time.monotonic() < deadline, "training did not start"
            assert proc.poll() is None, proc.stderr.read()
            if select.select([proc.stdout], [], [], 1)[0]:
                seen += proc.stdout.readline()
        proc.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    m = re.search(r"SIGUSR2: checkpoint at step (\d+) in c.pt; exiting", out)
    assert m, out[-2000:]
    step = int(m[1])
    assert 3 <= step < 100000
    assert _checkpoint(tmp_path / "c.pt")["step"] == step
    assert demo.parse_result(out)["end_step"] == step
