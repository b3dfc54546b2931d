"""docker backend of `invoke build`, against a real dockerd started by the tests (tests/containers/fixtures_docker.py).

`tiny` builds FROM a local base image (no Docker Hub) that carries python 3.11 and a metadata-only `torch` package
with the pinned versions; its %test equivalent (definitions/tiny.test.sh) really runs in the built image.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid

import docker.errors
import fixtures_build as fb
import pytest
from fixtures_invoke import invoke_cli

from shipyard import registry
from shipyard.containers import engine as b
from shipyard.containers import manifest as mf
from shipyard.containers import push as p
from shipyard.errors import ShipyardError

pytestmark = pytest.mark.docker


@pytest.fixture
def dproject(tmp_path, monkeypatch, docker_env, docker_services, tiny_base):
    _, regd = docker_services
    root = fb.build_project_at(tmp_path / "proj", regd.address)
    monkeypatch.chdir(root)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(root / "registry.yaml"))
    # only the real tools of this machine: no apptainer/enroot (their doubles are added by the tests that want them)
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                                               if "doubles" not in d))
    return registry.load(root / "registry.yaml")


def _tag_exists(api, tag: str) -> bool:
    """Whether dockerd knows ``tag``: its 404 says no; any other error (dockerd gone, a timeout) fails the test."""
    try:
        api.inspect_image(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def test_tiny_builds_runs_its_test_and_is_cached(dproject, docker_env, capsys):
    api = docker_env.client().api
    m = b.build(dproject, dproject.environment("tiny"), backend="docker")
    out = capsys.readouterr().out
    assert m.status == "ok" and m.backend == "docker"
    tag = m.image["tag"]
    assert tag == f"shipyard/tiny:{m.input_hash[:12]}"
    info = api.inspect_image(tag)
    assert info["Id"] == m.image["id"]
    labels = info["Config"]["Labels"]
    assert labels["org.shipyard.spec-sha256"] == dproject.environment("tiny").spec_hash
    log = (dproject.root / m.log).read_text()
    assert "shipyard: %test passed for tiny" in log  # printed by the test script inside the built image
    assert "sif: skipped: apptainer is not on PATH" in out
    # real enroot is on PATH once `sandbox.runtimes` installed it (the real-runtime tests run beside these): either
    # the build said it skipped the .sqsh, or it made one
    assert ("sqsh: skipped: enroot is not on PATH" in out) != (m.artifact("sqsh") is not None), out
    assert m.tools["docker"].startswith("docker engine ") and m.tools["apptainer"] == "missing"
    assert (dproject.root / "definitions" / "tiny.Dockerfile").is_file()

    again = b.build(dproject, dproject.environment("tiny"), backend="docker")
    assert "up to date" in capsys.readouterr().out and again.log == m.log
    forced = b.build(dproject, dproject.environment("tiny"), backend="docker", force=True)
    assert forced.log != m.log and "%test passed" in (dproject.root / forced.log).read_text()
    # the contents record, read from the image in a container of it, the labels from the engine
    rec = m.contents_record
    assert rec is not None and rec.probed == "docker run", log
    assert rec.labels == {k: str(v) for k, v in labels.items()}
    assert rec.apt == {} and rec.python == {}  # the fixture base is FROM scratch: no dpkg, no pip in its venv
    assert forced.previous_contents_record == rec and forced.contents_record.python == rec.python

    api.remove_image(tag)  # the image vanished from the daemon: not a cache hit any more
    rebuilt = b.build(dproject, dproject.environment("tiny"), backend="docker")
    assert rebuilt.log != forced.log and _tag_exists(api, tag)


def test_failing_test_leaves_no_tag_and_manifest_failed(dproject, docker_env):
    api = docker_env.client().api
    with pytest.raises(ShipyardError, match=r"%test failed in the built image of tiny-mismatch"):
        b.build(dproject, dproject.environment("tiny-mismatch"), backend="docker")
    m = mf.read_manifest(dproject.root / "containers" / "tiny-mismatch.json")
    assert m.status == "failed"
    assert "torch is 2.3.1, expected 2.3.0" in (dproject.root / m.log).read_text()
    assert not _tag_exists(api, f"shipyard/tiny-mismatch:{m.input_hash[:12]}")


@pytest.fixture
def apptainer_dirs(apptainer_on_path, tmp_path, monkeypatch):
    """The real Apptainer first on PATH, its temporary and cache folders in the test's (not root's home)."""
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path / "apptainer-cache"))


@pytest.mark.double  # enroot: the strict enroot double
@pytest.mark.real_apptainer
def test_sif_and_sqsh_come_from_the_tagged_image(dproject, docker_env, apptainer_dirs, enroot_double, tmp_path):
    m = b.build(dproject, dproject.environment("tiny"), backend="docker")
    tag = m.image["tag"]
    pid = os.getpid()
    log = (dproject.root / m.log).read_text()
    # the real Apptainer built from the tagged image of the session's dockerd (DOCKER_HOST), saved as an OCI layout
    # in APPTAINER_TMPDIR (each layer checked against its diff_id) and removed after
    assert re.search(rf"sif: {re.escape(tag)} saved as an OCI layout \(\d+ layers, [0-9.]+ GiB uncompressed, each "
                     r"checked against the image's diff_ids\)\n", log), log[-3000:]
    assert re.search(rf"\$ apptainer build containers/tiny.sif.tmp-{pid} oci:{re.escape(str(tmp_path))}/shipyard-oci-"
                     r"[0-9a-f]{16}-\w+\n", log), log[-3000:]
    assert not list(tmp_path.glob("shipyard-oci-*"))
    assert m.tools["apptainer"].startswith("apptainer version ")
    assert set(m.artifacts) == {"sif", "sqsh"}
    sqsh = dproject.root / "containers" / "tiny.sqsh"
    listing = subprocess.run(["unsquashfs", "-l", str(sqsh)], capture_output=True, text=True).stdout
    assert "/opt/shipyard/test.sh" in listing  # the image's files, exported from the daemon
    assert not list((dproject.root / "containers").glob("*.tmp*"))
    sif = dproject.root / "containers" / "tiny.sif"
    labels = subprocess.run(["apptainer", "inspect", "--labels", str(sif)], capture_output=True, text=True,
                            timeout=120)
    assert f"org.shipyard.spec-sha256: {dproject.environment('tiny').spec_hash}" in labels.stdout, labels
    # the SIF carries the image's root filesystem: the real Apptainer runs inside it with the image's ENV PATH, the
    # image's python and torch, not the host's
    res = subprocess.run(["apptainer", "exec", "--nv", str(sif), "python3", "-c",
                          "import os, sys, torch; print(torch.__version__, sys.executable, os.environ['PATH'])"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:2] == ["2.3.1+cu121", "/usr/bin/python3"], res.stdout  # the fixture torch
    assert res.stdout.split()[2].startswith("/usr/local/bin:/usr/bin:/bin"), res.stdout  # the image's ENV PATH


@pytest.mark.real_apptainer
def test_kill_9_during_docker_build_leaves_no_partial_target(dproject, docker_env, apptainer_dirs):
    """SIGKILL of the builder while the docker build runs: no tag, no .sif, and the next build notices. The real
    Apptainer is on PATH, so --formats sif passes the preflight; the kill comes before it runs."""
    api = docker_env.client().api
    # a value no earlier build had, so the daemon's layer cache cannot make the RUN step instant
    reg_file = dproject.root / "registry.yaml"
    reg_file.write_text(reg_file.read_text().replace('OMP_NUM_THREADS: "1"',
                                                     f'OMP_NUM_THREADS: "1"\n      NONCE: "{uuid.uuid4().hex}"', 1))
    proc = invoke_cli.popen("build", "tiny", "--backend", "docker", "--formats", "sif",
                            cwd=dproject.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    logs = dproject.root / "containers" / "logs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the image build is under way (the RUN step)
        if logs.is_dir() and any("RUN set -eu" in f.read_text() for f in logs.glob("tiny-*.log")):
            break
        time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail("the docker build never reached its RUN step: " + proc.communicate()[0])
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    m = mf.read_manifest(dproject.root / "containers" / "tiny.json")
    assert m.status == "building"
    time.sleep(3)  # let the daemon finish or abandon the orphaned build
    assert not _tag_exists(api, f"shipyard/tiny:{m.input_hash[:12]}")
    assert not (dproject.root / "containers" / "tiny.sif").exists()
    res = invoke_cli("build", "tiny", "--backend", "docker", "--formats", "sif", cwd=dproject.root, timeout=None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "was killed before it finished" in res.stdout
    m = mf.read_manifest(dproject.root / "containers" / "tiny.json")
    assert m.status == "ok" and (dproject.root / "containers" / "tiny.sif").is_file()


def test_docker_image_push_and_pull_same_digest(dproject, docker_env, docker_services):
    _, regd = docker_services
    api = docker_env.client().api
    m = b.build(dproject, dproject.environment("tiny"), backend="docker")
    rec = p.push(dproject, dproject.environment("tiny"), "local-docker")
    tag = m.input_hash[:12]
    assert rec["reference"] == f"docker://{regd.address}/shipyard/tiny:{tag}"
    # remove every local name of the image, so the pull must really fetch it
    remote = f"{regd.address}/shipyard/tiny:{tag}"
    api.remove_image(remote)
    api.remove_image(m.image["tag"])
    assert not _tag_exists(api, remote)
    got = p.pull(dproject, dproject.environment("tiny"), "local-docker")
    assert got["digest"] == rec["digest"]
    assert f"{regd.address}/shipyard/tiny@{rec['digest']}" in api.inspect_image(remote)["RepoDigests"]
    assert got["image_id"] == m.image["id"]  # same content, same image ID
    man = mf.read_manifest(dproject.root / "containers" / "tiny.json")
    assert man.pushed["local-docker"]["digest"] == man.pulled["local-docker"]["digest"]


def test_no_docker_engine_is_one_line_error(project, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(ShipyardError, match="docker backend: .*does not answer|no Docker engine"):
        b.build(project, project.environment("tiny"), backend="docker")


def test_files_reach_the_image_through_the_build_context(dproject, docker_env):
    reg_file = dproject.root / "registry.yaml"
    reg_file.write_text(reg_file.read_text().replace(
        "    stack: base\n", "    stack: base\n    files:\n      - {src: data/config.txt, dst: /opt/config.txt}\n", 1))
    (dproject.root / "data").mkdir()
    (dproject.root / "data" / "config.txt").write_text("lr: 0.1\n")
    (dproject.root / "containers").mkdir(exist_ok=True)
    (dproject.root / "containers" / "huge.sif").write_bytes(b"\0" * 1024)  # never sent to the daemon
    reg = registry.load(reg_file)
    m = b.build(reg, reg.environment("tiny"), backend="docker")
    client = docker_env.client()
    out = client.containers.run(m.image["tag"], ["/bin/cat", "/opt/config.txt"], remove=True, network_mode="none")
    assert out == b"lr: 0.1\n"
    ls = client.containers.run(m.image["tag"], ["/bin/ls", "/"], remove=True, network_mode="none").decode()
    assert "containers" not in ls.split()


def test_verify_rebuild_of_the_same_lock_finds_no_python_difference(dproject, docker_env):
    """`invoke build tiny --verify-rebuild` with the docker backend: two builds, both images probed, compared."""
    import io

    from shipyard.commands import containers as container_commands
    from shipyard.commands.context import Context

    ctx = Context(dproject, out=io.StringIO(), err=io.StringIO())
    rc = container_commands.build(ctx, "tiny", backend="docker", force=True, verify_rebuild=True)
    text = ctx.out.getvalue()
    assert rc == 0, text + ctx.err.getvalue()
    assert "Python packages: identical in both builds" in text and "ERROR" not in text
    m = mf.read_manifest(dproject.root / "containers" / "tiny.json")
    assert m.contents_record is not None and m.previous_contents_record is not None
