"""`invoke nccl-test` refuses, in one line, an image whose build did not include nccl-tests: read from the typed
build manifest (or stage record) the launcher binds to, whose spec sha256 must be the registry's spec, which carries
``nccl_tests``. An external ``--image`` passes only with --image-has-nccl-tests (the user vouches for it)."""

from __future__ import annotations

import io
import os
import subprocess

import pytest
from fixtures_launch import fake_build_manifest, replace_staged_image

from shipyard import identity, registry
from shipyard.commands import launch as launch_commands
from shipyard.commands.context import Context
from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError
from shipyard.files import sha256_file
from shipyard.launch.options import NCCL_TEST, Options
from shipyard.staging import record

REG = """
environments:
  plain: {torch: "2.14.1", cuda: "13.0", python: "3.11", os: debian12, torchvision: false}
  nt: {extends: plain, nccl_tests: true}
clusters:
  pyx:
    runtime: pyxis
    fabric: socket
    nodes: 2
    gpus_per_node: 2
    scheduler: {partition: debug, time: "00:10:00"}
    storage: images
defaults: {environment: nt, cluster: pyx}
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "registry.yaml").write_text(REG)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(project, **flags) -> str:
    ctx = Context.load(str(project / "registry.yaml"), out=io.StringIO())
    assert launch_commands.launch(ctx, Options(dry_run=True, **flags), (), kind=NCCL_TEST) == 0
    return ctx.out.getvalue()


def _built(project, env: str, spec: str | None) -> None:
    path = fake_build_manifest(project, env, "sqsh")
    mf.update_manifest(path, spec_hash=spec)


def test_an_environment_without_nccl_tests_is_refused(project):
    _built(project, "plain", registry.load(project / "registry.yaml").environment("plain").spec_hash)
    with pytest.raises(ShipyardError, match=r"^environments\.plain\.nccl_tests: not set, so its image has no "
                                            r"all_reduce_perf; set `nccl_tests: true`") as e:
        _run(project, environment="plain")
    assert "\n" not in str(e.value)


def test_an_image_built_before_nccl_tests_was_added_is_refused(project):
    _built(project, "nt", registry.load(project / "registry.yaml").environment("plain").spec_hash)  # the old spec
    with pytest.raises(ShipyardError, match=r"built from spec [0-9a-f]{12}, not registry.yaml's [0-9a-f]{12} \(which "
                                            r"has nccl_tests: 2\.19\.6\); rebuild"):
        _run(project)


def test_the_image_built_with_nccl_tests_passes(project):
    _built(project, "nt", registry.load(project / "registry.yaml").environment("nt").spec_hash)
    assert "all_reduce_perf" in _run(project)


def test_an_external_image_needs_the_users_word(project):
    with pytest.raises(ShipyardError, match=r"^--image nvcr\.io#nvidia/pytorch:25\.01-py3: shipyard cannot tell "
                                            r"whether it carries nccl-tests; add --image-has-nccl-tests"):
        _run(project, image="nvcr.io#nvidia/pytorch:25.01-py3")
    text = _run(project, image="nvcr.io#nvidia/pytorch:25.01-py3", image_has_nccl_tests=True)
    assert "--image-has-nccl-tests" in text  # the "regenerate with" line repeats it
    with pytest.raises(ShipyardError, match=r"^--image-has-nccl-tests: only with --image"):
        _run(project, image_has_nccl_tests=True)


def test_an_image_without_mpi_on_a_cluster_that_starts_mpi_ranks_is_refused(project):
    (project / "registry.yaml").write_text(REG.replace("nt: {extends: plain, nccl_tests: true}",
                                                       "nt: {extends: plain, nccl_tests: {mpi: none}}"))
    _built(project, "nt", registry.load(project / "registry.yaml").environment("nt").spec_hash)
    with pytest.raises(ShipyardError, match=r"^environments\.nt\.nccl_tests\.mpi: none \(built without MPI\), but "
                                            r"cluster pyx starts ranks with srun --mpi=pmix"):
        _run(project)


def test_a_replaced_image_stops_the_nccl_test_job_before_srun(project, tmp_path):
    """The nccl-test launcher carries the batch launcher's image check: run as the batch step (srun a stand-in that
    records that it was called), the staged image passes to srun; replaced, with its record rewritten, the job
    stops with one line and exit 3 and srun is never called."""
    spec = registry.load(project / "registry.yaml").environment("nt").spec_hash
    image = project / "images" / "nt.sqsh"
    image.parent.mkdir()
    image.write_bytes(b"hsqs the staged image\n" * 500)
    st = identity.stamp(image)  # the record `invoke stage` writes, with the spec the gate reads
    record.write_record(image, record.StageRecord(sha256_file(image), "b" * 64, st.size, st.mtime_ns, st.ino,
                                                  st.ctime_ns, spec_sha256=spec))
    ctx = Context.load(str(project / "registry.yaml"), out=io.StringIO())
    assert launch_commands.launch(ctx, Options(name="nt-check"), (), kind=NCCL_TEST) == 0
    launcher = project / "launch" / "nt-check.sbatch"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(f"#!/bin/sh\necho srun-called >> {tmp_path / 'srun.log'}\n")
    (fake / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "2"}
    ok = subprocess.run(["bash", str(launcher)], capture_output=True, text=True, env=env, cwd=project, timeout=60)
    assert "matches its stage record" in ok.stdout and (tmp_path / "srun.log").exists(), ok.stdout + ok.stderr
    (tmp_path / "srun.log").unlink()
    replace_staged_image(image)
    bad = subprocess.run(["bash", str(launcher)], capture_output=True, text=True, env=env, cwd=project, timeout=60)
    assert bad.returncode == 3 and not (tmp_path / "srun.log").exists(), bad.stdout + bad.stderr
    assert f"shipyard: error: staged image {image} has content sha256" in bad.stderr
