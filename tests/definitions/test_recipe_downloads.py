"""Every archive the recipe downloads is checked before it is unpacked: the EFA installer's tarball against the sha256
recorded in shipyard/data/fabrics.yaml. The rendered commands run here with bash against a local stand-in for the
installer's server (no container needed): the commands are the ones the .def and the Dockerfile carry."""

from __future__ import annotations

import functools
import hashlib
import io
import subprocess
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shipyard import registry
from shipyard.definitions import recipe, render
from shipyard.registry import compat, fabric_checks

RECORDED = "1.43.0"  # an installer whose AWS-published sha256 is in fabrics.yaml


def installer_archive(marker: str) -> bytes:
    """A stand-in installer tarball: aws-efa-installer/efa_installer.sh that only says it ran."""
    script = f"#!/bin/sh\necho {marker}\n".encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("aws-efa-installer/efa_installer.sh")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    return buf.getvalue()


@pytest.fixture
def installer_server(tmp_path, monkeypatch):
    """A local HTTP server standing in for the installer's download site; the recipe's URL points at it. Yields
    (the served folder, the list of paths requested)."""
    served = tmp_path / "served"
    served.mkdir()
    requested: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    data = recipe.fabric_data()
    url = f"http://127.0.0.1:{server.server_address[1]}/aws-efa-installer-{{version}}.tar.gz"
    monkeypatch.setattr(recipe, "fabric_data", lambda: {**data, "efa": {**data["efa"], "url": url}})
    yield served, requested
    server.shutdown()
    server.server_close()


def run_fetch(version: str, workdir) -> subprocess.CompletedProcess:
    """The fetch commands of the EFA step, then the installer it unpacked, as the build's shell runs them."""
    script = "\n".join(["set -eu", *recipe.efa_fetch(version), "sh aws-efa-installer/efa_installer.sh"])
    workdir.mkdir(exist_ok=True)
    return subprocess.run(["bash", "-c", script], cwd=workdir, capture_output=True, text=True, timeout=60)


def test_a_tampered_installer_fails_the_step_with_one_line_before_it_is_unpacked(installer_server, tmp_path):
    served, requested = installer_server
    (served / f"aws-efa-installer-{RECORDED}.tar.gz").write_bytes(installer_archive("TAMPERED-RAN"))
    res = run_fetch(RECORDED, tmp_path / "work")
    assert res.returncode == 1
    assert requested == [f"/aws-efa-installer-{RECORDED}.tar.gz"]
    assert res.stderr.strip().splitlines() == [
        f"shipyard: aws-efa-installer-{RECORDED}.tar.gz does not have the sha256 recorded in "
        f"shipyard/data/fabrics.yaml efa.sha256[{RECORDED}]; not unpacking it"]
    assert "TAMPERED-RAN" not in res.stdout
    assert not (tmp_path / "work" / "aws-efa-installer").exists()


def test_the_recorded_bytes_are_unpacked_and_run(installer_server, tmp_path, monkeypatch):
    served, _ = installer_server
    archive = installer_archive("GENUINE-RAN")
    (served / "aws-efa-installer-9.9.9.tar.gz").write_bytes(archive)
    sha = hashlib.sha256(archive).hexdigest()
    monkeypatch.setattr(fabric_checks, "efa_installer_sha256", lambda v: sha if v == "9.9.9" else None)
    res = run_fetch("9.9.9", tmp_path / "work")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "GENUINE-RAN"


def test_an_installer_with_no_recorded_sha256_is_refused_without_a_download(installer_server, tmp_path):
    served, requested = installer_server
    (served / "aws-efa-installer-9.9.9.tar.gz").write_bytes(installer_archive("UNVERIFIED-RAN"))
    assert fabric_checks.efa_installer_sha256("9.9.9") is None
    res = run_fetch("9.9.9", tmp_path / "work")
    assert res.returncode == 1 and requested == []
    assert res.stderr.strip().splitlines() == [
        "shipyard: no sha256 of EFA installer 9.9.9 is known (shipyard/data/fabrics.yaml efa.sha256[9.9.9], or a "
        "cluster's fabric_options.efa_installer_sha256); refusing to download and unpack unverified bytes"]


