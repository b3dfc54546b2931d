"""``invoke sign`` / ``invoke verify``: wrap ``apptainer sign`` and ``apptainer verify`` and record the result.

Why wrap apptainer rather than sign the SIF ourselves: apptainer's signature lives inside the SIF as a signature
object that ``apptainer verify`` (and execution-control lists on clusters) understand; any other signature format
would be ours alone. Keys come from the user's own PGP keyring (``apptainer key newpair`` / ``key import``);
shipyard never reads, copies or prompts for key material or passphrases: ``apptainer sign`` inherits the terminal
and asks for the passphrase itself, and nothing it prints is captured.

Each ``apptainer sign`` *adds* a signature object to the SIF (the earlier ones stay), and ``apptainer verify`` checks
them in turn, stopping at the first that fails: every signer's public key must be in the verifier's keyring.

What is recorded in the build manifest (``containers/<env>.json``, field ``signature``, owned by this module):
``signers``, one entry per ``invoke sign`` of this image file, oldest first (the key fingerprint and user from
``apptainer key list --secret`` for the ``--keyidx`` used, the time, the tool and its version), and
``image_sha256``, the image's sha256 *after* the latest signing (signing appends to the SIF, so a later rebuild or
edit shows up as a different digest, and a signing of a different file starts the list anew). The push area refuses
images without this field when the registry target says ``require_signed: true``; :func:`signature_problem` says
whether a recorded signature still matches the file. ``invoke verify`` records ``verification`` (the signers
apptainer verified, the time, the result) and fails unless every recorded signer is among those apptainer verified.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

from shipyard import project
from shipyard.containers.manifest import read_manifest, update_manifest
from shipyard.errors import ShipyardError
from shipyard.registry.model import Environment, Registry


def find_apptainer() -> str:
    """Preflight: the apptainer binary on PATH, or a one-line error that says what to do."""
    exe = shutil.which("apptainer")
    if not exe:
        raise ShipyardError("apptainer not found on PATH: signing and verifying SIF images needs apptainer "
                            "(on a cluster: `module load apptainer`; see https://apptainer.org/docs/admin/main/installation.html)")
    return exe


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise ShipyardError(f"`{' '.join(argv[:3])}` did not finish in 300 s") from None


def tool_version(apptainer: str) -> str:
    """``apptainer --version`` -> '1.3.6' (the text after 'version')."""
    proc = _run([apptainer, "--version"])
    m = re.search(r"version\s+(\S+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise ShipyardError(f"`apptainer --version` failed or printed no version: {proc.stderr.strip()[:200]}")
    return m.group(1)


def parse_key_list(text: str) -> list[dict]:
    """Entries of ``apptainer key list [--secret]``: [{'index', 'user', 'fingerprint'}] in listed order."""
    keys: list[dict] = []
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+)\)\s+User:\s*(.*?)\s*$", line)
        if m:
            keys.append({"index": int(m.group(1)), "user": m.group(2), "fingerprint": None})
            continue
        m = re.match(r"^\s*Fingerprint:\s*([0-9A-Fa-f]+)\s*$", line)
        if m and keys and keys[-1]["fingerprint"] is None:
            keys[-1]["fingerprint"] = m.group(1).upper()
    return [k for k in keys if k["fingerprint"]]


def parse_verify(text: str) -> dict:
    """The report of ``apptainer verify --json``: ``{"signatures": N, "signers": [...]}``.

    ``signatures`` counts the signature objects apptainer checked (it stops at the first that fails). ``signers``
    has one entry per signing key it could identify, in the order checked: ``fingerprint`` (upper-case hex),
    ``entity`` (the key's primary identity), ``local`` (found in the local keyring), ``verified`` and ``failed`` (the
    data objects, by type, whose content did and did not match that signature). A signature whose key is not in the
    keyring has no entry: it only counts in ``signatures``. Why the JSON and not the text report: the text prints an
    "Error encountered" line after a signer's table without saying whether the error is that signer's (a changed
    data object) or the next signature's (an unknown key); the JSON says it per object (``DataCheck``).
    """
    try:
        data = json.loads(text)
        count = int(data["Signatures"])
        objects = [k["Signer"] for k in data["SignerKeys"] or ()]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a report of `apptainer verify --json` ({exc.__class__.__name__}: {exc})") from None
    signers: dict[str, dict] = {}
    for obj in objects:
        fingerprint = str(obj.get("Fingerprint") or "").upper()
        if not fingerprint:
            continue
        entry = signers.setdefault(fingerprint, {"fingerprint": fingerprint, "entity": obj.get("Name"),
                                                 "local": bool(obj.get("KeyLocal")), "verified": [], "failed": []})
        entry["verified" if obj.get("DataCheck") else "failed"].append(obj.get("Partition"))
    return {"signatures": count, "signers": list(signers.values())}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _existing_image(reg: Registry, env: Environment) -> Path:
    path = project.artifact_path(reg, env.name, "sif")  # the local SIF, not the copy on cluster storage
    if not path.is_file():
        raise ShipyardError(f"{path}: no image to sign/verify; build it first with `invoke build {env.name}`")
    return path


def sign(reg: Registry, env: Environment, keyidx: int = 0) -> dict:
    """Sign ``containers/<env>.sif`` with private key ``keyidx`` of the user's keyring; record and return the signature."""
    if keyidx < 0:
        raise ShipyardError(f"--keyidx {keyidx}: must be >= 0 (an index from `apptainer key list --secret`)")
    apptainer = find_apptainer()
    image = _existing_image(reg, env)
    listing = _run([apptainer, "key", "list", "--secret"])
    if listing.returncode != 0:
        raise ShipyardError(f"`apptainer key list --secret` failed: {listing.stderr.strip()[:300]}")
    keys = {k["index"]: k for k in parse_key_list(listing.stdout)}
    if not keys:
        raise ShipyardError("no private key in your apptainer keyring: create one with `apptainer key newpair` "
                            "or import one with `apptainer key import KEYFILE`")
    if keyidx not in keys:
        raise ShipyardError(f"--keyidx {keyidx}: no such private key (valid: {', '.join(map(str, sorted(keys)))}; "
                            "see `apptainer key list --secret`)")
    key = keys[keyidx]
    version = tool_version(apptainer)
    mpath = project.manifest_path(reg, env.name)
    before = read_manifest(mpath)
    # the earlier signatures are still in the file only when it is the file the latest signing left
    earlier = before.signers if before.signed_sha256 == file_sha256(image) else []
    # Inherit the terminal: apptainer asks for the key's passphrase itself; nothing is captured or logged.
    proc = subprocess.run([apptainer, "sign", "--keyidx", str(keyidx), str(image)])
    if proc.returncode != 0:
        raise ShipyardError(f"`apptainer sign --keyidx {keyidx} {image}` failed (exit {proc.returncode}); "
                            "see its message above", exit_code=1)
    signer = {
        "fingerprint": key["fingerprint"],
        "signer": key["user"],
        "keyidx": keyidx,
        "signed_at": _now(),
        "tool": "apptainer",
        "tool_version": version,
    }
    signature = {"signers": [*earlier, signer], "image_sha256": file_sha256(image)}
    update_manifest(mpath, signature=signature)
    return signature


