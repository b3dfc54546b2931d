"""`invoke build` / push errors said in one line: environment names docker cannot spell, a full disk
during a build, a manifest whose ``artifacts`` have the wrong shape, and a manifest pointing outside containers/."""

from __future__ import annotations

import json
import subprocess

import pytest

from shipyard import registry
from shipyard.containers import engine as b
from shipyard.containers import manifest as mf
from shipyard.containers import docker
from shipyard.errors import ShipyardError


def one_line(exc, *needles):
    msg = str(exc)
    assert isinstance(exc, ShipyardError) and "\n" not in msg and all(n in msg for n in needles), msg
    return msg


@pytest.mark.parametrize("name", ["a..b", "tiny_", "tiny.", "a___b", "a._b"])
def test_names_docker_cannot_spell_are_one_line_before_the_daemon(name, project, tmp_path):
    path = project.path
    path.write_text(path.read_text().replace("  tiny:\n", f"  {name}:\n    extends: tiny\n  tiny:\n", 1))
    reg = registry.load(path)
    with pytest.raises(ShipyardError) as ei:
        b.build(reg, reg.environment(name), backend="docker")
    one_line(ei.value, f"environments.{name}", "docker cannot name", "--backend apptainer")


@pytest.mark.parametrize("name", ["tiny", "pytorch-2.3", "a__b", "a---b", "x.y_z"])
def test_names_docker_can_spell_pass(name):
    assert docker.check_repository_name(name) == name


@pytest.mark.parametrize("artifacts", [
    [1, 2], "x", {"sif": 3}, {"sif": {"path": "containers/tiny.sif"}},
    {"sif": {"path": ["x"], "sha256": "a" * 64, "size": 1, "mtime_ns": 1}},
    {"sif": {"path": "containers/tiny.sif", "sha256": "a" * 64, "size": "big", "mtime_ns": 1}},
    {"sif": {"path": "containers/tiny.sif", "sha256": "a\n", "size": 1, "mtime_ns": 1}},
    {"sif": {"path": "containers/tiny.sif", "sha256": "a" * 64, "size": 1, "mtime_ns": 1, "ino": "x"}},
])
def test_malformed_artifacts_are_one_line(artifacts, tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"schema": mf.SCHEMA, "environment": "tiny", "status": "ok", "artifacts": artifacts}))
    with pytest.raises(ShipyardError) as ei:
        mf.read_manifest(path)
    one_line(ei.value, str(path), "corrupt build manifest", "invoke build ENV --force")


@pytest.mark.real_apptainer
@pytest.mark.slow  # two real builds of tiny
def test_build_is_not_up_to_date_for_an_artifact_outside_containers(real_project, capsys):
    """A manifest rewritten to name another file (registry.yaml, with its real hash and stamp) must not make `build`
    say "up to date": the image is containers/ENV.sif and nothing else."""
    project = real_project
    env = project.environment("tiny")
    m = b.build(project, env)
    mpath = project.root / "containers" / "tiny.json"
    outside = mf.Artifact.of(project.root, project.path)
    mf.update_manifest(mpath, artifacts={"sif": outside})
    (project.root / "containers" / "tiny.sif").unlink()
    capsys.readouterr()
    m2 = b.build(project, env)
    out = capsys.readouterr().out
    assert "up to date" not in out and m2.artifacts["sif"].path == "containers/tiny.sif", out
    assert m2.input_hash == m.input_hash


@pytest.mark.real_apptainer
def test_a_full_disk_during_a_build_is_one_line(project, apptainer_on_path, tmp_path, monkeypatch):
    """A real full filesystem (a 64 KiB tmpfs as containers/): the log, the manifest or the image's copy hits
    ENOSPC; one line naming the file, no traceback. The real Apptainer passes the preflight and says its version;
    the build stops before it runs."""
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path / "apptainer-cache"))
    containers = project.root / "containers"
    containers.mkdir(exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(containers)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.decode().strip()}): needs root")
    try:
        with open(containers / "filler", "wb") as fh:
            try:
                fh.write(b"\0" * (1 << 20))
            except OSError:
                pass
        with pytest.raises(ShipyardError) as ei:
            b.build(project, project.environment("tiny"))
        one_line(ei.value, "No space left on device", "while building tiny", "free space")
    finally:
        subprocess.run(["umount", str(containers)], capture_output=True)
