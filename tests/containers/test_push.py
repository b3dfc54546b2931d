"""`invoke push` / `invoke pull` against a real OCI registry (docker-registry on 127.0.0.1, started by the tests).

The SIF pushed here is a real SIF file made in the test with mksquashfs and siftool (not an apptainer build), except
in test_oras_push_and_pull_real_sif: a SIF built and signed by the real Apptainer (tests/fixtures_sign.py).
Auth and transient failures come from a small proxy in front of the real registry (tests/containers/fixtures_push.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import fixtures_build as fb
import pytest
from fixtures_invoke import invoke_cli
from fixtures_sign import run_apptainer

from shipyard import project as paths
from shipyard import registry
from shipyard.containers import common
from shipyard.containers import engine as b
from shipyard.containers import manifest as mf
from shipyard.containers import push as p
from shipyard.containers import sign
from shipyard.errors import ShipyardError
from shipyard.files import now_iso

pytestmark = pytest.mark.docker
SECRET = "hunter2-is-not-a-password"


def make_real_sif(path: Path, payload: bytes) -> Path:
    """A real SIF: a definition object and a squashfs partition (mksquashfs + siftool), as local-services.md says."""
    work = path.parent / f".{path.name}.work"
    (work / "rootfs" / "opt").mkdir(parents=True)
    (work / "rootfs" / "opt" / "payload.bin").write_bytes(payload)
    (work / "def.txt").write_text("Bootstrap: docker\nFrom: scratch\n")
    subprocess.run(["mksquashfs", str(work / "rootfs"), str(work / "fs.sqfs"), "-noappend", "-all-root", "-quiet"],
                   check=True, capture_output=True)
    subprocess.run(["siftool", "new", str(path)], check=True, capture_output=True)
    subprocess.run(["siftool", "add", str(path), str(work / "def.txt"), "--datatype", "1"], check=True,
                   capture_output=True)
    subprocess.run(["siftool", "add", str(path), str(work / "fs.sqfs"), "--datatype", "4", "--parttype", "2",
                    "--partfs", "1", "--partarch", "2"], check=True, capture_output=True)
    return path


def project_at(tmp_path: Path, monkeypatch, address: str):
    root = fb.build_project_at(tmp_path / "proj", address)
    monkeypatch.chdir(root)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(root / "registry.yaml"))
    return registry.load(root / "registry.yaml")


def built_sif(reg, env_name: str = "tiny", payload: bytes = b"weights" * 1000) -> Path:
    """Put a real SIF where a build leaves it and record it in the manifest as a finished build would."""
    sif = make_real_sif(paths.artifact_path(reg, env_name, "sif"), payload)
    mf.update_manifest(paths.manifest_path(reg, env_name), environment=env_name, status="ok",
                       input_hash=hashlib.sha256(payload).hexdigest(), finished=now_iso(),
                       artifacts={"sif": common.file_record(reg.root, sif)})
    return sif


def signed_sif(reg, unsigned: Path, env_name: str = "tiny") -> Path:
    """A SIF built by the real apptainer where a build leaves it, recorded as a finished build would, then signed
    with `invoke sign` (key 0 of the test keyring), which changes the file in place as on a user's machine."""
    sif = paths.artifact_path(reg, env_name, "sif")
    sif.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(unsigned, sif)
    mf.update_manifest(paths.manifest_path(reg, env_name), environment=env_name, status="ok",
                       input_hash=common.sha256_file(sif), finished=now_iso(),
                       artifacts={"sif": common.file_record(reg.root, sif)})
    sign.sign(reg, reg.environment(env_name))
    return sif


def registry_manifest(address: str, repo: str, tag: str) -> tuple[dict, str]:
    req = urllib.request.Request(f"http://{address}/v2/{repo}/manifests/{tag}",
                                 headers={"Accept": p.OCI_MANIFEST})
    with urllib.request.urlopen(req) as r:
        body = r.read()
        return json.loads(body), "sha256:" + hashlib.sha256(body).hexdigest()


