"""`invoke build --slurm`: the batch script (golden + shellcheck) and a real submission to the sandbox cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import fixtures_build as fb
import pytest
from helpers_registry import GOLDEN, golden

from shipyard import registry
from shipyard.containers import manifest as mf
from shipyard.containers import on_slurm as bs
from shipyard.errors import ShipyardError

HPC = """\
  hpc:
    runtime: apptainer
    fabric: ib
    gpus_per_node: 4
    modules: [apptainer/1.3.6]
    scheduler:
      partition: gpu
      partitions: [gpu, cpu-build]
      build_partition: cpu-build
      account: proj-123
      time: "02:00:00"
      build_time: "01:30:00"
      build_cpus: 16
      build_mem: 64G
"""


def _reg():
    text = fb.PROJECT_REGISTRY.format(registry="127.0.0.1:9").replace("clusters:\n", "clusters:\n" + HPC, 1)
    return registry.load_text(text, "registry.yaml", Path("/proj/registry.yaml"))


def _job(reg, cluster: str, partition=None, **kw) -> str:
    argv = bs.job_argv("tiny", kw.get("backend", "apptainer"), kw.get("fakeroot", False), kw.get("force", False),
                       kw.get("formats"), python="/usr/bin/python3")
    return bs.render_job(reg, "tiny", reg.cluster(cluster), partition, argv)


@pytest.mark.parametrize("cluster,kw,name", [
    ("sandbox", {}, "sandbox.sbatch"),
    ("hpc", {"fakeroot": True, "force": True}, "hpc.sbatch"),
    ("hpc", {"backend": "docker", "formats": "sif,sqsh"}, "hpc-docker.sbatch"),
])
def test_build_job_script_golden_and_shellcheck(cluster, kw, name, tmp_path):
    text = _job(_reg(), cluster, **kw)
    golden(GOLDEN / "build" / name, text)
    script = tmp_path / name
    script.write_text(text)
    res = subprocess.run(["shellcheck", "-S", "warning", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_job_uses_build_partition_resources_and_absolute_log():
    text = _job(_reg(), "hpc")
    assert "#SBATCH --partition=cpu-build\n" in text and "#SBATCH --account=proj-123\n" in text
    assert "#SBATCH --cpus-per-task=16\n" in text and "#SBATCH --mem=64G\n" in text
    assert "#SBATCH --time=01:30:00\n" in text
    assert "#SBATCH --output=/proj/containers/logs/tiny-build-%j.out\n" in text
    assert "module load apptainer/1.3.6\n" in text
    exec_line = [line for line in text.splitlines() if line.startswith("exec ")][0]
    assert "--slurm" not in exec_line  # the job builds locally on its node; it must not submit itself again
    assert "#SBATCH --partition=gpu\n" in _job(_reg(), "hpc", partition="gpu")


def test_unusable_directive_values_are_refused():
    reg = _reg()
    with pytest.raises(ShipyardError, match="not usable in an #SBATCH line"):
        _job(reg, "hpc", partition="gpu --exclusive")


PYXIS = """\
  pc:
    runtime: pyxis
    fabric: efa
    gpus_per_node: 8
    scheduler: {partition: gpu, partitions: [gpu, cpu], build_partition: cpu}
    storage: /fsx/images
    fabric_options: {efa_installer: "1.43.0"}
