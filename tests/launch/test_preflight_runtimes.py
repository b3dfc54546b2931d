"""The job's preflight inside a real container on the 2-node sandbox, under each container runtime: real pyxis +
enroot, the real Apptainer 1.4.5 and real ch-run. (The host runtime's run is in test_launch_sandbox.py, the shell
itself in test_preflight.py.)

One job per runtime: node2's nvidia-smi reports a driver older than the environment's CUDA needs, node1's a matching
one. The preflight runs inside the container, so the nvidia-smi double (bash only) must get there the way a site's
GPU injection brings the host's nvidia-smi: Apptainer's ``--nv`` binds the nvidia-smi on the job's PATH to
/usr/bin/nvidia-smi; enroot's nvidia hook binds it on a GPU site, and the sandbox has no GPU for that hook, so the
job binds the double at the same place with ``--mounts``; for ch-run the site's ``ch-fromhost --nvidia`` copies it
into the image, as the test does. The image is the busybox root filesystem with the torchrun stand-in
(tests/fixtures_runtimes.py), with /usr/bin on its PATH as every real image has."""

from __future__ import annotations

import os
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest
from fixtures_launch import REPO, run_launch, stage_record, wait_job
from fixtures_runtimes import CONTAINER_IMAGE_PATH, build_sif, squashfs

from shipyard import registry
from shipyard.registry import compat

pytestmark = pytest.mark.slurm

NVIDIA_SMI = REPO / "tests" / "doubles" / "doctor" / "nvidia-smi"


def _pyxis(request, rootfs: Path, images: Path) -> tuple[Path, dict]:
    request.getfixturevalue("real_pyxis")
    return squashfs(rootfs, images / "pytorch-2.3.sqsh"), {"mounts": f"{NVIDIA_SMI}:/usr/bin/nvidia-smi:ro"}


def _apptainer(request, rootfs: Path, images: Path) -> tuple[Path, dict]:
    bin_dir = request.getfixturevalue("apptainer_on_path")
    return build_sif(bin_dir, rootfs, images / "pytorch-2.3.sif", environment=f"    export PATH={CONTAINER_IMAGE_PATH}\n"), {}


def _charliecloud(request, rootfs: Path, images: Path) -> tuple[Path, dict]:
    injected = images / "ch-rootfs"
    shutil.copytree(rootfs, injected, symlinks=True)
    shutil.copy2(NVIDIA_SMI, injected / "usr" / "bin" / "nvidia-smi")  # where ch-fromhost --nvidia puts it
    request.getfixturevalue("monkeypatch").delenv("USER", raising=False)  # the launcher sets it for ch-run
    return squashfs(injected, images / "pytorch-2.3.sqsh"), {}


@pytest.mark.parametrize("runtime", [pytest.param("pyxis", marks=pytest.mark.real_runtimes),
                                     pytest.param("apptainer", marks=pytest.mark.real_apptainer),
                                     "charliecloud"])
def test_old_driver_node_stops_before_torchrun_inside_the_container(request, sandbox, sandbox_project,
                                                                   busybox_container_rootfs, monkeypatch, runtime):
    images = sandbox_project / ".sandbox" / "images"  # clusters.sandbox.storage: the staged image is checked
    images.mkdir(parents=True)
    image, flags = {"pyxis": _pyxis, "apptainer": _apptainer, "charliecloud": _charliecloud}[runtime](
        request, busybox_container_rootfs, images)
    image.chmod(0o644)
    stage_record(image)  # the launcher binds to it: the environment's CUDA and torch are what the node is held to
    # the job's PATH (sbatch exports the submitting environment): apptainer --nv looks nvidia-smi up there
    monkeypatch.setenv("PATH", f"{NVIDIA_SMI.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SHIPYARD_DOUBLE_GPUS_node2", "Tesla V100-SXM2-32GB, 470.82.01, 7.0;"
                                                     "Tesla V100-SXM2-32GB, 470.82.01, 7.0")
    cuda = registry.load(sandbox_project / "registry.yaml").environment().cuda.value  # what the launcher runs
    need = compat.cuda_facts(cuda)["driver_min"]
    name = f"preflight-{runtime}"
    out = run_launch([str(sandbox_project / "probe.py")], submit=True, cluster="sandbox", runtime=runtime, nodes=2,
                     name=name, **flags)
    job = re.search(r"submitted job (\d+)", out).group(1)
    log = sandbox_project / "launch" / "logs" / f"{name}-{job}.out"
    info = wait_job(sandbox, job, log=log, timeout=180)
    text = log.read_text()
    assert info["JobState"] == "FAILED", text[-3000:]
    assert f"shipyard: error: preflight: node2: driver 470.82.01 < {need} needed by CUDA {cuda}\n" in text, \
        text[-3000:]
    assert "no nvidia-smi in the container" not in text  # the double was reached inside, on both nodes
    # the matching node passed and went on to torchrun (the stand-in in the image); the old one never did
    assert f"image {image} matches its stage record" in text
    assert "shipyard: preflight: node1: ok" in text
    assert "node 0 (node1) of 2 starting torchrun" in text
    assert "node 1 (node2) of 2 starting torchrun" not in text
    assert not list((sandbox_project / "probe-out").glob(f"{job}-1")), "node2 started torchrun"
    took = datetime.fromisoformat(info["EndTime"]) - datetime.fromisoformat(info["StartTime"])
    assert took.total_seconds() <= 30, took