@pytest.mark.real_apptainer
def test_oras_push_and_pull_real_sif(docker_services, apptainer_keyring, unsigned_sif, tmp_path, monkeypatch,
                                     capsys):
    _, regd = docker_services
    reg = project_at(tmp_path, monkeypatch, regd.address)
    sif = signed_sif(reg, unsigned_sif)
    original = sif.read_bytes()
    rec = p.push(reg, reg.environment("tiny"))
    tag = mf.read_manifest(paths.manifest_path(reg, "tiny")).input_hash[:12]
    assert rec["reference"] == f"oras://{regd.address}/shipyard/tiny:{tag}"
    # what the registry holds, read independently of shipyard: the media types apptainer pull oras:// accepts
    manifest, digest = registry_manifest(regd.address, "shipyard/tiny", tag)
    assert digest == rec["digest"]
    assert manifest["config"]["mediaType"] == "application/vnd.sylabs.sif.config.v1+json"
    assert [la["mediaType"] for la in manifest["layers"]] == ["application/vnd.sylabs.sif.layer.v1.sif"]
    assert manifest["layers"][0]["digest"] == "sha256:" + hashlib.sha256(original).hexdigest()
    assert manifest["layers"][0]["size"] == len(original)
    m = mf.read_manifest(paths.manifest_path(reg, "tiny"))
    assert m.pushed["local"]["digest"] == digest and m.pushed["local"]["reference"] == rec["reference"]
    assert "verified by reading the manifest back" in capsys.readouterr().out

    sif.unlink()
    got = p.pull(reg, reg.environment("tiny"))
    assert sif.read_bytes() == original
    assert got["digest"] == digest
    # the pulled file still verifies: by the real apptainer itself, and through `invoke verify`
    run_apptainer("verify", "--local", str(sif))
    assert sign.verify(reg, reg.environment("tiny"))["fingerprints"] == [apptainer_keyring[0].fingerprint]
    m = mf.read_manifest(paths.manifest_path(reg, "tiny"))
    assert m.pulled["local"]["digest"] == digest
    assert m.artifacts["sif"].intact(reg.root) and m.artifacts["sif"].sha256 == \
        hashlib.sha256(original).hexdigest()
    assert not list((reg.root / "containers").glob("*.tmp*"))
    # the registry that requires a signature takes it: the real signature matches the pulled file
    signed = p.push(reg, reg.environment("tiny"), "signed-only")
    assert signed["reference"] == f"oras://{regd.address}/signed/tiny:{tag}"
    assert registry_manifest(regd.address, "signed/tiny", tag)[0]["layers"] == manifest["layers"]


def test_pull_refuses_a_tag_that_now_points_elsewhere(docker_services, tmp_path, monkeypatch):
    _, regd = docker_services
    reg = project_at(tmp_path, monkeypatch, regd.address)
    built_sif(reg, payload=b"first")
    first = p.push(reg, reg.environment("tiny"), tag="moving")
    # someone else pushes different content under the same tag
    other = tmp_path / "other"
    other.mkdir()
    reg2 = project_at(other, monkeypatch, regd.address)
    built_sif(reg2, payload=b"second")
    second = p.push(reg2, reg2.environment("tiny"), tag="moving")
    assert second["digest"] != first["digest"]
    monkeypatch.chdir(reg.root)
    before = (reg.root / "containers" / "tiny.sif").read_bytes()
    with pytest.raises(ShipyardError, match="differs from the pushed digest"):
        p.pull(reg, reg.environment("tiny"), tag="moving")
    assert (reg.root / "containers" / "tiny.sif").read_bytes() == before  # nothing replaced
    assert not list((reg.root / "containers").glob("*.tmp*"))


def test_push_refuses_unbuilt_changed_or_unsigned(docker_services, tmp_path, monkeypatch):
    _, regd = docker_services
    reg = project_at(tmp_path, monkeypatch, regd.address)
    with pytest.raises(ShipyardError, match="never built"):
        p.push(reg, reg.environment("tiny"))
    sif = built_sif(reg)
    with pytest.raises(ShipyardError, match="require_signed is true: .*not signed; run `invoke sign tiny`"):
        p.push(reg, reg.environment("tiny"), "signed-only")
    with open(sif, "ab") as fh:
        fh.write(b"tampered")
    with pytest.raises(ShipyardError, match="changed since it was built"):
        p.push(reg, reg.environment("tiny"))


