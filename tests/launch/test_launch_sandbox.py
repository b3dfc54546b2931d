"""Launchers on the real local 2-node Slurm sandbox: host runtime training, chain, USR2 + requeue, monitor CSVs,
hostile arguments, the pyxis runtime through a SPANK test double (the real Apptainer's launchers are in
test_launch_sandbox_apptainer.py). Every job here is submitted with `sbatch` by `invoke launch --submit`'s code
path."""

from __future__ import annotations

import csv
import os
import re
from datetime import datetime
from pathlib import Path

import pytest
from fixtures_launch import (
    HOSTILE_ARGS,
    REPO,
    build_launcher,
    probes,
    run_launch,
    stage_record,
    wait_for_text,
    wait_job,
)

from shipyard import registry
from shipyard.launch import launcher as launch
from shipyard.registry import compat

pytestmark = pytest.mark.slurm

TRAIN = str(REPO / "examples" / "train.py")


def submit(project: Path, command, **flags) -> tuple[str, Path]:
    """Run the `invoke launch --submit` code path; return (first job id, log path)."""
    out = run_launch(command, submit=True, cluster="sandbox", **flags)
    job = re.search(r"submitted job (\d+)", out).group(1)
    return job, project / "launch" / "logs" / f"{flags.get('name', 'train-sandbox')}-{job}.out"


def result(log: str) -> dict:
    m = re.search(r"result: (.*)", log)
    assert m, log[-3000:]
    return dict(kv.split("=", 1) for kv in m.group(1).split())


@pytest.mark.slow
def test_host_runtime_two_nodes_trains_with_world_size_4(sandbox, sandbox_project):
    job, log = submit(sandbox_project, [TRAIN, "--steps", "30", "--checkpoint", "ckpt/a.pt"], nodes=2, monitor=True,
                      monitor_interval=1)
    info = wait_job(sandbox, job)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    r = result(text)
    assert r["world_size"] == "4" and float(r["last_loss"]) < float(r["first_loss"])
    # per-node variables expanded on each node (rule 4), the rendezvous host came from the allocation (rule 2)
    assert "shipyard: node 0 (node1) of 2" in text and "shipyard: node 1 (node2) of 2" in text
    node1 = re.escape(next(n["ip"] for n in sandbox.info["nodes"] if n["name"] == "node1"))
    assert re.search(rf"c10d rendezvous at node1 \({node1}\):{29500 + int(job) % 1000}, id {job}\n", text)
    assert "shipyard: job step exit code 0" in text
    assert "shipyard: NCCL transport: none logged" in text  # CPU/gloo: no NCCL communicator, and it says so
    # --monitor: one CSV per node in the contract's layout, real CPU/RAM samples, GPU columns empty
    for node in ("node1", "node2"):
        path = sandbox_project / "launch" / "logs" / f"train-sandbox-{job}.usage.{node}.csv"
        rows = list(csv.DictReader(path.open()))
        assert list(rows[0]) == ["timestamp", "node", "cpu_percent", "mem_used_mb", "mem_total_mb", "gpu_index",
                                 "gpu_util_percent", "gpu_mem_used_mb", "gpu_mem_total_mb"]
        assert rows and all(r["node"] == node and r["gpu_index"] == "" and r["gpu_util_percent"] == "" for r in rows)
        assert all(0 <= float(r["cpu_percent"]) <= 100 and 0 < int(r["mem_used_mb"]) < int(r["mem_total_mb"])
                   for r in rows)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rows[0]["timestamp"])


def test_hostile_arguments_reach_every_rank_unchanged(sandbox, sandbox_project, invoke):
    """Through the real command line: `invoke launch ... --submit -- probe.py <hostile words>` (invoke itself would
    lose the quoting of its `--` remainder; the task reads sys.argv)."""
    res = invoke("launch", "--cluster", "sandbox", "--nodes", "2", "--name", "hostile", "--submit", "--",
                 str(sandbox_project / "probe.py"), *HOSTILE_ARGS, cwd=Path.cwd())  # the test's own cwd, as before
    assert res.returncode == 0, res.stderr
    job = re.search(r"submitted job (\d+)", res.stdout).group(1)
    log = sandbox_project / "launch" / "logs" / f"hostile-{job}.out"
    info = wait_job(sandbox, job)
    assert info["ExitCode"] == "0:0", log.read_text()[-3000:]
    ranks = probes(sandbox_project, job)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["node"] for r in ranks} == {"node1", "node2"}
    for r in ranks:
        assert r["argv"] == list(HOSTILE_ARGS)
    assert not Path("/tmp/pwned").exists()


