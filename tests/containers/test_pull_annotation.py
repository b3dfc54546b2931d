"""`pull` takes the input hash of what it pulled from the artifact's ``org.shipyard.input-hash`` annotation, a value
the registry serves: it becomes the manifest's input hash, then a push's tag and part of its URL. Without a
registry: the transfer is replaced by one that serves a chosen annotation."""

from __future__ import annotations

import io

import pytest

from shipyard import project as paths
from shipyard.containers import manifest as mf
from shipyard.containers import push
from shipyard.errors import ShipyardError


def _serving(monkeypatch, annotation):
    def fake_pull_sif(target, env_name, tag, dest_tmp, expect_digest, out):
        dest_tmp.write_bytes(b"not looked at")
        return {"reference": f"oras://h/shipyard/{env_name}:{tag}", "digest": "sha256:" + "d" * 64,
                "layer_digest": "sha256:" + "e" * 64, "pulled": "now", "input_hash": annotation}
    monkeypatch.setattr(push, "pull_sif", fake_pull_sif)


@pytest.mark.parametrize("annotation", ["../../../etc", "a" * 63, "A" * 64, "a" * 64 + "\n", 5, ["a" * 64]])
def test_an_annotation_that_is_not_an_input_hash_is_refused_and_nothing_written(project, monkeypatch, annotation):
    env = next(iter(project.environments.values()))
    _serving(monkeypatch, annotation)
    with pytest.raises(ShipyardError, match="org.shipyard.input-hash annotation .* is not 64 lowercase hex") as exc:
        push.pull(project, env, tag="v1", out=io.StringIO())
    assert "\n" not in str(exc.value)
    assert mf.read_manifest(paths.manifest_path(project, env.name)) == mf.Manifest()
    assert not paths.artifact_path(project, env.name, "sif").exists()
