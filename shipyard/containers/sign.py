"""``invoke sign`` / ``invoke verify``: wrap ``apptainer sign`` and ``apptainer verify`` and record the result.

Why wrap apptainer rather than sign the SIF ourselves: apptainer's signature lives inside the SIF as a signature
object that ``apptainer verify`` (and execution-control lists on clusters) understand; any other signature format
would be ours alone. Keys come from the user's own PGP keyring (``apptainer key newpair`` / ``key import``);
shipyard never reads, copies or prompts for key material or passphrases: ``apptainer sign`` inherits the terminal
and asks for the passphrase itself, and nothing it prints is captured.

What is recorded in the build manifest (``containers/<env>.json``, field ``signature``, owned by this module):
the key fingerprint and signer from ``apptainer key list --secret`` for the ``--keyidx`` used, the time, the tool
and its version, and the sha256 of the image *after* signing (signing appends to the SIF, so a later rebuild or
edit shows up as a different digest). The push area refuses images without this field when the registry target
says ``require_signed: true``; :func:`signature_problem` says whether a recorded signature still matches the file.
``invoke verify`` records ``verification`` (the fingerprints apptainer reported, the time, the result).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
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


def parse_verify(text: str) -> list[dict]:
    """Signers reported by ``apptainer verify``: [{'fingerprint', 'entity', 'source'}] (source LOCAL/REMOTE)."""
    out: list[dict] = []
    entity = None
    for line in text.splitlines():
        m = re.match(r"^\s*\[(\w+)\]\s+Signing entity:\s*(.*?)\s*$", line)
        if m:
            entity = m.group(2)
            continue
        m = re.match(r"^\s*\[(\w+)\]\s+Fingerprint:\s*([0-9A-Fa-f]+)\s*$", line)
        if m:
            out.append({"fingerprint": m.group(2).upper(), "entity": entity, "source": m.group(1)})
    return out


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
    # Inherit the terminal: apptainer asks for the key's passphrase itself; nothing is captured or logged.
    proc = subprocess.run([apptainer, "sign", "--keyidx", str(keyidx), str(image)])
    if proc.returncode != 0:
        raise ShipyardError(f"`apptainer sign --keyidx {keyidx} {image}` failed (exit {proc.returncode}); "
                            "see its message above", exit_code=1)
    signature = {
        "fingerprint": key["fingerprint"],
        "signer": key["user"],
        "keyidx": keyidx,
        "signed_at": _now(),
        "tool": "apptainer",
        "tool_version": version,
        "image_sha256": file_sha256(image),
    }
    update_manifest(project.manifest_path(reg, env.name), signature=signature)
    return signature


def verify(reg: Registry, env: Environment) -> dict:
    """``apptainer verify --local`` the image; fail (exit 1) unless it verifies with the recorded signer's key."""
    apptainer = find_apptainer()
    image = _existing_image(reg, env)
    signer = read_manifest(project.manifest_path(reg, env.name)).signer
    proc = _run([apptainer, "verify", "--local", str(image)])
    signers = parse_verify(proc.stdout + "\n" + proc.stderr)
    fingerprints = [s["fingerprint"] for s in signers]
    ok = proc.returncode == 0 and bool(signers)
    problem = None
    if not ok:
        detail = next((ln.strip() for ln in proc.stderr.splitlines() if "FATAL" in ln or "rror" in ln), "")
        problem = f"apptainer verify failed (exit {proc.returncode}){': ' + detail if detail else ''}"
    elif signer and signer not in fingerprints:
        ok = False
        problem = (f"signed by {', '.join(fingerprints)}, but the manifest records key {signer} "
                   "from `invoke sign`")
    result = {"ok": ok, "fingerprints": fingerprints, "verified_at": _now(), "tool": "apptainer",
              "image_sha256": file_sha256(image)}
    if problem:
        result["problem"] = problem
    update_manifest(project.manifest_path(reg, env.name), verification=result)
    if not ok:
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