@pytest.mark.slow
def test_usr2_checkpoints_and_requeues_then_resumes(sandbox, sandbox_project):
    job, log = submit(sandbox_project, [TRAIN, "--steps", "40", "--step-delay", "0.2", "--checkpoint", "ckpt/r.pt",
                                        "--checkpoint-every", "1000"],
                      nodes=2, requeue=True, max_restarts=1, name="requeue")
    wait_for_text(log, "step 3 loss")
    res = sandbox.run(["scancel", "--batch", "--signal=USR2", job])  # what --signal=B:USR2@T does at T
    assert res.returncode == 0, res.stderr
    # Slurm holds the requeued job PENDING (BeginTime) for the credential lifetime before it may start again: the
    # sandbox's AuthInfo cred_expire (data/sandbox.yaml), 120 s on a default site. Moving its start to now (scontrol
    # update StartTime=now) failed the job in 2 of 3 runs (the new launch credential must outlive the revoked one's).
    info = wait_job(sandbox, job, timeout=300)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert info["Restarts"] == "1"
    assert "got SIGUSR2: forwarding it to the job step" in text
    ck = re.search(r"SIGUSR2: checkpoint at step (\d+)", text)
    assert ck, text[-3000:]
    assert f"requeueing job {job} (restart 1 of 1)" in text
    assert f"shipyard: job {job} (restart 1)" in text
    step = ck.group(1)
    assert re.search(rf"resumed from ckpt/r\.pt at step {step}\b", text)
    r = result(text.split(f"shipyard: job {job} (restart 1)")[1])
    assert r["start_step"] == step and r["end_step"] == "40" and r["world_size"] == "4"


@pytest.mark.slow
def test_chain_of_two_jobs_resumes_from_the_checkpoint(sandbox, sandbox_project):
    job, log = submit(sandbox_project, [TRAIN, "--steps", "40", "--step-delay", "0.2", "--checkpoint", "ckpt/c.pt",
                                        "--checkpoint-every", "1000"], nodes=2, chain=2, name="chain")
    second = str(int(job) + 1)
    dep = sandbox.run(["scontrol", "show", "job", "-o", second]).stdout
    assert re.search(rf"Dependency=afterany:{job}\b", dep), dep
    wait_for_text(log, "step 3 loss")
    assert sandbox.run(["scancel", "--batch", "--signal=USR2", job]).returncode == 0
    first = wait_job(sandbox, job)
    assert first["ExitCode"] == "0:0" and "stopped after a checkpoint signal" in log.read_text()
    step = re.search(r"SIGUSR2: checkpoint at step (\d+)", log.read_text()).group(1)
    info = wait_job(sandbox, second, timeout=300)
    text2 = (log.parent / f"chain-{second}.out").read_text()
    assert info["ExitCode"] == "0:0", text2[-3000:]
    r = result(text2)
    assert r["start_step"] == step and r["end_step"] == "40"


