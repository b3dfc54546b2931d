"""The signing tests' real Apptainer material: a throw-away keyring of two keys made by `apptainer key newpair`
(once per session), and an unsigned SIF made by `apptainer build` from a root filesystem of Debian's static
busybox (once per session). The sign_project fixture (tests/containers/conftest.py) gives each test its own copies.

No call here or in the tests reaches the user's own keyring or configuration: every apptainer call runs with
APPTAINER_KEYSDIR and APPTAINER_CONFIGDIR inside the test's temporary folder (Apptainer reads both:
pkg/syfs/syfs.go, DefaultLocalKeyDirPath and ConfigDir). The keys have an empty password, so `apptainer sign`
never asks for one; stdin is /dev/null and each call has a timeout, so a prompt fails the test instead of hanging
the run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

# RSA size of the throw-away test keys: apptainer's default 4096 takes seconds of CPU per key to make, 2048 a
# fraction of that; signing and verifying read the key, whatever its size
TEST_KEY_BITS = 2048
# (name, email, comment) of the two test keys, in the order `apptainer key newpair` makes them (= --keyidx)
KEY_IDENTITIES = (("Course Staff", "staff@example.org", "gpu-course"),
                  ("Teaching Assistant", "ta@example.org", "second signer"))
TIMEOUT_S = 120


@dataclass(frozen=True)
class SigningKey:
    index: int  # --keyidx
    user: str  # "NAME (COMMENT) <EMAIL>"
    fingerprint: str  # 40 upper-case hex digits


def apptainer_dirs(folder: Path) -> dict[str, str]:
    """The variables that keep apptainer's keyring (``folder/keys``) and configuration (``folder/config``) in
    ``folder``; both made, mode 700 (apptainer wants that of its keys folder)."""
    dirs = {"APPTAINER_KEYSDIR": folder / "keys", "APPTAINER_CONFIGDIR": folder / "config"}
    for d in dirs.values():
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return {k: str(v) for k, v in dirs.items()}


def run_apptainer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``apptainer ARGS`` (the first on PATH, or ``env``'s), stdin /dev/null, output captured; fails the test with
    apptainer's own message when it exits non-zero."""
    proc = subprocess.run(["apptainer", *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"apptainer {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _with_apptainer(bindir: Path, folder: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", **apptainer_dirs(folder)}


def primary_keys_by_gpg(keyring: Path, home: Path) -> list[tuple[str, str]]:
    """(fingerprint, user id) of each primary key in the OpenPGP keyring file, as gpg reads it: the test keys'
    fingerprints come from here, not from shipyard's reading of `apptainer key list`, which is under test."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    out = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--show-keys", str(keyring)],
                         capture_output=True, text=True, check=True, timeout=TIMEOUT_S).stdout
    keys: list[list[str]] = []
    primary = False
    for fields in (line.split(":") for line in out.splitlines()):
        if fields[0] == "pub":
            primary = True  # the next fpr record is the primary key's; those after sub records are subkeys'
        elif fields[0] == "fpr" and primary:
            keys.append([fields[9], ""])
            primary = False
        elif fields[0] == "uid" and keys and not keys[-1][1]:
            keys[-1][1] = fields[9]
    return [(fp, uid) for fp, uid in keys]


@dataclass(frozen=True)
class SigningKeyring:
    folder: Path  # keys/ (APPTAINER_KEYSDIR) and config/ (APPTAINER_CONFIGDIR)
    keys: tuple[SigningKey, ...]

    def copy_to(self, folder: Path) -> dict[str, str]:
        """A copy of the keyring in ``folder`` (a test may change it); returns the variables that select it."""
        shutil.copytree(self.folder / "keys", folder / "keys")
        return apptainer_dirs(folder)


@pytest.fixture(scope="session")
def signing_keyring(real_apptainer, tmp_path_factory) -> SigningKeyring:
    """Two keys made by the real `apptainer key newpair` (empty password, never pushed): 0 and 1 of
    :data:`KEY_IDENTITIES`. A fraction of a second each at :data:`TEST_KEY_BITS`."""
    folder = tmp_path_factory.mktemp("apptainer-keyring")
    env = _with_apptainer(real_apptainer, folder)
    for name, email, comment in KEY_IDENTITIES:
        run_apptainer("key", "newpair", "--name", name, "--email", email, "--comment", comment, "--password", "",
                      "--push=false", "--bit-length", str(TEST_KEY_BITS), env=env)
    read = primary_keys_by_gpg(folder / "keys" / "pgp-public", folder / "gnupg")
    users = [f"{name} ({comment}) <{email}>" for name, email, comment in KEY_IDENTITIES]
    assert [uid for _, uid in read] == users, f"the test keyring holds {read}"
    return SigningKeyring(folder, tuple(SigningKey(i, uid, fp) for i, (fp, uid) in enumerate(read)))


@pytest.fixture(scope="session")
def unsigned_sif(real_apptainer, tmp_path_factory) -> Path:
    """A real, unsigned SIF: `apptainer build x.sif ROOTFS/` of a root filesystem holding Debian's static busybox
    (about 1 MB, under a second)."""
    d = tmp_path_factory.mktemp("unsigned-sif")
    rootfs = d / "rootfs"
    for sub in ("bin", "etc", "tmp"):
        (rootfs / sub).mkdir(parents=True)
    busybox = shutil.which("busybox")
    assert busybox, "busybox-static is in shipyard/data/test-packages.txt"
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    (rootfs / "bin" / "sh").symlink_to("busybox")
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    env = _with_apptainer(real_apptainer, d / "apptainer")
    for var in ("APPTAINER_CACHEDIR", "APPTAINER_TMPDIR"):
        (d / var.lower()).mkdir()
        env[var] = str(d / var.lower())
    sif = d / "busybox.sif"
    run_apptainer("build", str(sif), str(rootfs), env=env)
    return sif


def data_object_span(sif: Path) -> tuple[int, int]:
    """Start and end offset of the SIF's squashfs data object, as `apptainer sif list` (the real apptainer, first on
    PATH) gives them."""
    listing = run_apptainer("sif", "list", str(sif)).stdout
    m = re.search(r"\|(\d+)-(\d+)\s*\|FS ", listing)
    assert m, f"no FS object in `apptainer sif list {sif}`:\n{listing}"
    return int(m.group(1)), int(m.group(2))


def tamper(sif: Path) -> None:
    """Invert one byte in the middle of the SIF's data object (its file system), as a corrupted or edited image."""
    start, end = data_object_span(sif)
    with open(sif, "r+b") as fh:
        fh.seek((start + end) // 2)
        byte = fh.read(1)[0]
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte ^ 0xFF]))


def signature_objects(sif: Path) -> int:
    """How many signature objects `apptainer sif list` shows in the SIF."""
    return run_apptainer("sif", "list", str(sif)).stdout.count("|Signature")
