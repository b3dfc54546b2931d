"""nccl-tests under the real pyxis and the real Apptainer on the 2-node sandbox (`invoke nccl-test`'s launcher shape):
the recipe's nccl-tests step with ``mpi: none`` built with docker (tests/containers/helpers_nccl_tests.py), imported by
the real `enroot import dockerd://` and built into a SIF by the real `apptainer build oci:` (the image saved as an OCI
layout, as `invoke build` does), launched by
`invoke nccl-test --runtime pyxis|apptainer --submit`; every rank stops at the missing CUDA device and nccl-report
says so.

In `invoke test` this file runs last in the real-runtimes run (``run_order``), after the real image, and takes the
image the docker run built for it (tests/handoff.py): building it here cost that run, CI's longest, 5-6 minutes."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import time
from pathlib import Path

import handoff
import pytest
from helpers_nccl_tests import HANDED_NO_MPI, IMAGE_NO_MPI, REG, build_context, build_no_mpi, enroot_import, load

from shipyard.containers import oci_layout

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.slurm, pytest.mark.real_runtimes,
              pytest.mark.run_order(2)]


# the compile test's run builds the image in minutes of both cores; this file runs last in its own run (after the
# real image), when that run is long done
HANDOFF_DEADLINE_S = 900


@pytest.fixture(scope="module")
def nccl_tests_image(docker_services, debian12_base, tmp_path_factory) -> str:
    """The recipe's nccl-tests step with ``mpi: none`` (all_reduce_perf only, to keep it cheap), once for both
    runtimes: its docker tag. Loaded from the archive the compile test's run of the same `invoke test` made
    (tests/handoff.py), else built here."""
    given = handoff.take(HANDED_NO_MPI, HANDOFF_DEADLINE_S)
    if given is not None:
        return load(docker_services, given, IMAGE_NO_MPI)
    return build_no_mpi(docker_services, debian12_base, build_context(tmp_path_factory))


def _launch_and_report(sandbox, tmp_path: Path, monkeypatch, runtime: str, image: Path) -> tuple[str, str, str]:
    """`invoke nccl-test --runtime RUNTIME --image IMAGE --image-has-nccl-tests --submit` on the sandbox (2 nodes, mpi
    none), then `invoke nccl-report` of its log: (the launcher, the report, the log)."""
    import yaml
    from fixtures_launch import run_launch, wait_job

    from shipyard.commands import jobs as jobs_commands
    from shipyard.commands.context import Context
    from shipyard.jobs.nccl_report import NoRows
    from shipyard.launch.options import NCCL_TEST

    project = tmp_path / "project"
    project.mkdir()
    sandbox_cluster = yaml.safe_load((Path(__file__).resolve().parents[2] / "registry.yaml").read_text())
    reg = yaml.safe_load(REG)
    reg["clusters"] = {"sandbox": {**sandbox_cluster["clusters"]["sandbox"], "mpi": "none"}}
    reg["defaults"] = {"environment": "nt", "cluster": "sandbox"}
    (project / "registry.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    monkeypatch.chdir(project)
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    t1 = time.monotonic()
    out = run_launch(kind=NCCL_TEST, submit=True, cluster="sandbox", runtime=runtime, image=str(image),
                     image_has_nccl_tests=True, nodes=2, sizes="8:8", iters=1)
    job = re.search(r"submitted job (\d+)", out).group(1)
    log = project / "launch" / "logs" / f"nccl-test-sandbox-{job}.out"
    info = wait_job(sandbox, job, timeout=300, log=log)
    text = log.read_text(errors="replace")
    print(f"job {job}: {time.monotonic() - t1:.0f} s, {info['JobState']} {info['ExitCode']}\n{text[-6000:]}")
    script = (project / "launch" / "nccl-test-sandbox.sbatch").read_text()
    ctx = Context.load(str(project / "registry.yaml"), out=io.StringIO())
    # no GPU on the sandbox: no rank gets to a result row, so the report is exit 2 after printing what can be said
    # (the transport and the verdict the callers check); any other error, or rows, fails here
    with pytest.raises(NoRows) as ei:
        jobs_commands.nccl_report(str(log), str(tmp_path / "report.png"), "sandbox", ctx)
    assert ei.value.exit_code == 2
    report = ctx.out.getvalue()
    print(report)
    return script, report, text


def _ranks_stopped_at_the_missing_device(report: str, log: str) -> None:
    """One or both ranks reported the missing CUDA device. The first rank to fail ends the step (srun
    --kill-on-bad-exit), sometimes before the other made its first CUDA call; a failed task waits
    ``nccl_test.failure_grace_s`` before it exits, so its own error line is in the log (without that wait, srun ending
    the step dropped it in two CI runs under load) and the report names the device, not NCCL's log."""
    m = re.search(r"FAIL no CUDA device: (\d+) rank\(s\) stopped at their first CUDA call", report)
    assert m, report + "\n---\n" + log[-3000:]
    assert m.group(1) in ("1", "2"), report
    assert "NCCL_DEBUG" not in report, report  # no advice to rerun with NCCL's log: the device is what is missing
    # mpi: none: the job said it ran one test per node, and srun labelled each task's lines, so the header printed
    # by both tasks is two tests, not a broken launch (one, when the other node was stopped before it printed)
    assert re.search(r"per node \(mpi: none\): [12] test\(s\), one per node", report), report
    assert "broken launch" not in report, report
    assert re.search(r"^[01]: .*all_reduce_perf", log, re.M), log[-3000:]