def test_transient_failures_are_retried(docker_services, registry_proxy, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(p, "BACKOFF_S", 0.01)
    proxy = registry_proxy(fail_first=2)
    reg = project_at(tmp_path, monkeypatch, proxy.address)
    built_sif(reg)
    rec = p.push(reg, reg.environment("tiny"))
    out = capsys.readouterr().out
    assert "transient error" in out and "retry 1/3" in out and "retry 2/3" in out
    assert [r[2] for r in proxy.requests[:2]] == [503, 503]
    assert rec["digest"].startswith("sha256:")


def test_persistent_failure_gives_up_after_the_last_attempt(docker_services, registry_proxy, tmp_path, monkeypatch):
    monkeypatch.setattr(p, "BACKOFF_S", 0.01)
    proxy = registry_proxy(fail_first=100)
    reg = project_at(tmp_path, monkeypatch, proxy.address)
    built_sif(reg)
    with pytest.raises(Exception):
        p.push(reg, reg.environment("tiny"))
    assert len(proxy.requests) == p.ATTEMPTS  # one failing request per attempt, then it stops
    assert mf.read_manifest(paths.manifest_path(reg, "tiny")).pushed is None


def _with_mirror(reg, base_registry, monkeypatch, tmp_path: Path):
    """The project with base_mirror at the tests' in-process OCI registry (plain HTTP, said explicitly), for a real
    `apptainer build` of `tiny`; apptainer's folders under the test's tmp. The registry loaded again."""
    path = reg.root / "registry.yaml"
    path.write_text(path.read_text() + f"base_mirror:\n  url: {base_registry.address}\n  insecure_http: true\n")
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path / "apptainer-cache"))
    return registry.load(path)


def _all_bytes_under(root: Path) -> list[tuple[Path, bytes]]:
    return [(f, f.read_bytes()) for f in root.rglob("*") if f.is_file()]


@pytest.mark.real_apptainer
def test_credentials_from_env_are_used_and_never_written_or_logged(docker_services, registry_proxy, tmp_path,
                                                                    monkeypatch, capfd, base_registry,
                                                                    apptainer_on_path):
    proxy = registry_proxy(user="alice", password=SECRET)
    reg = project_at(tmp_path, monkeypatch, proxy.address)
    built_sif(reg)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no docker config to fall back on
    with pytest.raises(Exception):
        p.push(reg, reg.environment("tiny"))  # the registry demands credentials
    monkeypatch.setenv("SHIPYARD_REGISTRY_USERNAME", "alice")
    monkeypatch.setenv("SHIPYARD_REGISTRY_PASSWORD", SECRET)
    rec = p.push(reg, reg.environment("tiny"))
    basic = "Basic " + __import__("base64").b64encode(f"alice:{SECRET}".encode()).decode()
    assert basic in proxy.seen_auth  # the credential really went to the registry's token endpoint
    (reg.root / "containers" / "tiny.sif").unlink()
    p.pull(reg, reg.environment("tiny"))
    assert rec["digest"] == mf.read_manifest(paths.manifest_path(reg, "tiny")).pulled["local"]["digest"]
    # a real build with the credential in its environment, too: its log and manifest must not carry it
    reg = _with_mirror(reg, base_registry, monkeypatch, tmp_path)
    b.build(reg, reg.environment("tiny"), force=True)
    # and a launcher written with the credential in the environment (the launch area's CLI, as a user runs it)
    (reg.root / "t.py").write_text("")  # launch checks that the script exists where the job will look
    res = invoke_cli("launch", "--environment", "tiny", "--name", "t", "--", "t.py", cwd=reg.root, timeout=None)
    assert res.returncode == 0 and (reg.root / "launch" / "t.sbatch").is_file(), res.stderr
    assert SECRET not in res.stdout + res.stderr
    captured = capfd.readouterr()
    encoded = basic.split()[1]
    for text in (captured.out, captured.err):
        assert SECRET not in text and encoded not in text
    for path, data in _all_bytes_under(reg.root):
        assert SECRET.encode() not in data and encoded.encode() not in data, path
    assert all((reg.root / d).is_dir() for d in ("containers/logs", "definitions", "launch"))


