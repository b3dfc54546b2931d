"""One real image, built here end to end: check -> render -> build (real docker build of a real environment) ->
%test in the real image -> stage -> a launcher job on the sandbox verifies the staged image's record -> tampering
stops the next job before srun.

The environment (tests/data/debian12/registry.yaml) is ``torch 2.0.1`` / CUDA 11.7 / Python 3.11 on ``os: debian12``,
built FROM a Debian 12 base made here with debootstrap from Debian's own packages (tests/containers/fixtures_debian.py), and
installed from its committed hash lock (tests/data/debian12/definitions/real.lock, written by `invoke lock real
--exclude-newer 2025-06-01` with uv against PyPI) with pip ``--require-hashes``: the real torch wheel and the real
nvidia-* CUDA wheels from PyPI. Why this environment: PyPI's Linux torch wheels are CUDA builds, and torch 2.0.1 is
the smallest release whose torchrun runs on Debian 12's Python 3.11 (cu11 wheels; torch 2.3.1 is 779 MB plus about
2.6 GB of cu12 wheels and triton, newer releases more). torch 1.13.1, smaller, was used until the launchers ran
torchrun in this image: on Python 3.11 its torchrun stops at start (compat.yaml ``torchrun_broken``). The %test still checks python, torch, ``torch.version.cuda`` and the NCCL version
torch reports, with no GPU. torchvision/torchaudio are left out: more bytes, nothing new exercised.

The build runs behind a real HTTPS proxy (a CONNECT proxy on 127.0.0.1, ``HTTPS_PROXY``) and with a CA bundle under
a private path (``SSL_CERT_FILE``): this machine intercepts TLS, so pip in the container fails with "self-signed
certificate in certificate chain" unless the bundle reaches it. The test then proves that neither the CA path nor
the proxy values are in the image's history, config or labels, in its file system, in the manifest or in the log.

The same image then trains examples/train.py on the sandbox's 2 nodes under each real runtime: as a SIF that the real
Apptainer 1.4.5 builds from the docker image (``apptainer build X.sif oci:LAYOUT``, the build's own step, with the
image saved as an OCI layout), as root and as an unprivileged user (setuid mode); as a .sqsh that the real enroot
imports, under the real pyxis; unpacked, under the real ch-run.

Marked slow: about 1.8 GB from PyPI; bench/README.md has its time against a ``pip download`` of the same lock.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from fixtures_build import no_build_network
from fixtures_launch import as_user, job_story, make_user, run_launch, searchable_for_others, wait_job

from shipyard import registry
from shipyard.files import sha256_file
from shipyard.sandbox import runtimes
from shipyard.staging import versions
import helpers_stage
from shipyard.containers import manifest as mf
from shipyard.commands import registry as registry_commands
from shipyard.commands.context import Context
from shipyard.commands.definitions import render as render_cmd

# after the real-runtimes run's short tests, before the nccl-tests file (which takes an image the docker run makes
# meanwhile): tests/run_order.py
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.slurm, pytest.mark.real_runtimes,
              pytest.mark.real_apptainer, pytest.mark.run_order(1)]

DATA = Path(__file__).resolve().parents[1] / "data" / "debian12"
MARK = "shipyard-e2e-marker"


def _host_bundle() -> Path:
    for var in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return Path(os.environ[var])
    return Path("/etc/ssl/certs/ca-certificates.crt")


def _pip_download_seconds(lock: Path, dest: Path, ca: Path) -> float:
    """The baseline: the same hash-locked closure downloaded by pip on the host through the same proxy (no image,
    no install), with only PyPI as its index (no pip.conf: this machine's adds local wheel directories)."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "--cert", str(ca),
                    "--only-binary=:all:", "--platform", "manylinux2014_x86_64", "--python-version", "3.11",
                    "-r", str(lock), "-d", str(dest)], check=True, env=env, timeout=1800)
    return time.monotonic() - t0


