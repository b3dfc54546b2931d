"""A launcher written by `invoke launch --runtime charliecloud` runs on the real 2-node sandbox with real ch-run 0.31
(Debian's charliecloud-runtime): a torchrun training of examples/train.py to the end on both nodes, world size 4.

The image is an unpacked directory (ch-run's other image kind, given with ``--image``): empty mount points plus
``/ch/environment``, the host's userland (``/usr``, the Python under ``/root``, the venv under ``/work``) bound in with
``--mounts``, because this machine's torch is the host's (the sandbox cluster runs host Python; a training run from
the real torch image is the lead's, elsewhere). torchrun is found only through the image's PATH: the job's own PATH
is set without the venv."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from fixtures_launch import REPO, run_launch, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _directory_image(where: Path, venv_bin: str) -> Path:
    root = where / "ch-image"
    for d in ("usr", "etc", "root", "work", "tmp", "dev", "proc", "sys", "home", "var", "run", "ch"):
        (root / d).mkdir(parents=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
        (root / link).symlink_to(target)
    for f in ("passwd", "group"):  # ch-run binds its own over them: they must exist
        (root / "etc" / f).write_text(Path("/etc", f).read_text())
    (root / "ch" / "environment").write_text(f"PATH={venv_bin}:/usr/local/bin:/usr/bin:/bin\nIMAGE_MARK=ch-dir\n")
    for p in (where, root):
        p.chmod(0o755)
    return root


def test_charliecloud_launcher_trains_on_two_nodes(sandbox, sandbox_project, monkeypatch):
    venv_bin = str(Path(sys.executable).parent)
    mounts = [m for m in ("/usr", "/etc", "/root", "/work") if Path(m).is_dir()]
    assert Path(sys.executable).resolve().is_relative_to(Path("/root")) or \
        Path(sys.executable).resolve().is_relative_to(Path("/usr")), sys.executable  # reachable through the binds
    image = _directory_image(sandbox_project / ".sandbox", venv_bin)
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # the job's PATH: no venv, no torchrun
    monkeypatch.delenv("USER", raising=False)  # ch-run needs it: the launcher sets it from the job's user
    train = REPO / "examples" / "train.py"
    (sandbox_project / "train.py").write_text(train.read_text())
    out = run_launch(["train.py", "--steps", "20", "--checkpoint", "ckpt/ch.pt"], submit=True, cluster="sandbox",
                     nodes=2, runtime="charliecloud", image=str(image), mounts=",".join(mounts),
                     name="ch")
    job = re.search(r"submitted job (\d+)", out).group(1)
    launcher = (sandbox_project / "launch" / "ch.sbatch").read_text()
    assert "ch-run -b " in launcher and f" --cd {sandbox_project} {image} -- /bin/sh -c " in launcher
    info = wait_job(sandbox, job, timeout=300)
    text = (sandbox_project / "launch" / "logs" / f"ch-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert "shipyard: node 0 (node1) of 2" in text and "shipyard: node 1 (node2) of 2" in text
    m = re.search(r"result: (.*)", text)
    assert m, text[-3000:]
    r = dict(kv.split("=", 1) for kv in m.group(1).split())
    assert r["world_size"] == "4" and float(r["last_loss"]) < float(r["first_loss"])
    assert "shipyard: job step exit code 0" in text
    assert os.environ["PATH"] == "/usr/local/bin:/usr/bin:/bin"
