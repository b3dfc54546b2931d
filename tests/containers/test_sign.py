"""invoke sign / invoke verify against the real Apptainer 1.4.5, with a throw-away test keyring of two keys and a SIF
built by `apptainer build` (tests/fixtures_sign.py), and what lands in the build manifest; the readers of
apptainer's output on its real samples (tests/data/apptainer-sign/, whose README says how each was made)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from fixtures_invoke import invoke_cli
from fixtures_sign import TEST_KEY_BITS, apptainer_dirs, run_apptainer, signature_objects, tamper

from shipyard import project as paths
from shipyard import registry
from shipyard.containers import sign
from shipyard.containers.manifest import read_manifest, update_manifest
from shipyard.errors import ShipyardError

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "tests" / "data" / "apptainer-sign"
real = pytest.mark.real_apptainer

# The samples' two keys, read by hand from key-list-secret.stdout
STAFF = {"index": 0, "user": "Course Staff (gpu-course) <staff@example.org>",
         "fingerprint": "8CBE96ED0513F65EC50E6976C8B27F0D85CB8290"}
TA = {"index": 1, "user": "Teaching Assistant (second signer) <ta@example.org>",
      "fingerprint": "22EF9EEA65298E0E9FB743CF9F86278EB5375CF5"}
ALL_OBJECTS = ["Def.FILE", "JSON.Generic", "FS"]


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def signer(key: dict, verified=ALL_OBJECTS, failed=()) -> dict:
    return {"fingerprint": key["fingerprint"], "entity": key["user"], "local": True, "verified": list(verified),
            "failed": list(failed)}


# ------------------------------------------------------------------------------------------ readers, real samples


def test_key_list_is_read_from_real_samples():
    assert sign.parse_key_list(sample("key-list-secret.stdout")) == [STAFF, TA]
    assert sign.parse_key_list(sample("key-list-public-after-remove.stdout")) == [STAFF]


@pytest.mark.parametrize(("name", "exit_code", "reading"), [
    ("unsigned", 255, {"signatures": 0, "signers": []}),
    ("one-signer", 0, {"signatures": 1, "signers": [signer(STAFF)]}),
    ("two-signers", 0, {"signatures": 2, "signers": [signer(STAFF), signer(TA)]}),
    # the changed data object is the signer's own failure
    ("tampered", 255, {"signatures": 1, "signers": [signer(STAFF, ALL_OBJECTS[:2], ["FS"])]}),
    # the second signature's key is unknown: it counts, without an entry; the first signer verified
    ("unknown-signer", 255, {"signatures": 2, "signers": [signer(STAFF)]}),
])
def test_verify_report_is_read_from_real_samples(name, exit_code, reading):
    assert int(sample(f"json-verify-{name}.exit")) == exit_code
    assert sign.parse_verify(sample(f"json-verify-{name}.stdout")) == reading


def test_text_report_is_not_taken_for_a_json_one():
    """The text report cannot say whose an error is (README); verify reads only the JSON one."""
    with pytest.raises(ValueError, match="not a report of `apptainer verify --json`"):
        sign.parse_verify(sample("verify-two-signers.stdout"))


# ------------------------------------------------------------------------------------------- the real apptainer


def load(sign_project):
    reg = registry.load(sign_project.registry)
    return reg, reg.environment("course")


def manifest(reg):
    return read_manifest(paths.manifest_path(reg, "course"))


def fingerprints(keys) -> list[str]:
    return [k.fingerprint for k in keys]


@real
def test_sign_records_the_signature_and_keeps_other_fields(sign_project):
    reg, env = load(sign_project)
    update_manifest(paths.manifest_path(reg, "course"), image={"tag": "t", "id": "i"}, backend="apptainer")
    unsigned = sign.file_sha256(sign_project.image)
    sig = sign.sign(reg, env, keyidx=1)
    ta = sign_project.keys[1]
    assert signature_objects(sign_project.image) == 1
    assert [(s["fingerprint"], s["signer"], s["keyidx"]) for s in sig["signers"]] == [(ta.fingerprint, ta.user, 1)]
    assert sig["signers"][0]["tool"] == "apptainer" and sig["signers"][0]["tool_version"] == "1.4.5"
    assert sig["image_sha256"] == sign.file_sha256(sign_project.image) != unsigned  # signing appended to the SIF
    m = manifest(reg)
    assert m.signature == sig and m.signers == sig["signers"]
    assert m.docker_tag == "t" and m.backend == "apptainer", "other fields were lost"
    assert sign.signature_problem(reg, "course") is None


SPY = """#!{python}
import json, os, sys
with open({log!r}, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


@real
def test_apptainer_gets_only_the_key_index_and_the_image(sign_project, apptainer_on_path, tmp_path, monkeypatch):
    """What shipyard hands apptainer, seen by a recorder in front of the real binary: never a passphrase or key
    material, only the index of a key in the user's own keyring."""
    spy, log = tmp_path / "spy", tmp_path / "calls.jsonl"
    spy.mkdir()
    (spy / "apptainer").write_text(SPY.format(python=sys.executable, log=str(log),
                                              real=str(apptainer_on_path / "apptainer")))
    (spy / "apptainer").chmod(0o755)
    monkeypatch.setenv("PATH", f"{spy}{os.pathsep}{os.environ['PATH']}")
    reg, env = load(sign_project)
    sign.sign(reg, env, keyidx=1)
    sign.verify(reg, env)
    image = str(sign_project.image)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls == [["key", "list", "--secret"], ["--version"], ["sign", "--keyidx", "1", image],
                     ["verify", "--local", "--json", image]]


@real
def test_verify_after_sign_passes_and_is_recorded(sign_project):
    reg, env = load(sign_project)
    sign.sign(reg, env)
    res = sign.verify(reg, env)
    staff = sign_project.keys[0]
    assert res["ok"] and res["fingerprints"] == [staff.fingerprint]
    assert res["signers"] == [{"fingerprint": staff.fingerprint, "entity": staff.user}]
    assert manifest(reg).verification == res


@real
def test_each_sign_adds_a_signer_and_verify_reports_them_all(sign_project):
    reg, env = load(sign_project)
    sign.sign(reg, env, keyidx=0)
    sig = sign.sign(reg, env, keyidx=1)
    assert signature_objects(sign_project.image) == 2
    assert [s["fingerprint"] for s in sig["signers"]] == fingerprints(sign_project.keys)
    assert [s["fingerprint"] for s in manifest(reg).signers] == fingerprints(sign_project.keys)
    res = sign.verify(reg, env)
    assert res["ok"] and res["fingerprints"] == fingerprints(sign_project.keys)


@real
def test_signing_a_rebuilt_image_starts_the_record_anew(sign_project, unsigned_sif):
    reg, env = load(sign_project)
    sign.sign(reg, env, keyidx=0)
    shutil.copy2(unsigned_sif, sign_project.image)  # a rebuild: the earlier signature is not in this file
    sig = sign.sign(reg, env, keyidx=1)
    assert [s["fingerprint"] for s in sig["signers"]] == [sign_project.keys[1].fingerprint]
    assert sign.verify(reg, env)["fingerprints"] == [sign_project.keys[1].fingerprint]


@real
def test_a_signature_added_outside_shipyard_is_reported_too(sign_project):
    reg, env = load(sign_project)
    sign.sign(reg, env, keyidx=0)
    run_apptainer("sign", "--keyidx", "1", str(sign_project.image))
    res = sign.verify(reg, env)  # the recorded key is among the signers: that is enough
    assert res["ok"] and res["fingerprints"] == fingerprints(sign_project.keys)


@real
def test_verify_fails_unless_the_recorded_key_is_among_the_signers(sign_project, unsigned_sif):
    reg, env = load(sign_project)
    sign.sign(reg, env, keyidx=0)
    staff, ta = sign_project.keys
    shutil.copy2(unsigned_sif, sign_project.image)  # replaced by an image someone else signed
    run_apptainer("sign", "--keyidx", "1", str(sign_project.image))
    with pytest.raises(ShipyardError) as exc:
        sign.verify(reg, env)
    assert str(exc.value) == (f"{sign_project.image}: signed by {ta.fingerprint} ({ta.user}), but not by "
                              f"{staff.fingerprint}, the key `invoke sign` recorded")
    assert exc.value.exit_code == 1
    v = manifest(reg).verification
    assert v["ok"] is False and v["fingerprints"] == [ta.fingerprint] and v["problem"] in str(exc.value)


@real
def test_verify_refuses_a_tampered_image(sign_project):
    reg, env = load(sign_project)
    sign.sign(reg, env)
    tamper(sign_project.image)
    assert "changed since `invoke sign`" in sign.signature_problem(reg, "course")
    with pytest.raises(ShipyardError) as exc:
        sign.verify(reg, env)
    staff = sign_project.keys[0]
    assert str(exc.value) == (f"{sign_project.image}: changed after signing: data object FS no longer matches the "
                              f"signature of {staff.fingerprint} ({staff.user}) (Failed to verify container: "
                              "integrity: data object integrity compromised: 3)")
    assert exc.value.exit_code == 1
    v = manifest(reg).verification
    assert v["ok"] is False and v["fingerprints"] == [] and v["problem"] in str(exc.value)


@real
def test_verify_refuses_an_unsigned_image(sign_project):
    reg, env = load(sign_project)
    assert "not signed; run `invoke sign course`" in sign.signature_problem(reg, "course")
    with pytest.raises(ShipyardError) as exc:
        sign.verify(reg, env)
    assert str(exc.value) == (f"{sign_project.image}: not signed (Failed to verify container: integrity: signature "
                              "not found for object group 1); sign it with `invoke sign course`")
    assert exc.value.exit_code == 1 and manifest(reg).verification["ok"] is False


@real
def test_verify_refuses_a_signer_whose_public_key_is_not_in_the_keyring(sign_project):
    reg, env = load(sign_project)
    sign.sign(reg, env, keyidx=0)
    sign.sign(reg, env, keyidx=1)
    staff, ta = sign_project.keys
    run_apptainer("key", "remove", ta.fingerprint)  # the public key only; the test's own copy of the keyring
    with pytest.raises(ShipyardError) as exc:
        sign.verify(reg, env)
    assert str(exc.value) == (f"{sign_project.image}: apptainer verify refused it: Failed to verify container: "
                              "integrity: signature object 5 not valid: openpgp: signature made by unknown entity; "
                              f"verified before it stopped: {staff.fingerprint} ({staff.user})")
    assert exc.value.exit_code == 1
    v = manifest(reg).verification
    assert v["ok"] is False and v["fingerprints"] == [staff.fingerprint]


@real
def test_a_single_signer_record_reads_as_one_signer(sign_project):
    """A signature recorded as one signer's fields at the top level is still checked against that key."""
    reg, env = load(sign_project)
    run_apptainer("sign", "--keyidx", "1", str(sign_project.image))
    staff = sign_project.keys[0]
    update_manifest(paths.manifest_path(reg, "course"), signature={
        "fingerprint": staff.fingerprint, "signer": staff.user, "keyidx": 0,
        "image_sha256": sign.file_sha256(sign_project.image)})
    assert [s["fingerprint"] for s in manifest(reg).signers] == [staff.fingerprint]
    with pytest.raises(ShipyardError, match=f"but not by {staff.fingerprint}, the key `invoke sign` recorded"):
        sign.verify(reg, env)


@real
def test_bad_keyidx_names_valid_indexes_and_never_signs(sign_project):
    reg, env = load(sign_project)
    before = sign.file_sha256(sign_project.image)
    with pytest.raises(ShipyardError, match=r"--keyidx 5: no such private key \(valid: 0, 1;"):
        sign.sign(reg, env, keyidx=5)
    assert sign.file_sha256(sign_project.image) == before and signature_objects(sign_project.image) == 0
    assert manifest(reg).signature is None


@real
def test_empty_keyring_says_how_to_make_a_key(sign_project, tmp_path, monkeypatch):
    for var, value in apptainer_dirs(tmp_path / "empty").items():
        monkeypatch.setenv(var, value)
    reg, env = load(sign_project)
    with pytest.raises(ShipyardError, match="no private key in your apptainer keyring: create one with "
                                            "`apptainer key newpair`"):
        sign.sign(reg, env)


@real
def test_missing_image_says_build_first(sign_project):
    sign_project.image.unlink()
    reg, env = load(sign_project)
    with pytest.raises(ShipyardError, match="no image to sign/verify; build it first with `invoke build course`"):
        sign.sign(reg, env)
    with pytest.raises(ShipyardError, match="build it first"):
        sign.verify(reg, env)


@real
def test_the_tests_keyring_is_the_one_apptainer_uses(sign_project):
    """The variables the fixtures set are the ones apptainer reads: its listing names the test's own keyring."""
    listing = run_apptainer("key", "list", "--secret").stdout
    assert listing.splitlines()[0] == f"Private key listing ({sign_project.keysdir / 'pgp-secret'}):"


# --------------------------------------------------------------------------------------------------- the tasks


def _invoke(*args, env=None, timeout=120):
    # stdin is an empty pipe: a passphrase prompt would fail the call, and the timeout turns a hang into a failure
    return invoke_cli(*args, cwd=ROOT, env=env or os.environ.copy(), timeout=timeout, input="")


@real
@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_tasks_sign_twice_then_verify_reports_both_signers_and_refuses_a_tampered_copy(sign_project):
    staff, ta = sign_project.keys
    res = _invoke("sign", "course")
    assert res.returncode == 0, res.stderr
    assert f"signed with {staff.fingerprint} ({staff.user})" in res.stdout and "(1 signature(s)" in res.stdout
    res = _invoke("sign", "course", "--keyidx", "1")
    assert res.returncode == 0, res.stderr
    assert f"signed with {ta.fingerprint}" in res.stdout and "(2 signature(s) of this image)" in res.stdout
    res = _invoke("verify", "course")
    assert res.returncode == 0, res.stderr
    assert f"verified: signed by {staff.fingerprint} ({staff.user}), {ta.fingerprint} ({ta.user})" in res.stdout
    tamper(sign_project.image)
    res = _invoke("verify", "course")
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "changed after signing: data object FS" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
@real
def test_a_key_with_a_passphrase_and_no_terminal_fails_at_once(sign_project, tmp_path):
    """shipyard hands apptainer the terminal and never a passphrase: with none to type (stdin an empty pipe),
    apptainer's own prompt shows and signing fails, exit 1, in one line of shipyard's; nothing is recorded."""
    env = {**os.environ, **apptainer_dirs(tmp_path / "locked")}
    run_apptainer("key", "newpair", "--name", "Locked", "--email", "locked@example.org", "--comment", "passphrase",
                  "--password", "not-typed-here", "--push=false", "--bit-length", str(TEST_KEY_BITS), env=env)
    res = _invoke("sign", "course", env=env, timeout=60)
    assert res.returncode == 1
    assert "Enter key passphrase" in res.stdout  # apptainer's prompt, on the terminal shipyard passed through
    shipyard_lines = [ln for ln in res.stderr.splitlines() if "apptainer sign --keyidx 0" in ln]
    assert len(shipyard_lines) == 1 and "failed (exit 255); see its message above" in shipyard_lines[0]
    assert "not-typed-here" not in res.stdout + res.stderr
    reg, _ = load(sign_project)
    assert manifest(reg).signature is None and signature_objects(sign_project.image) == 0


@real
def test_task_without_apptainer_is_one_line_exit_2(sign_project):
    env = os.environ.copy()
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not (Path(p) / "apptainer").exists())
    res = _invoke("sign", "course", env=env)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "apptainer not found on PATH" in res.stderr
    assert "Traceback" not in res.stderr