def _holds(text: str, secret: str) -> bool:
    """Whether ``secret`` stands in ``text`` as itself: a bare number (the proxy's port) counts only where no letter,
    digit or dot touches it, since five digits also occur inside the hashes, sizes and versions of a manifest."""
    if not secret.isdigit():
        return secret in text
    return re.search(rf"(?<![0-9A-Za-z.]){secret}(?![0-9A-Za-z])", text) is not None


def test_real_debian12_image_built_tested_staged_and_verified_by_a_job(
        sandbox, docker_env, debian12_base, connect_proxy, tmp_path, monkeypatch, apptainer_on_path, real_pyxis):
    root = tmp_path / "proj"
    (root / "definitions").mkdir(parents=True)
    shutil.copy(DATA / "registry.yaml", root / "registry.yaml")
    shutil.copy(DATA / "definitions" / "real.lock", root / "definitions" / "real.lock")
    (root / ".sandbox" / "images").mkdir(parents=True)
    monkeypatch.chdir(root)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(root / "registry.yaml"))
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    # apptainer's work and cache folders under the test's tmp (the build's free-space check looks there)
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path / "apptainer-cache"))
    # the private dockerd has no bridge network: downloads need the host's (a site setting, like a proxy)
    monkeypatch.setenv("SHIPYARD_DOCKER_NETWORK", "host")
    # the site's network settings: the host's CA bundle under a private path, and a real proxy
    site_ca = tmp_path / f"{MARK}-site-ca.pem"
    shutil.copy(_host_bundle(), site_ca)
    no_build_network(monkeypatch)
    monkeypatch.setenv("SSL_CERT_FILE", str(site_ca))
    monkeypatch.setenv("HTTPS_PROXY", connect_proxy.url)
    monkeypatch.setenv("NO_PROXY", f"localhost,{MARK}.invalid")
    secrets = [str(site_ca), MARK, connect_proxy.url, connect_proxy.url.rsplit(":", 1)[1]]
    reg = registry.load(root / "registry.yaml")

    assert registry_commands.check(Context(reg, out=io.StringIO()), "real", "sandbox") == 0
    assert render_cmd(Context(reg, out=io.StringIO()), "real") == 0
    dockerfile = (root / "definitions" / "real.Dockerfile").read_text()
    assert f"FROM {debian12_base} AS shipyard-download" in dockerfile and "--require-hashes" in dockerfile

    out = io.StringIO()
    t0 = time.monotonic()
    assert helpers_stage.build(reg.path, "real", backend="docker", formats="sif", out=out) == 0
    build_s = time.monotonic() - t0
    m = mf.read_manifest(root / "containers" / "real.json")
    log = (root / m.log).read_text()
    assert m.status == "ok", log[-3000:]
    # the downloads went through the proxy (pip -> PyPI over CONNECT) and trusted the site's CA bundle
    assert connect_proxy.tunnels, "no download went through the proxy"
    assert "build network: the host's CA bundle and HTTPS_PROXY, NO_PROXY passed" in log
    # %test ran in the real image and passed (python, torch 2.0.1, torch.version.cuda 11.7, NCCL)
    assert "shipyard: %test passed for real" in log

    # nothing of the site's settings in the image: history, config, labels, file system; nor manifest, nor log
    api = docker_env.client().api
    image = api.inspect_image(m.docker_tag)
    history = json.dumps(api.history(m.docker_tag))
    config = json.dumps(image["Config"]) + json.dumps(image.get("ContainerConfig") or {})
    for text, what in ((history, "history"), (config, "config/labels"), (mf.render(m), "manifest"), (log, "log")):
        for s in secrets:
            assert not _holds(text, s), f"{s!r} is in the image's {what}"
    assert image["Config"]["Labels"]["org.shipyard.os"] == "debian12"
    res = docker_env.client().containers.run(
        m.docker_tag, ["/bin/sh", "-c", "ls -A /mnt; find / -xdev -name 'shipyard-build*' -print; "
                            "python -c 'import torch; print(torch.__version__, torch.version.cuda)'"],
        network_mode="none", remove=True).decode()
    assert res.split() == ["2.0.1+cu117", "11.7"], res
    # file contents, not names: every file under /opt (the venv is /opt/venv), /etc and root's home is read for the
    # CA path, the marker and the proxy URL (the bare port is left out: five digits occur by chance in 2 GB of
    # binaries). grep exits 1 when nothing matches; the venv must be among what it read.
    needles = " ".join(f"-e {shlex.quote(s)}" for s in (str(site_ca), MARK, connect_proxy.url))
    scan = docker_env.client().containers.run(
        m.docker_tag, ["/bin/sh", "-c", f"test -x /opt/venv/bin/python || echo NO-VENV; "
                            f"grep -rlsaF {needles} /opt /etc /root; echo grep-exit=$?"],
        network_mode="none", remove=True).decode()
    assert scan.split() == ["grep-exit=1"], f"site settings in the image's files: {scan}"

    # stage the SIF the real Apptainer made from that image (readable by every user: an unprivileged user's job
    # runs it below); a job verifies its record before its step and trains
    rec = helpers_stage.stage(reg, "real", "sandbox", out=io.StringIO(), mode="world")
    staged = versions.current(root / ".sandbox" / "images" / "real.sif")  # the version launchers name
    assert rec.sha256 == m.artifacts["sif"].sha256 and staged.is_file()
    (root / "containers" / "real.sif").unlink()  # GBs: the staged copy is the one that runs
    (root / "examples").mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "train.py", root / "examples" / "train.py")
    appt_s = _real_apptainer(sandbox, root, reg.path, staged, rec)
    staged.unlink()

    def drop_docker_image():
        """The image in the daemon's storage (GBs, its venv twice: download stage and final) once the real
        runtimes' .sqsh is made from it: the test's peak disk use was 31 GB, a CI machine may have less."""
        for name in (m.docker_tag, m.docker_id):
            try:
                api.remove_image(name, force=True)
            except Exception:
                pass
        api.prune_images(filters={"dangling": True})

    pyxis_s = _real_enroot_and_pyxis(sandbox, root, m, monkeypatch, drop_docker_image)

    # bench/README.md's baseline (the same lock downloaded by pip, 2.4 GB of wheels) only when asked for: a
    # measurement, not a check, and half a minute of CI's critical path
    baseline_s = None
    if os.environ.get("SHIPYARD_BENCH_REAL_IMAGE") == "1":
        baseline_s = _pip_download_seconds(root / "definitions" / "real.lock", tmp_path / "wheels", site_ca)
        shutil.rmtree(tmp_path / "wheels")  # pytest keeps the last runs' temp dirs: leave no GBs of wheels behind
    # pytest keeps the last runs' temp dirs: leave no multi-GB file behind
    for leftover in (root / ".sandbox" / "images").glob("real*.sqsh"):  # the version file (GBs) and its pointer
        leftover.unlink()
    ratio = (f"pip download of the same lock {baseline_s:.0f} s; ratio {build_s / baseline_s:.1f}" if baseline_s
             else "baseline not measured (SHIPYARD_BENCH_REAL_IMAGE=1 measures it)")
    print(f"\nreal image: docker build (download stage, install, %test, SIF) {build_s:.0f} s; {ratio}; real "
          "Apptainer, enroot/pyxis: " + ", ".join(f"{k} {v:.0f} s" for k, v in {**appt_s, **pyxis_s}.items()))