def test_credentials_from_docker_config(docker_services, registry_proxy, tmp_path, monkeypatch):
    proxy = registry_proxy(user="bob", password=SECRET)
    reg = project_at(tmp_path, monkeypatch, proxy.address)
    built_sif(reg)
    cfg = tmp_path / "dockercfg"
    cfg.mkdir()
    auth = __import__("base64").b64encode(f"bob:{SECRET}".encode()).decode()
    (cfg / "config.json").write_text(json.dumps({"auths": {proxy.address: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    for var in ("SHIPYARD_REGISTRY_USERNAME", "SHIPYARD_REGISTRY_PASSWORD", "APPTAINER_DOCKER_USERNAME",
                "APPTAINER_DOCKER_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    rec = p.push(reg, reg.environment("tiny"))
    assert rec["digest"].startswith("sha256:")
    assert mf.render(mf.read_manifest(paths.manifest_path(reg, "tiny"))).find(SECRET) == -1


def test_is_transient():
    import requests

    assert p.is_transient(requests.ConnectionError("refused"))
    assert p.is_transient(ValueError("Issue with http://x/v2/: Service Unavailable"))
    assert p.is_transient(ValueError("503 Server Error"))
    assert not p.is_transient(ValueError("Issue with http://x/v2/: Not Found"))
    assert not p.is_transient(ValueError("digest sha256:a500b"))
    assert not p.is_transient(ShipyardError("503 but ours"))


def test_many_chunks_through_an_authenticating_registry(docker_services, registry_proxy, tmp_path, monkeypatch):
    """Chunked upload for real: many PATCHes (each sent from the file), each carrying the bearer token."""
    monkeypatch.setattr(p, "CHUNK", 64 << 10)
    proxy = registry_proxy(user="carol", password=SECRET)
    monkeypatch.setenv("SHIPYARD_REGISTRY_USERNAME", "carol")
    monkeypatch.setenv("SHIPYARD_REGISTRY_PASSWORD", SECRET)
    reg = project_at(tmp_path, monkeypatch, proxy.address)
    sif = built_sif(reg, payload=os.urandom(1 << 20))
    original = sif.read_bytes()
    p.push(reg, reg.environment("tiny"))
    patches = [r for r in proxy.requests if r[0] == "PATCH"]
    assert len(patches) == -(-len(original) // (64 << 10)) and all(r[2] == 202 for r in patches)
    sif.unlink()
    p.pull(reg, reg.environment("tiny"))
    assert sif.read_bytes() == original


@pytest.mark.real_apptainer
def test_signed_sif_is_kept_by_build_and_pushed_to_signed_only(docker_services, tmp_path, monkeypatch, base_registry,
                                                               apptainer_keyring):
    """`invoke sign` appends a signature to the SIF in place; build must not rebuild it, push must accept it. A real
    build of `tiny` (its base through base_mirror), signed by the real Apptainer with the test keyring."""
    _, regd = docker_services
    reg = _with_mirror(project_at(tmp_path, monkeypatch, regd.address), base_registry, monkeypatch, tmp_path)
    first = b.build(reg, reg.environment("tiny"))
    sif = reg.root / "containers" / "tiny.sif"
    sign.sign(reg, reg.environment("tiny"))
    again = b.build(reg, reg.environment("tiny"))
    assert again.finished == first.finished  # a cache hit: not rebuilt, the signature survives
    assert again.artifacts["sif"].sha256 == common.sha256_file(sif)
    rec = p.push(reg, reg.environment("tiny"), "signed-only")
    assert rec["reference"].startswith(f"oras://{regd.address}/signed/tiny:")
    b.build(reg, reg.environment("tiny"), force=True)  # a new, unsigned image
    with pytest.raises(ShipyardError, match="require_signed is true: .*changed since `invoke sign`"):
        p.push(reg, reg.environment("tiny"), "signed-only")