def test_recorded_checksums_are_sha256_hex_and_looked_up_by_version_value():
    table = recipe.fabric_data()["efa"]["sha256"]
    assert table and all(len(v) == 64 and int(v, 16) >= 0 for v in table.values())
    assert fabric_checks.efa_installer_sha256("1.43") == table["1.43.0"]


def efa_registry(installer: str, sha256: str | None = None) -> registry.Registry:
    given = f", efa_installer_sha256: {sha256}" if sha256 else ""
    return registry.load_text(f"""environments:
  e: {{torch: "2.3.1", cuda: "12.1", python: "3.11", os: ubuntu22.04, fabrics: [efa]}}
clusters:
  aws:
    runtime: pyxis
    fabric: efa
    gpus_per_node: 8
    scheduler: {{partition: p}}
    fabric_options: {{efa_installer: "{installer}"{given}}}
""", "t.yaml")


def test_a_checksum_the_cluster_gives_is_what_the_download_is_checked_against(installer_server, tmp_path):
    """An installer shipyard's data has no checksum of: the site gives AWS's in the cluster's fabric_options; check
    does not warn, the rendered step checks the download against it, and other bytes are refused naming that key."""
    served, _ = installer_server
    archive = installer_archive("GIVEN-RAN")
    (served / "aws-efa-installer-9.9.9.tar.gz").write_bytes(archive)
    sha = hashlib.sha256(archive).hexdigest()
    reg = efa_registry("9.9.9", sha)
    env = reg.environment("e")
    assert env.efa_installer_sha256 == sha
    assert not [p for p in compat.check_on_cluster(env, reg.cluster("aws")) if "no sha256" in p.message]
    assert f"echo '{sha}  aws-efa-installer-9.9.9.tar.gz' | sha256sum --check" in render.render_definition(env, reg)
    script = "\n".join(["set -eu", *recipe.efa_fetch("9.9.9", sha), "sh aws-efa-installer/efa_installer.sh"])
    (tmp_path / "ok").mkdir()
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path / "ok", capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "GIVEN-RAN", res.stderr
    (served / "aws-efa-installer-9.9.9.tar.gz").write_bytes(installer_archive("TAMPERED-RAN"))
    (tmp_path / "bad").mkdir()
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path / "bad", capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "TAMPERED-RAN" not in res.stdout
    assert "clusters.*.fabric_options.efa_installer_sha256" in res.stderr


def test_a_checksum_that_is_not_sha256_hex_is_refused_at_load():
    from shipyard.errors import ShipyardError

    with pytest.raises(ShipyardError, match="efa_installer_sha256"):
        efa_registry("9.9.9", "abc")


@pytest.mark.parametrize("installer, warned", [(RECORDED, False), ("1.51.0", True)])
def test_check_warns_when_the_installer_has_no_recorded_sha256(installer, warned):
    reg = efa_registry(installer)
    probs = [p for p in compat.check_on_cluster(reg.environment("e"), reg.cluster("aws"))
             if "no sha256" in p.message]
    assert bool(probs) == warned
    assert all(p.severity == compat.WARN and p.key == "clusters.aws.fabric_options.efa_installer" for p in probs)


@pytest.mark.parametrize("installer", [RECORDED, "1.51.0"])
def test_both_renderings_carry_the_check_before_tar(installer):
    reg = efa_registry(installer)
    env = reg.environment("e")
    for text in (render.render_definition(env, reg), render.render_dockerfile(env, reg)):
        lines = [ln for ln in text.splitlines() if "aws-efa-installer-" in ln or "of EFA installer" in ln]
        if installer == RECORDED:
            check = next(i for i, ln in enumerate(lines) if "sha256sum --check" in ln)
            untar = next(i for i, ln in enumerate(lines) if "tar -xzf" in ln)
            assert check < untar and fabric_checks.efa_installer_sha256(installer) in lines[check]
        else:
            assert not [ln for ln in lines if "curl " in ln or "tar -xzf" in ln]
            assert any("no sha256 of EFA installer 1.51.0" in ln for ln in lines)
