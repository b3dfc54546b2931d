"""The checkpoint signal inside real containers on the 2-node sandbox: real pyxis 0.24 + enroot, the real
Apptainer 1.4.5 and real ch-run 0.31. ``scancel --batch --signal=USR2`` is what Slurm's ``--signal=B:USR2@T`` does at T: the batch script
forwards it to the job step, Slurm delivers it to every process of the step (the containers' too), torchrun ignores
it, examples/train.py in the container checkpoints and exits 0, the job requeues and resumes from the checkpoint.
(The host runtime's run is test_launch_sandbox.py's.)

The image is the busybox root filesystem (tests/fixtures_runtimes.py) with the host's Python and torch bound in
(``--mounts /usr,/root,/work`` and the Python environment's own folder; this machine's torch is the host's) and the venv first on the image's PATH, so that
torchrun and train.py run inside the container."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from fixtures_launch import REPO, run_launch, stage_record, wait_for_text, wait_job
from fixtures_runtimes import build_sif, squashfs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _host_mounts() -> list[str]:
    """/usr, /root and /work where they exist, and this Python's environment wherever it lives (CI's is a mktemp -d
    folder under /tmp, which no other mount holds)."""
    mounts = [m for m in ("/usr", "/root", "/work") if Path(m).is_dir()]
    if not any(Path(sys.prefix).is_relative_to(m) for m in mounts):
        mounts.append(sys.prefix)
    return mounts


HOST_MOUNTS = _host_mounts()


@pytest.fixture(scope="module")
def host_python_rootfs(busybox_container_rootfs, tmp_path_factory) -> tuple[Path, str]:
    """A copy of the busybox root filesystem whose image PATH starts with this venv's bin: (rootfs, PATH)."""
    assert any(Path(sys.executable).resolve().is_relative_to(m) for m in HOST_MOUNTS), sys.executable
    assert any(Path(sys.executable).parent.is_relative_to(m) for m in HOST_MOUNTS), sys.executable  # torchrun
    d = tmp_path_factory.mktemp("signal-image")
    d.chmod(0o755)
    root = d / "rootfs"
    shutil.copytree(busybox_container_rootfs, root, symlinks=True, ignore=shutil.ignore_patterns("torchrun"))
    path = f"{Path(sys.executable).parent}:/bin:/usr/bin"
    for env_file in ("etc/environment", "ch/environment"):  # enroot's, ch-run's
        (root / env_file).write_text(f"PATH={path}\n")
    return root, path


def _pyxis(request, rootfs: Path, path: str, images: Path) -> Path:
    request.getfixturevalue("real_pyxis")
    return squashfs(rootfs, images / "pytorch-2.3.sqsh")


def _apptainer(request, rootfs: Path, path: str, images: Path) -> Path:
    bin_dir = request.getfixturevalue("apptainer_on_path")
    return build_sif(bin_dir, rootfs, images / "pytorch-2.3.sif", environment=f"    export PATH={path}\n")


def _charliecloud(request, rootfs: Path, path: str, images: Path) -> Path:
    return squashfs(rootfs, images / "pytorch-2.3.sqsh")


@pytest.mark.parametrize("runtime", [pytest.param("pyxis", marks=pytest.mark.real_runtimes),
                                     pytest.param("apptainer", marks=pytest.mark.real_apptainer),
                                     "charliecloud"])
def test_usr2_reaches_train_py_in_the_container_which_checkpoints_and_the_job_requeues(
        request, sandbox, sandbox_project, host_python_rootfs, runtime):
    rootfs, path = host_python_rootfs
    images = sandbox_project / ".sandbox" / "images"  # clusters.sandbox.storage
    images.mkdir(parents=True)
    image = {"pyxis": _pyxis, "apptainer": _apptainer, "charliecloud": _charliecloud}[runtime](
        request, rootfs, path, images)
    image.chmod(0o644)
    stage_record(image)
    (sandbox_project / "train.py").write_text((REPO / "examples" / "train.py").read_text())
    name = f"usr2-{runtime}"
    out = run_launch(["train.py", "--steps", "40", "--step-delay", "0.2", "--checkpoint", "ckpt/r.pt",
                      "--checkpoint-every", "1000"], submit=True, cluster="sandbox", runtime=runtime, nodes=2,
                     mounts=",".join(HOST_MOUNTS), requeue=True, max_restarts=1, name=name)
    job = re.search(r"submitted job (\d+)", out).group(1)
    log = sandbox_project / "launch" / "logs" / f"{name}-{job}.out"
    wait_for_text(log, "step 3 loss")
    res = sandbox.run(["scancel", "--batch", "--signal=USR2", job])
    assert res.returncode == 0, res.stderr
    info = wait_job(sandbox, job, timeout=300, log=log)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert info["Restarts"] == "1"
    assert f"runtime {runtime}," in text
    assert "got SIGUSR2: forwarding it to the job step" in text
    ck = re.search(r"SIGUSR2: checkpoint at step (\d+)", text)
    assert ck, text[-3000:]
    assert f"requeueing job {job} (restart 1 of 1)" in text
    step = ck.group(1)
    assert re.search(rf"resumed from ckpt/r\.pt at step {step}\b", text), text[-3000:]
    m = re.search(r"result: (.*)", text.split(f"shipyard: job {job} (restart 1)")[1])
    assert m, text[-3000:]
    r = dict(kv.split("=", 1) for kv in m.group(1).split())
    assert r["start_step"] == step and r["end_step"] == "40" and r["world_size"] == "4"