@pytest.mark.double
def test_pyxis_runtime_each_node_gets_image_mounts_workdir(sandbox, sandbox_project, pyxis_double):
    image = sandbox_project / ".sandbox" / "images" / "pytorch-2.3.sqsh"  # clusters.sandbox.storage
    image.parent.mkdir(parents=True)
    image.write_bytes(b"hsqs")  # the double checks the file exists; it runs nothing from it
    stage_record(image)  # the launcher binds to it and the job checks it before srun
    (sandbox_project / "data").mkdir()
    job, log = submit(sandbox_project, [str(sandbox_project / "probe.py"), "x"], nodes=2, runtime="pyxis",
                      mounts="data:/data:ro", env=["FOO=bar baz"], name="pyxis")
    info = wait_job(sandbox, job)
    assert info["ExitCode"] == "0:0", log.read_text()[-3000:]
    ranks = probes(sandbox_project, job)
    assert len(ranks) == 4 and {r["node"] for r in ranks} == {"node1", "node2"}
    for r in ranks:
        env = r["env"]
        assert env["SHIPYARD_PYXIS_DOUBLE_CONTAINER_IMAGE"] == str(image)
        assert env["SHIPYARD_PYXIS_DOUBLE_CONTAINER_MOUNTS"] == f"{sandbox_project}:{sandbox_project}," \
                                                               f"{sandbox_project / 'data'}:/data:ro"
        assert env["SHIPYARD_PYXIS_DOUBLE_CONTAINER_WORKDIR"] == str(sandbox_project)
        assert env["SHIPYARD_PYXIS_DOUBLE_NO_CONTAINER_MOUNT_HOME"] == "1"
        assert set(env["SHIPYARD_PYXIS_DOUBLE_CONTAINER_ENV"].split(",")) == {
            "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "FOO"}
        assert env["FOO"] == "bar baz"


@pytest.mark.double
def test_pyxis_double_is_strict_missing_image_fails_the_job(sandbox, sandbox_project, pyxis_double):
    job, log = submit(sandbox_project, [str(sandbox_project / "probe.py")], nodes=1, runtime="pyxis",
                      image=str(sandbox_project / "missing.sqsh"), name="pyxis-bad")
    info = wait_job(sandbox, job)
    text = log.read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0"
    assert "image file does not exist" in text and "shipyard: job step exit code 0" not in text


@pytest.mark.parametrize("runtime", ["pyxis", pytest.param("apptainer", marks=pytest.mark.real_apptainer), "host"])
def test_sbatch_test_only_accepts_the_nccl_test_launcher_of_each_runtime(sandbox, sandbox_project, busybox_sqsh,
                                                                         request, runtime):
    """`invoke nccl-test --validate` for each runtime (the launchers of tests/golden/launch/nccl-test-sandbox-*.sbatch):
    Slurm accepts the resource request. The pyxis one runs for real in tests/containers/test_nccl_tests_real_pyxis.py;
    the apptainer one is given a real SIF built by the real Apptainer; the host one needs all_reduce_perf on the
    nodes' PATH, so it is checked only this far."""
    from shipyard.launch.options import NCCL_TEST

    image = {"pyxis": lambda: str(busybox_sqsh), "apptainer": lambda: str(request.getfixturevalue("busybox_sif")),
             "host": lambda: None}[runtime]()
    out = run_launch(kind=NCCL_TEST, cluster="sandbox", runtime=runtime, nodes=2, validate=True, image=image,
                     image_has_nccl_tests=image is not None)
    assert "sbatch --test-only: accepted: " in out, out
    text = (sandbox_project / "launch" / "nccl-test-sandbox.sbatch").read_text()
    assert "srun --mpi=none " in text and f"runtime {runtime}," in text


def test_preflight_stops_a_node_with_an_old_driver_before_torchrun(sandbox, sandbox_project, monkeypatch):
    """The nvidia-smi double on the nodes' PATH (sbatch exports the submitting environment) answers per node: node2
    reports a driver older than the environment's CUDA needs, so the job ends within seconds with one line naming
    node, driver and need, and node2 never starts torchrun. With both nodes matching, the same launcher trains."""
    doubles = REPO / "tests" / "doubles" / "doctor"
    monkeypatch.setenv("PATH", f"{doubles}:{os.environ['PATH']}")
    cuda = registry.load(sandbox_project / "registry.yaml").environment().cuda.value  # what the launcher runs
    need = compat.cuda_facts(cuda)["driver_min"]
    monkeypatch.setenv("SHIPYARD_DOUBLE_GPUS_node2", "Tesla V100-SXM2-32GB, 470.82.01, 7.0;"
                                                     "Tesla V100-SXM2-32GB, 470.82.01, 7.0")
    job, log = submit(sandbox_project, [str(sandbox_project / "probe.py")], nodes=2, name="preflight-old")
    info = wait_job(sandbox, job, log=log)
    text = log.read_text()
    assert info["JobState"] == "FAILED", text[-3000:]
    assert f"shipyard: error: preflight: node2: driver 470.82.01 < {need} needed by CUDA {cuda}" in text
    assert "shipyard: preflight: node1: ok" in text
    assert "node 1 (node2) of 2 starting torchrun" not in text
    assert "probe rank" not in text  # no rank ran anywhere: node1's torchrun waited for node2 and was ended
    took = datetime.fromisoformat(info["EndTime"]) - datetime.fromisoformat(info["StartTime"])
    assert took.total_seconds() <= 30, took

    monkeypatch.delenv("SHIPYARD_DOUBLE_GPUS_node2")
    job, log = submit(sandbox_project, [str(sandbox_project / "probe.py")], nodes=2, name="preflight-ok")
    info = wait_job(sandbox, job, log=log)
    text = log.read_text()
    assert info["ExitCode"] == "0:0", text[-3000:]
    assert "shipyard: preflight: node1: ok" in text and "shipyard: preflight: node2: ok" in text
    assert len(probes(sandbox_project, job)) == 4
