"""`invoke nccl-test` refuses, in one line, an image whose build did not include nccl-tests: read from the typed
build manifest (or stage record) the launcher binds to, whose spec sha256 must be the registry's spec, which carries
``nccl_tests``. An external ``--image`` passes only with --image-has-nccl-tests (the user vouches for it)."""

from __future__ import annotations

import io

import pytest
from fixtures_launch import fake_build_manifest

from shipyard import registry
from shipyard.commands import launch as launch_commands
from shipyard.commands.context import Context
from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError
from shipyard.launch.options import NCCL_TEST, Options

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
