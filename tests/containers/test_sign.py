"""invoke sign / invoke verify: the argument contract with apptainer, checked through the strict apptainer *test
double* (tests/doubles/apptainer; no apptainer exists here), and what lands in the build manifest."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from fixtures_invoke import invoke_cli
from fixtures_sign import KEYS, SIGN_DOUBLE

from shipyard import project as paths
from shipyard import registry
from shipyard.containers import sign
from shipyard.containers.manifest import read_manifest, update_manifest
from shipyard.errors import ShipyardError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.double


def test_sign_calls_apptainer_exactly_and_records_signature(sign_project):
    reg = registry.load(sign_project.registry)
    update_manifest(paths.manifest_path(reg, "course"), image="containers/course.sif", backend="apptainer")
    sig = sign.sign(reg, reg.environment("course"), keyidx=1)
    image = str(sign_project.image)
    assert sign_project.calls() == [["key", "list", "--secret"], ["--version"], ["sign", "--keyidx", "1", image]]
    assert sig["fingerprint"] == KEYS[1]["fingerprint"] and sig["signer"] == KEYS[1]["user"]
    assert sig["tool"] == "apptainer" and sig["tool_version"] == "1.3.6" and sig["keyidx"] == 1
    assert sig["image_sha256"] == sign.file_sha256(sign_project.image)
    data = read_manifest(paths.manifest_path(reg, "course"))
    assert data.signature == sig
    assert data.image == "containers/course.sif" and data.backend == "apptainer", "other fields were lost"
    assert sign.signature_problem(reg, "course") is None


def test_verify_after_sign_passes_and_is_recorded(sign_project):
    reg = registry.load(sign_project.registry)
    sign.sign(reg, reg.environment("course"))
    res = sign.verify(reg, reg.environment("course"))
    assert sign_project.calls()[-1] == ["verify", "--local", str(sign_project.image)]
    assert res["ok"] and res["fingerprints"] == [KEYS[0]["fingerprint"]]
    assert read_manifest(paths.manifest_path(reg, "course")).verification["ok"] is True


def test_verify_fails_when_image_changed_after_signing(sign_project):
    reg = registry.load(sign_project.registry)
    sign.sign(reg, reg.environment("course"))
    with open(sign_project.image, "ab") as fh:
        fh.write(b"tampered")
    assert "changed since `invoke sign`" in sign.signature_problem(reg, "course")
    with pytest.raises(ShipyardError, match="hash mismatch") as exc:
        sign.verify(reg, reg.environment("course"))
    assert exc.value.exit_code == 1
    assert read_manifest(paths.manifest_path(reg, "course")).verification["ok"] is False


def test_verify_fails_when_signer_differs_from_recorded_key(sign_project):
    reg = registry.load(sign_project.registry)
    sign.sign(reg, reg.environment("course"), keyidx=0)
    # someone re-signs outside shipyard with another key: apptainer verifies, but not with the key we recorded
    subprocess.run(["apptainer", "sign", "--keyidx", "1", str(sign_project.image)], check=True, capture_output=True)
    with pytest.raises(ShipyardError, match=f"signed by {KEYS[1]['fingerprint']}.*records key {KEYS[0]['fingerprint']}"):
        sign.verify(reg, reg.environment("course"))


def test_verify_fails_for_unknown_public_key(sign_project):
    reg = registry.load(sign_project.registry)
    sign.sign(reg, reg.environment("course"))
    sign_project.keyring.write_text(json.dumps({"secret": KEYS, "public": []}))
    with pytest.raises(ShipyardError, match="unknown entity"):
        sign.verify(reg, reg.environment("course"))


def test_unsigned_image_is_reported_for_push(sign_project):
    reg = registry.load(sign_project.registry)
    assert "not signed; run `invoke sign course`" in sign.signature_problem(reg, "course")
    with pytest.raises(ShipyardError, match="signature not found"):
        sign.verify(reg, reg.environment("course"))


def test_bad_keyidx_names_valid_indexes_and_never_signs(sign_project):
    reg = registry.load(sign_project.registry)
    with pytest.raises(ShipyardError, match=r"--keyidx 5: no such private key \(valid: 0, 1"):
        sign.sign(reg, reg.environment("course"), keyidx=5)
    assert ["sign"] not in [c[:1] for c in sign_project.calls()]
    assert read_manifest(paths.manifest_path(reg, "course")).signature is None


def test_empty_keyring_says_how_to_make_a_key(sign_project):
    sign_project.keyring.write_text(json.dumps({"secret": [], "public": []}))
    with pytest.raises(ShipyardError, match="apptainer key newpair"):
        reg = registry.load(sign_project.registry)
        sign.sign(reg, reg.environment("course"))


def test_missing_image_says_build_first(sign_project):
    sign_project.image.unlink()
    with pytest.raises(ShipyardError, match="invoke build course"):
        reg = registry.load(sign_project.registry)
        sign.sign(reg, reg.environment("course"))
    assert sign_project.calls() == []


def test_double_rejects_calls_outside_the_contract(sign_project):
    for args in (["sign", str(sign_project.image)], ["verify", str(sign_project.image)],
                 ["sign", "--keyidx", "9", str(sign_project.image)], ["exec", "x.sif", "true"],
                 ["sign", "--keyidx", "0", str(sign_project.root / "registry.yaml")]):
        res = subprocess.run(["apptainer", *args], capture_output=True, text=True)
        assert res.returncode == 64 and "apptainer double:" in res.stderr, args


def _invoke(args, env):
    return invoke_cli(*args, cwd=ROOT, env=env, timeout=120)


def test_tasks_sign_and_verify_end_to_end(sign_project):
    res = _invoke(["sign", "course", "--keyidx", "1"], os.environ.copy())
    assert res.returncode == 0, res.stderr
    assert KEYS[1]["fingerprint"] in res.stdout
    res = _invoke(["verify", "course"], os.environ.copy())
    assert res.returncode == 0 and "verified" in res.stdout, res.stderr


def test_task_without_apptainer_is_one_line_exit_2(sign_project):
    env = os.environ.copy()
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(SIGN_DOUBLE))
    res = _invoke(["sign", "course"], env)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "apptainer not found on PATH" in res.stderr
    assert "Traceback" not in res.stderr