def test_two_node_nccl_test_in_real_pyxis_reaches_no_cuda_device_on_every_rank(
        docker_env, nccl_tests_image, sandbox, real_pyxis, tmp_path, monkeypatch):
    """`invoke nccl-test` end to end, with the real enroot and pyxis on the 2-node sandbox.

    The compile test's image (Open MPI, Debian 12's 4.1.4) cannot start under ``srun --mpi=pmi2``: Debian builds Open
    MPI with external PMIx only (no s1/s2 component for Slurm's PMI-1/PMI-2), so every rank stopped in MPI_Init when
    this test tried it (docs/nccl-tests.md). Hence the sandbox runs nccl-tests' own multi-process mode (``mpi:
    none``: one task per node, -g GPUs): the same recipe step with ``nccl_tests.mpi: none``, imported by ``enroot
    import dockerd://``, launched by `invoke nccl-test --runtime pyxis --image X.sqsh --image-has-nccl-tests
    --submit`; every task starts all_reduce_perf in the container and stops at the missing CUDA device, and
    nccl-report says so. The first task to fail ends the step (srun --kill-on-bad-exit): a node still unpacking
    the image when the other's task fails is stopped there, so one or both ranks report it. The image is Debian with its PATH in an ENV line only: enroot's login shell resets it
    (/etc/profile), and the launcher puts it back from /etc/environment (Pyxis.image_path_prelude)."""
    tmp_path.chmod(0o755)
    sqsh = enroot_import(nccl_tests_image, tmp_path / "nccl-tests.sqsh", tmp_path / "enroot")
    script, report, log = _launch_and_report(sandbox, tmp_path, monkeypatch, "pyxis", sqsh)
    assert "srun --mpi=none " in script and f"--container-image={sqsh}" in script, script
    _ranks_stopped_at_the_missing_device(report, log)


@pytest.mark.real_apptainer
def test_two_node_nccl_test_in_real_apptainer_reaches_no_cuda_device_on_every_rank(
        docker_env, nccl_tests_image, sandbox, apptainer_on_path, tmp_path, monkeypatch):
    """The same image as a SIF that the real Apptainer builds from the docker daemon's image saved as an OCI layout
    (as `invoke build`'s SIF step does), launched by `invoke nccl-test --runtime apptainer --image X.sif --image-has-nccl-tests --submit`: `apptainer
    exec --nv` on a node without a GPU starts all_reduce_perf (the image's PATH from its ENV line), and every task
    stops at the missing CUDA device. Apptainer starts a container faster than pyxis: the first task to fail ends
    the step (srun --kill-on-bad-exit), sometimes before the other node's task made its first CUDA call, so one or
    both ranks report it."""
    tmp_path.chmod(0o755)
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path / "apptainer-cache"))
    sif = tmp_path / "nccl-tests.sif"
    t0 = time.monotonic()
    layout = tmp_path / "layout"
    oci_layout.write_layout(docker_env.client().api.get_image(nccl_tests_image), layout, "nccl-tests")
    res = subprocess.run(["apptainer", "build", str(sif), f"oci:{layout}"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    shutil.rmtree(layout)
    sif.chmod(0o644)
    print(f"apptainer build oci: of {nccl_tests_image}: {time.monotonic() - t0:.0f} s, {sif.stat().st_size >> 20} MiB")
    script, report, log = _launch_and_report(sandbox, tmp_path, monkeypatch, "apptainer", sif)
    assert "srun --mpi=none " in script and "apptainer exec --nv --no-home " in script and str(sif) in script, script
    _ranks_stopped_at_the_missing_device(report, log)