"""


def test_build_job_picks_the_tool_the_clusters_runtime_needs():
    """apptainer clusters get apptainer (a .sif); pyxis clusters docker + enroot (a .sqsh); combinations that cannot
    make the image the runtime starts are refused before a job is queued; a host cluster is only a build machine."""
    text = fb.PROJECT_REGISTRY.format(registry="127.0.0.1:9").replace("clusters:\n", "clusters:\n" + HPC + PYXIS, 1)
    reg = registry.load_text(text, "registry.yaml", Path("/proj/registry.yaml"))
    assert bs.tool_for(reg.cluster("hpc"), None, None) == ("apptainer", "sif")
    assert bs.tool_for(reg.cluster("hpc"), "docker", None) == ("docker", "sif")
    assert bs.tool_for(reg.cluster("pc"), None, None) == ("docker", "sqsh")
    assert bs.tool_for(reg.cluster("pc"), "docker", "sif,sqsh") == ("docker", "sif,sqsh")
    with pytest.raises(ShipyardError, match="runs pyxis, which starts an enroot .sqsh, and apptainer makes only a "
                                            ".sif; use --backend docker"):
        bs.tool_for(reg.cluster("pc"), "apptainer", None)
    with pytest.raises(ShipyardError, match="--formats sif: cluster pc runs pyxis, which starts a .sqsh; add sqsh"):
        bs.tool_for(reg.cluster("pc"), "docker", "sif")
    with pytest.raises(ShipyardError, match="--formats sqsh: cluster hpc runs apptainer, which starts a .sif"):
        bs.tool_for(reg.cluster("hpc"), "docker", "sqsh")
    assert bs.tool_for(reg.cluster("sandbox"), None, None) == ("apptainer", None)


def test_partition_must_belong_to_the_cluster(project):
    with pytest.raises(ShipyardError, match="--partition nope: not a partition of cluster sandbox"):
        bs.submit(project, "tiny", cluster_name="sandbox", partition="nope")


@pytest.fixture
def node_mirror(sandbox, base_registry):
    """base_registry as the sandbox's nodes reach it: a forwarder on the controller's address (its own network
    namespace) to the registry on this host's 127.0.0.1. Not a loopback address for the nodes, so Apptainer pulls
    over plain HTTP only because registry.yaml says insecure_http (`--no-https`)."""
    from fixtures_runtimes import NamespaceForwarder

    from shipyard import slurm

    pid = slurm.controller_pid(slurm.read_sandbox_state(sandbox.directory))
    host, port = base_registry.address.rsplit(":", 1)
    fwd = NamespaceForwarder(f"/proc/{pid}/ns/net", sandbox.info["controller"]["ip"], (host, int(port)))
    yield fwd.address
    fwd.close()


def _job_project(tmp_path, sandbox, node_mirror, monkeypatch, apt: str | None = None):
    """The build project with base_mirror at the nodes' address of the tests' registry, set up for a job."""
    root = fb.build_project_at(tmp_path / "proj")
    os.chmod(tmp_path, 0o755)
    reg_file = root / "registry.yaml"
    text = reg_file.read_text() + f"base_mirror:\n  url: {node_mirror}\n  insecure_http: true\n"
    if apt:
        text = text.replace("    stack: base\n", f"    stack: base\n    apt: [{apt}]\n", 1)
    reg_file.write_text(text)
    fb.no_build_network(monkeypatch)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(reg_file))
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path / "cache"))
    return registry.load(reg_file)


@pytest.mark.slurm
@pytest.mark.real_apptainer
def test_build_runs_as_a_job_on_a_sandbox_node(sandbox, node_mirror, apptainer_on_path, tmp_path, monkeypatch):
    """Real Slurm and the real Apptainer: sbatch on the sandbox's build partition; `apptainer build` runs on a node
    (PATH from the submitter), pulls the base through base_mirror, runs %post and %test and writes the SIF."""
    reg = _job_project(tmp_path, sandbox, node_mirror, monkeypatch)
    root = reg.root
    assert bs.submit(reg, "tiny", wait=True) == 0
    m = mf.read_manifest(root / "containers" / "tiny.json")
    assert m.status == "ok"
    assert m.host in sandbox.nodes  # built on a compute node, not on this (login) host
    assert m.base == {"reference": "shipyard-test/base:1", "mirrored": f"{node_mirror}/shipyard-test/base:1"}
    assert m.tools["apptainer"].startswith("apptainer version 1.4.5")
    sif = root / "containers" / "tiny.sif"
    assert sif.read_bytes()[32:41] == b"SIF_MAGIC"
    log = (root / m.log).read_text()
    assert "$ apptainer build --no-https containers/tiny.sif.tmp-" in log
    assert "shipyard: %test passed for tiny" in log and "INFO:    Build complete" in log
    out = subprocess.run(["apptainer", "exec", str(sif), "sh", "-c", "echo $SHIPYARD_ENV"], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout == "tiny\n", out.stderr
    logs = list((root / "containers" / "logs").glob("tiny-build-*.out"))
    assert len(logs) == 1 and "built containers/tiny.sif" in logs[0].read_text()
    assert shutil.which("sbatch")  # the real client was used through the sandbox wrapper


@pytest.mark.slurm
@pytest.mark.real_apptainer
def test_build_job_takes_the_submitters_ca_and_proxy_into_the_build_only(sandbox, node_mirror, apptainer_on_path,
                                                                         tmp_path, monkeypatch):
    """`build --slurm` behind a proxy / private CA: sbatch hands the submitter's environment to the job, whose real
    build binds the CA copy and proxy settings for %post (the base's apt-get stub says they arrived); the batch
    script, the job log, the build log and the manifest hold neither the CA path nor the proxy value."""
    reg = _job_project(tmp_path, sandbox, node_mirror, monkeypatch, apt="shipyard-test-exit-0")
    root = reg.root
    ca = tmp_path / "site-private-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    monkeypatch.setenv("https_proxy", "http://proxy-value.invalid:3128")
    assert bs.submit(reg, "tiny", wait=True) == 0
    m = mf.read_manifest(root / "containers" / "tiny.json")
    assert m.status == "ok" and m.host in sandbox.nodes
    log = (root / m.log).read_text()
    assert " --bind " in log and ":/mnt " in log
    assert "apt-get stub: https_proxy is set" in log and "apt-get stub: SSL_CERT_FILE is readable" in log
    texts = [p.read_text() for p in (root / "containers" / "logs").iterdir()] + [str(m)]
    assert len(texts) >= 4  # batch script, job log, build log, manifest
    for text in texts:
        assert str(ca) not in text and "proxy-value.invalid" not in text