def _real_enroot_and_pyxis(sandbox, root: Path, m, monkeypatch, drop_docker_image) -> dict[str, float]:
    """The same docker image through the real runtimes: `invoke stage --from docker` runs
    ``enroot import dockerd://TAG`` as a Slurm job on the build partition (real enroot, the job reaches the private
    dockerd through DOCKER_HOST, which sbatch passes on), then a 2-node `invoke launch --runtime pyxis` job trains
    examples/train.py to the end inside that image with the real pyxis, and a tampered .sqsh is stopped before srun.
    The cluster is the same sandbox with ``runtime: pyxis`` (a second registry file in the same project)."""
    times: dict[str, float] = {}
    pyx_path = root / "registry-pyxis.yaml"
    pyx_path.write_text((root / "registry.yaml").read_text().replace("runtime: apptainer", "runtime: pyxis"))
    pyx = registry.load(pyx_path)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(pyx_path))
    # CI's cost: an uncompressed SquashFS (mksquashfs and each node's unsquashfs skip lzo on 2 cores); enroot reads
    # its settings from the job's environment, which sbatch passes on like DOCKER_HOST
    monkeypatch.setenv("ENROOT_SQUASH_OPTIONS", "-noI -noD -noF -noX -no-duplicates")
    # torchrun's agents say what they do (rendezvous, ranks, the exit barrier and how long it waited): a job that
    # fails after training (CI, twice: node2's agent lost the c10d store) shows its timeline in the job log
    monkeypatch.setenv("LOGLEVEL", "INFO")
    out = io.StringIO()
    t0 = time.monotonic()
    rec = helpers_stage.stage(pyx, "real", "sandbox", out=out, source="docker")
    times["enroot import dockerd:// (a Slurm job)"] = time.monotonic() - t0
    sqsh = versions.current(root / ".sandbox" / "images" / "real.sqsh")  # the version file launchers name
    assert "enroot import of dockerd://" in out.getvalue(), out.getvalue()
    assert rec.source_reference == f"dockerd://{m.docker_tag}" and rec.input_hash == m.input_hash
    assert sqsh.is_file() and rec.sha256 == sha256_file(sqsh)
    with open(sqsh, "rb") as fh:
        assert fh.read(4) == b"hsqs", "enroot import wrote no SquashFS"
    drop_docker_image()


    def submit(name):
        text = run_launch(["examples/train.py", "--steps", "20"], submit=True, registry_path=pyx_path,
                          environment="real", cluster="sandbox", runtime="pyxis", nodes=2, name=name)
        job = re.search(r"submitted job (\d+)", text).group(1)
        log = root / "launch" / "logs" / f"{name}-{job}.out"
        return job, wait_job(sandbox, job, timeout=600, log=log), log

    t0 = time.monotonic()
    job, info, log = submit("real-pyxis")
    times["2-node pyxis training job"] = time.monotonic() - t0
    assert info["ExitCode"] == "0:0", job_story(sandbox, job, log)
    text = log.read_text()
    assert f"image {sqsh} matches its stage record (sha256 {rec.sha256[:12]}" in text
    result = [line for line in text.splitlines() if line.startswith("result:")]
    assert len(result) == 1 and "end_step=20" in result[0], text[-4000:]
    assert int(re.search(r"world_size=(\d+)", result[0]).group(1)) >= 2, result
    assert all(f"shipyard: node {i} (node{i + 1}) of 2 starting torchrun" in text for i in range(2)), text[-4000:]
    # torch in that job came from the image: the same named container (pyxis --container-name, reused per node)
    # answers with the image's torch 2.0.1 under /opt/venv, which the host does not have (its venv has another)
    script = (root / "launch" / "real-pyxis.sbatch").read_text()
    name = re.search(r"--container-name=(\S+)", script)
    # the launcher's named container (--container-name=<env>-<hash>)
    assert name and name.group(1) == f"real-{rec.sha256[:16]}", script[:3000]
    # a host may have an /opt/venv of its own (a CI machine's): the proof holds while it lacks the image's torch
    if Path("/opt/venv/bin/python").exists():
        own = subprocess.run(["/opt/venv/bin/python", "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
        assert "2.0.1+cu117" not in own.stdout, "the host's /opt/venv has the image's torch: nothing is proven"
    _torch_is_the_images(sandbox, [f"--container-image={sqsh}", f"--container-name={name.group(1)}",
                                   "--no-container-mount-home"])
    # the named container's unpacked copy on each node (GBs each) goes before Charliecloud unpacks a third, through
    # the real enroot on each node (pyxis names it pyxis_NAME under container_scope=global)
    res = sandbox.run(["srun", "-N2", "--ntasks-per-node=1", "enroot", "remove", "-f", f"pyxis_{name.group(1)}"],
                      client_timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not [n for n in sandbox.nodes if (runtimes.node_dir(sandbox.directory, n) / "enroot" / "data"
                                             / f"pyxis_{name.group(1)}").exists()]

    t0 = time.monotonic()
    _real_charliecloud(sandbox, root, sqsh, pyx_path)
    times["2-node charliecloud training job (unpack included)"] = time.monotonic() - t0

    with open(sqsh, "ab") as fh:
        fh.write(b"tampered")
    job, info, log = submit("real-pyxis-tampered")
    text = log.read_text()
    assert info["ExitCode"] == "3:0", text[-3000:]
    assert "changed after it was staged" in text and "job step exit code" not in text
    return times


def _train(sandbox, project: Path, reg_path: Path, name: str, user=None, **flags) -> tuple[str, dict, Path]:
    """A 2-node `invoke launch -- examples/train.py --steps 20` job with a checkpoint of its own (a later job in the
    same project must not resume at the end); as ``user`` (a pwd entry) when given: the launcher written here, the
    project handed to that user, sbatch run as them. (job id, its fields, its log)."""
    command = ["examples/train.py", "--steps", "20", "--checkpoint", f"checkpoints/{name}.pt"]
    if user is None:
        text = run_launch(command, submit=True, registry_path=reg_path, environment="real", cluster="sandbox",
                          nodes=2, name=name, **flags)
        job = re.search(r"submitted job (\d+)", text).group(1)
    else:
        with contextlib.chdir(project):  # the launcher's workdir: the user's project
            run_launch(command, registry_path=reg_path, environment="real", cluster="sandbox", nodes=2, name=name,
                       **flags)
        subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(project)], check=True)
        res = subprocess.run(sandbox.argv([*as_user(user), "sbatch", "--parsable",
                                           str(project / "launch" / f"{name}.sbatch")]),
                             capture_output=True, text=True, timeout=60, env=sandbox.env())
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip().split(";")[0]
    log = project / "launch" / "logs" / f"{name}-{job}.out"
    return job, wait_job(sandbox, job, timeout=600, log=log), log


def _trained(sandbox, job: str, log: Path) -> str:
    """The job's log, after checking that it trained to the end on both nodes."""
    text = log.read_text()
    result = [line for line in text.splitlines() if line.startswith("result:")]
    assert len(result) == 1 and "end_step=20" in result[0], job_story(sandbox, job, log)
    assert int(re.search(r"world_size=(\d+)", result[0]).group(1)) >= 2, result
    assert all(f"shipyard: node {i} (node{i + 1}) of 2 starting torchrun" in text for i in range(2)), text[-4000:]
    return text


def _torch_is_the_images(sandbox, words: list[str]) -> None:
    """On both nodes, ``srun WORDS sh -c ...`` (srun's container options, or a runtime's command and image) finds
    torchrun, python and torch 2.0.1 under the image's /opt/venv."""
    res = sandbox.run(["srun", "-N2", "--ntasks-per-node=1", *words, "sh", "-c",
                       "command -v torchrun; python -c 'import sys, torch; print(sys.executable, torch.__version__, "
                       "torch.__file__)'"], client_timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.split()
    assert lines.count("/opt/venv/bin/torchrun") == 2 and lines.count("2.0.1+cu117") == 2, res.stdout
    assert len([w for w in lines if w.startswith("/opt/venv/") and w.endswith("/torch/__init__.py")]) == 2, res.stdout
    assert len([w for w in lines if w.startswith("/opt/venv/bin/python")]) == 2, res.stdout


def _real_apptainer(sandbox, root: Path, reg_path: Path, staged: Path, rec) -> dict[str, float]:
    """`invoke launch --runtime apptainer` (the registry's runtime) with the real Apptainer: a 2-node job trains
    examples/train.py to the end inside the staged SIF as root, then as an unprivileged user (setuid mode; the
    image given with --image, read in place), and a tampered SIF is stopped before srun. torch in those jobs is the
    image's."""
    times: dict[str, float] = {}
    t0 = time.monotonic()
    job, info, log = _train(sandbox, root, reg_path, "real-appt")
    times["2-node apptainer training job (root)"] = time.monotonic() - t0
    assert info["ExitCode"] == "0:0", job_story(sandbox, job, log)
    text = _trained(sandbox, job, log)
    assert f"image {staged} matches its stage record (sha256 {rec.sha256[:12]}" in text
    assert f"apptainer exec --nv --no-home --bind {root}:{root} --pwd {root} {staged}" in \
        (root / "launch" / "real-appt.sbatch").read_text()
    _torch_is_the_images(sandbox, ["apptainer", "exec", "--no-home", str(staged)])

    base = Path(tempfile.mkdtemp(prefix="shipyard-real-appt-"))
    base.chmod(0o755)
    name = f"sy-appt-{uuid.uuid4().hex[:6]}"
    restore = searchable_for_others([staged])
    try:
        user = make_user(name, base / name)
        project = base / "project"
        (project / "examples").mkdir(parents=True)
        shutil.copy(reg_path, project / "registry.yaml")
        shutil.copy(root / "examples" / "train.py", project / "examples" / "train.py")
        t0 = time.monotonic()
        job, info, log = _train(sandbox, project, project / "registry.yaml", "real-appt-user", user=user,
                                image=str(staged))
        times["2-node apptainer training job (unprivileged)"] = time.monotonic() - t0
        assert info["ExitCode"] == "0:0", job_story(sandbox, job, log)
        assert info["UserId"].startswith(name), info["UserId"]
        _trained(sandbox, job, log)
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
        for d, mode in reversed(restore):
            d.chmod(mode)

    with open(staged, "ab") as fh:
        fh.write(b"tampered")
    job, info, log = _train(sandbox, root, reg_path, "real-appt-tampered")
    text = log.read_text()
    assert info["ExitCode"] == "3:0", text[-3000:]
    assert "changed after it was staged" in text and "job step exit code" not in text
    return times


def _real_charliecloud(sandbox, root: Path, sqsh: Path, reg_path: Path) -> None:
    """Charliecloud with the real image: a 2-node `invoke launch --runtime charliecloud` job trains
    examples/train.py to the end inside the real image with the real ch-run 0.31, torch from the image.

    The image is the staged .sqsh unpacked into a directory (ch-run's other image kind) with the project's path
    made as a mount point: a SquashFS is read-only and ch-run 0.31 cannot create a bind destination in it (a
    Charliecloud user's directory images take their mount points the same way)."""
    image = root / ".sandbox" / "images" / "real-ch"
    subprocess.run(["unsquashfs", "-n", "-d", str(image), str(sqsh)], check=True, stdout=subprocess.DEVNULL)
    (image / str(root).lstrip("/")).mkdir(parents=True, exist_ok=True)
    text = run_launch(["examples/train.py", "--steps", "20"], submit=True, registry_path=reg_path,
                      environment="real", cluster="sandbox", runtime="charliecloud", nodes=2, name="real-ch",
                      image=str(image))
    job = re.search(r"submitted job (\d+)", text).group(1)
    log_path = root / "launch" / "logs" / f"real-ch-{job}.out"
    info = wait_job(sandbox, job, timeout=600, log=log_path)
    log = log_path.read_text()
    assert info["ExitCode"] == "0:0", log[-4000:]
    assert "ch-run -b " in (root / "launch" / "real-ch.sbatch").read_text()
    result = [line for line in log.splitlines() if line.startswith("result:")]
    assert len(result) == 1 and "end_step=20" in result[0], log[-4000:]
    assert int(re.search(r"world_size=(\d+)", result[0]).group(1)) >= 2, result
    # the python and torch of that job are the image's (the host's torch is another, checked above)
    res = sandbox.run(["srun", "-N2", "--ntasks-per-node=1", "ch-run", str(image), "--", "/opt/venv/bin/python",
                       "-c", "import torch; print(torch.__version__, torch.__file__)"], client_timeout=300,
                      env={**sandbox.env(), "USER": "root"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split().count("2.0.1+cu117") == 2, res.stdout
    shutil.rmtree(image)

