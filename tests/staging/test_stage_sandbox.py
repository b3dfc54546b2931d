"""The whole path on the real 2-node Slurm sandbox: check -> render -> build -> stage -> launch -> the job verifies the
staged image's record before srun; tampering with the staged image stops the next job before srun.

The job's `apptainer exec` is the real Apptainer's (first on PATH; Slurm copies PATH into the job), and so is the
image: the host-userland SIF of tests/fixtures_sif.py, recorded as `tiny`'s build, with the host's /usr and Python
environment bound in at launch (this machine's torch is the host's). Each rank's probe runs inside the staged image
on its node and says so (Apptainer's APPTAINER_CONTAINER)."""

from __future__ import annotations

import io
import json
import os
import re

import pytest
from fixtures_build import PROJECT_REGISTRY
from fixtures_launch import PROBE, run_launch, wait_job
from fixtures_sif import host_userland_mounts, record_build

from shipyard import registry
import helpers_stage
from shipyard.containers import manifest as mf
from shipyard.commands import registry as registry_commands
from shipyard.commands.context import Context
from shipyard.commands.definitions import render as render_cmd
from shipyard.staging import versions

pytestmark = [pytest.mark.slurm, pytest.mark.real_apptainer]


@pytest.fixture
def flow_project(sandbox, tmp_path, monkeypatch, apptainer_on_path, host_userland_sif):
    """The build tests' project with its `sandbox` cluster switched to the apptainer runtime (storage under the
    project), the real Apptainer first on PATH (Slurm copies PATH into the job), the sandbox as the cluster, and the
    host-userland SIF at hand for `tiny`'s build."""
    root = tmp_path / "proj"
    root.mkdir()
    text = PROJECT_REGISTRY.format(registry="127.0.0.1:9")
    assert "  sandbox:\n    local_sandbox: true\n    runtime: host\n" in text
    text = text.replace("  sandbox:\n    local_sandbox: true\n    runtime: host\n",
                        "  sandbox:\n    local_sandbox: true\n    runtime: apptainer\n")
    (root / "registry.yaml").write_text(text)
    (root / "probe.py").write_text(PROBE)
    (root / ".sandbox" / "images").mkdir(parents=True)
    monkeypatch.chdir(root)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(root / "registry.yaml"))
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    return registry.load(root / "registry.yaml"), host_userland_sif


def _submit(reg, name: str) -> tuple[str, str]:
    out = run_launch([str(reg.root / "probe.py")], submit=True, registry_path=reg.path, environment="tiny",
                     cluster="sandbox", nodes=2, name=name, mounts=",".join(host_userland_mounts()))
    job = re.search(r"submitted job (\d+)", out).group(1)
    return job, str(reg.root / "launch" / "logs" / f"{name}-{job}.out")


def _probes(reg, job: str) -> list[dict]:
    """What each rank of ``job`` recorded (fixtures_launch.PROBE)."""
    return [json.loads(p.read_text()) for p in sorted((reg.root / "probe-out").glob(f"{job}-*.json"))]


def test_check_render_build_stage_launch_verify_and_tamper(sandbox, flow_project):
    reg, sif = flow_project
    assert registry_commands.check(Context(reg, out=io.StringIO()), "tiny", "sandbox") == 0
    assert render_cmd(Context(reg, out=io.StringIO()), "tiny") == 0
    record_build(reg, "tiny", sif)
    rec = helpers_stage.stage(reg, "tiny", "sandbox", out=io.StringIO())
    image = versions.current(reg.root / ".sandbox" / "images" / "tiny.sif")  # the version the launcher names
    assert image.name == f"tiny.{rec.sha256[:12]}.sif"
    assert image.is_file() and rec.sha256 == mf.read_manifest(reg.root / "containers" / "tiny.json").artifacts[
        "sif"].sha256

    job, log = _submit(reg, "bound")
    info = wait_job(sandbox, job)
    text = open(log).read()
    assert info["ExitCode"] == "0:0", text[-3000:]
    assert f"image {image} matches its stage record (sha256 {rec.sha256[:12]}" in text
    probes = _probes(reg, job)  # one rank per node, each inside the staged image
    assert sorted(p["node"] for p in probes) == ["node1", "node2"], text[-3000:]
    assert all(p["env"].get("APPTAINER_CONTAINER") == str(image) for p in probes), probes

    # tamper: the bytes change in place (size and mtime with them); the next job must stop before srun
    with open(image, "ab") as fh:
        fh.write(b"tampered")
    job, log = _submit(reg, "tampered")
    info = wait_job(sandbox, job)
    text = open(log).read()
    assert info["ExitCode"] == "3:0", text[-3000:]
    assert "changed after it was staged" in text and rec.sha256 in text
    assert "job step exit code" not in text  # srun never ran
    assert _probes(reg, job) == []  # no rank started

    # restaged from containers/ (an identical image again): the same launcher's check passes
    helpers_stage.stage(reg, "tiny", "sandbox", out=io.StringIO())
    job, log = _submit(reg, "restaged")
    assert wait_job(sandbox, job)["ExitCode"] == "0:0", open(log).read()[-3000:]
    assert sorted(p["node"] for p in _probes(reg, job)) == ["node1", "node2"]

    # other bytes of the same size with the mtime set back (the owner's `touch -d`): the ctime moved
    st = image.stat()
    data = bytearray(image.read_bytes())
    data[-1] ^= 0xFF
    image.write_bytes(bytes(data))
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert image.stat().st_size == st.st_size
    job, log = _submit(reg, "mtime-restored")
    info = wait_job(sandbox, job)
    text = open(log).read()
    errors = [ln for ln in text.splitlines() if "shipyard: error:" in ln]
    assert info["ExitCode"] == "3:0" and len(errors) == 1 and "changed after it was staged" in errors[0], text[-3000:]
    assert _probes(reg, job) == []  # srun never ran


def test_chain_script_submits_the_whole_chain_on_the_sandbox(sandbox, flow_project):
    reg, _ = flow_project
    out = run_launch(["probe.py"], registry_path=reg.path, environment="tiny", cluster="sandbox", runtime="host",
                     chain=3, name="chained")
    script = reg.root / "launch" / "chained.chain.sh"
    assert "wrote launch/chained.chain.sh" in out
    res = sandbox.run(["bash", str(script)])
    assert res.returncode == 0, res.stderr
    ids = re.findall(r"submitted job (\d+)", res.stdout)
    assert len(ids) == 3
    for prev, job in zip(ids, ids[1:]):
        fields = dict(kv.split("=", 1) for kv in sandbox.run(["scontrol", "show", "job", "-o", job]).stdout.split()
                      if "=" in kv)
        assert fields["Dependency"].startswith(f"afterany:{prev}"), fields
    for job in ids:
        wait_job(sandbox, job)