def describe_signers(signers: list[dict]) -> str:
    """``FINGERPRINT (entity), ...`` of verified signers, as `invoke verify` prints them."""
    return ", ".join(f"{s['fingerprint']} ({s['entity']})" if s.get("entity") else s["fingerprint"] for s in signers)


def _refusal(proc: subprocess.CompletedProcess, report: dict | None, env: Environment) -> str:
    """Why ``apptainer verify`` refused the image, in one line: apptainer's own reason (its FATAL line) with what
    its report says about it."""
    fatal = [ln for ln in proc.stderr.splitlines() if ln.startswith(("FATAL", "ERROR"))]
    reason = re.sub(r"^(FATAL|ERROR):\s*", "", fatal[-1]).strip() if fatal else f"exit {proc.returncode}"
    if report is None:
        return f"apptainer verify failed (exit {proc.returncode}): {reason}"
    if report["signatures"] == 0:
        return f"not signed ({reason}); sign it with `invoke sign {env.name}`"
    changed = [s for s in report["signers"] if s["failed"]]
    if changed:
        objects = ", ".join(dict.fromkeys(o for s in changed for o in s["failed"]))
        return (f"changed after signing: data object {objects} no longer matches the signature of "
                f"{describe_signers(changed)} ({reason})")
    good = [s for s in report["signers"] if not s["failed"]]
    before = f"; verified before it stopped: {describe_signers(good)}" if good else ""
    return f"apptainer verify refused it: {reason}{before}"


def verify(reg: Registry, env: Environment) -> dict:
    """``apptainer verify --local`` the image; fail (exit 1) unless it verifies and every key ``invoke sign``
    recorded is among its signers."""
    apptainer = find_apptainer()
    image = _existing_image(reg, env)
    mpath = project.manifest_path(reg, env.name)
    recorded = [s["fingerprint"] for s in read_manifest(mpath).signers]
    proc = _run([apptainer, "verify", "--local", "--json", str(image)])
    try:
        report = parse_verify(proc.stdout)
    except ValueError:
        report = None  # apptainer stopped before its report (e.g. not a SIF): its FATAL line says why
    signers = [s for s in (report or {}).get("signers", []) if not s["failed"]]
    fingerprints = [s["fingerprint"] for s in signers]
    problem = None
    if proc.returncode != 0 or not report or not report["signatures"]:
        problem = _refusal(proc, report, env)
    else:
        missing = [fp for fp in recorded if fp not in fingerprints]
        if missing:
            which = "the key `invoke sign` recorded" if len(missing) == 1 else "keys `invoke sign` recorded"
            problem = f"signed by {describe_signers(signers)}, but not by {', '.join(missing)}, {which}"
    result = {"ok": problem is None, "fingerprints": fingerprints,
              "signers": [{"fingerprint": s["fingerprint"], "entity": s["entity"]} for s in signers],
              "verified_at": _now(), "tool": "apptainer", "image_sha256": file_sha256(image)}
    if problem:
        result["problem"] = problem
    update_manifest(mpath, verification=result)
    if problem:
        raise ShipyardError(f"{image}: {problem}", exit_code=1)
    return result


def signature_problem(reg: Registry, env_name: str) -> str | None:
    """None when the manifest's signature belongs to the current image file; else why not (for push)."""
    path = project.artifact_path(reg, env_name, "sif")
    signed = read_manifest(project.manifest_path(reg, env_name)).signed_sha256
    if not signed:
        return f"{path}: not signed; run `invoke sign {env_name}`"
    if not path.is_file():
        return f"{path}: image missing"
    if signed != file_sha256(path):
        return f"{path}: changed since `invoke sign` (sha256 differs); sign it again"
    return None
