"""Real Apptainer for the sandbox and the tests: unpack the binary build from its archive at the prefix compiled into
it, configure it for this machine, and remove it when its last holder lets go.

* The archive comes from a folder (``../shared/vendor`` or ``--sources``) and must match the sha256 in
  shipyard/data/sandbox.yaml; it is never part of the project.
* The prefix is compiled into Apptainer's binaries (they find their configuration and starter there), so the install
  is machine-wide at that one path; the sandbox's nodes see it because they share the host's filesystem, and a job
  finds it on the PATH it inherits from its submitter (``env.sh`` adds the prefix's ``bin``).
* Holders: every sandbox (``sandbox:<folder>``) and every test process (``process:<pid>:<start>``) that asked for it
  is listed in a machine-wide record; :func:`release` removes the prefix when the last live holder lets go. A holder
  whose sandbox is down or whose process is gone no longer counts, so a crash leaves nothing that blocks the next
  install. All of it runs under one machine-wide lock, so parallel test processes and sandboxes agree.
* A prefix that shipyard did not unpack (no record, or another archive) is never touched: install refuses.

What this machine needs (each a fact in sandbox.yaml, read from /proc here, none of it needed on a real build node):
root lacks capabilities in its bounding set, so apptainer.conf gets ``root default capabilities = file`` and root
is granted, with ``apptainer capability add``, exactly the capabilities the bounding set has; ``apptainer build``
runs ``%post``/``%test`` through nested ``apptainer --build-config exec|test`` calls that ignore that configuration,
so a small wrapper at the binary's own path adds ``--drop-caps`` with the missing ones to exactly those calls.
Unprivileged users run images in setuid mode with the kernel's squashfs mount (``allow setuid-mount squashfs``):
squashfuse needs /dev/fuse, which only root may open here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from shipyard import procs, templating
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, sha256_file
from shipyard.sandbox.plan import facts
from shipyard.sandbox.runtimes import read_json_record

# The Linux capability names by bit number (linux/capability.h, 5.9 and later: CAP_CHECKPOINT_RESTORE is 40).
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
)


def apptainer_facts() -> dict:
    return facts()["runtimes"]["apptainer"]


def prefix() -> Path:
    return Path(apptainer_facts()["prefix"])


def bin_dir() -> Path:
    return prefix() / "bin"


# ------------------------------------------------------------------------------------------------ pure parts


def bounding_set(status_text: str) -> tuple[list[str], list[str]]:
    """(capabilities in the bounding set, capabilities missing from it) from /proc/self/status's ``CapBnd``."""
    m = re.search(r"^CapBnd:\s*([0-9a-fA-F]+)\s*$", status_text, re.M)
    if not m:
        raise ShipyardError("sandbox.runtimes: /proc/self/status has no CapBnd line")
    bits = int(m.group(1), 16)
    have = [f"CAP_{n}" for i, n in enumerate(CAPABILITIES) if bits >> i & 1]
    missing = [f"CAP_{n}" for i, n in enumerate(CAPABILITIES) if not bits >> i & 1]
    return have, missing


def configured_conf(text: str, settings: dict[str, str]) -> str:
    """apptainer.conf with each ``key = value`` of ``settings`` set: an active line of that key is replaced in place,
    else the line is added at the end (a commented default stays a comment)."""
    lines = text.splitlines()
    for key, value in settings.items():
        want = f"{key} = {value}"
        pat = re.compile(rf"^\s*{re.escape(key)}\s*=")
        hits = [i for i, line in enumerate(lines) if pat.match(line)]
        if hits:
            lines[hits[0]] = want
            for i in reversed(hits[1:]):
                del lines[i]
        else:
            lines.append(want)
    return "\n".join(lines) + "\n"


def wrapper_text(missing: list[str]) -> str:
    """The script at ``bin/apptainer`` that adds ``--drop-caps`` to the build's nested exec/test calls."""
    for cap in missing:
        if not re.fullmatch(r"CAP_[A-Z_]+", cap):
            raise ShipyardError(f"sandbox.runtimes: unexpected capability name {cap!r}")
    return templating.render("shipyard.sandbox", "apptainer-wrapper.sh.j2", drop=",".join(missing),
                             real=apptainer_facts()["real_binary"])


# ------------------------------------------------------------------------------------------------ sources


def archive_path(directory, flag: str = "--sources") -> Path:
    """The binary archive in ``directory``, checked against its sha256; one error line otherwise."""
    f = apptainer_facts()
    p = Path(directory) / f["archive"]
    if not p.is_file():
        raise ShipyardError(f"{flag}: {p} is missing (Apptainer {f['version']} built for Debian 12; see "
                            "shipyard/data/sandbox.yaml runtimes.apptainer)")
    got = sha256_file(p)
    if got != f["sha256"]:
        raise ShipyardError(f"{flag}: {p} has sha256 {got}, expected {f['sha256']} (shipyard/data/sandbox.yaml "
                            "runtimes.apptainer)")
    return p


def missing_packages() -> list[str]:
    """Debian packages Apptainer needs at run time that are missing here."""
    return sorted({pkg for binary, pkg in apptainer_facts()["packages"].items() if shutil.which(binary) is None})


# ------------------------------------------------------------------------------------------------ holders, record


def sandbox_holder(directory) -> str:
    return f"sandbox:{Path(directory)}"


def process_holder(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    st = procs.proc_stat(pid)
    if st is None:
        raise ShipyardError(f"process {pid} is gone")
    return f"process:{pid}:{st[1]}"


def process_alive(holder: str) -> bool:
    _, pid, start = holder.split(":", 2)
    return procs.alive({"pid": int(pid), "start": int(start)})


def _record_path(root: Path) -> Path:
    return root / apptainer_facts()["record"].lstrip("/")


def read_record(root: Path = Path("/")) -> dict | None:
    return read_json_record(_record_path(root))


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    lock = _record_path(root).with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _live(holders: list[str], sandbox_running: Callable[[Path], bool]) -> list[str]:
    out = []
    for h in holders:
        kind, _, rest = h.partition(":")
        if (kind == "process" and process_alive(h)) or (kind == "sandbox" and sandbox_running(Path(rest))):
            out.append(h)
    return out


# ------------------------------------------------------------------------------------------------ install


def _unpack(archive: Path, dest_parent: Path, top: str) -> Path:
    """Unpack the archive into a temporary folder beside the prefix; the unpacked top folder.

    The archive's sha256 was checked, so its modes are kept (``starter-suid`` keeps its setuid bit, which Python's
    data filter would clear); paths outside the folder and links leaving it are still refused."""
    def keep_modes(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        safe = tarfile.data_filter(member, dest)
        return safe.replace(mode=member.mode, deep=False) if member.isreg() else safe

    tmp = Path(tempfile.mkdtemp(prefix=f".{top}.", dir=dest_parent))
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter=keep_modes)
    got = tmp / top
    if not got.is_dir() or got.is_symlink():
        shutil.rmtree(tmp)
        raise ShipyardError(f"sandbox.runtimes: {archive} does not unpack to {top}/")
    return got


def _configure(pfx: Path, status_text: str, run: Callable = subprocess.run) -> dict:
    """Set apptainer.conf, grant root the capabilities it has, add the build wrapper when some are missing."""
    f = apptainer_facts()
    have, missing = bounding_set(status_text)
    settings = dict(f["config"])
    if missing:
        settings["root default capabilities"] = "file"
    conf = pfx / "etc" / "apptainer" / "apptainer.conf"
    atomic_write(conf, configured_conf(conf.read_text(), settings), 0o644)
    exe = pfx / "bin" / "apptainer"
    if missing:
        res = run([str(exe), "capability", "add", "--user", "root", ",".join(have)], capture_output=True, text=True,
                  timeout=60)
        if res.returncode != 0:
            raise ShipyardError(f"sandbox.runtimes: apptainer capability add failed: {res.stderr.strip()[:300]}")
        os.rename(exe, pfx / "bin" / f["real_binary"])
        atomic_write(exe, wrapper_text(missing), 0o755)
    return {"config": settings, "missing_capabilities": missing}


def install(archive: Path, holder: str, *, root: Path = Path("/"), status_text: str | None = None,
            sandbox_running: Callable[[Path], bool] = lambda d: False, run: Callable = subprocess.run) -> dict:
    """Make the real Apptainer available at its prefix (under ``root``, / but in unit tests) for ``holder``.

    Unpacks and configures it when it is not there, else joins the install shipyard made; refuses a prefix it did
    not make. Returns the record."""
    f = apptainer_facts()
    pfx = root / f["prefix"].lstrip("/")
    if status_text is None:
        status_text = Path("/proc/self/status").read_text()
    with _locked(root):
        rec = read_record(root)
        ours = bool(rec) and rec.get("sha256") == f["sha256"] and rec.get("prefix") == str(pfx)
        if ours and rec.get("state") == "ready" and pfx.is_dir() and not pfx.is_symlink():
            rec["holders"] = sorted(set(_live(rec.get("holders", []), sandbox_running)) | {holder})
            _save(root, rec)
            return rec
        if ours and not pfx.is_symlink():  # an install that stopped half-way: ours to redo
            shutil.rmtree(pfx, ignore_errors=True)
        if pfx.exists() or pfx.is_symlink():
            why = "another archive" if rec else "nothing shipyard recorded"
            raise ShipyardError(f"sandbox.runtimes: {pfx} exists and was not unpacked by shipyard from "
                                f"{f['archive']} ({why}); remove it first (nothing was changed)")
        parent = pfx.parent
        if parent.is_symlink():
            raise ShipyardError(f"sandbox.runtimes: {parent} is a symlink; not following it (nothing was changed)")
        made_parent = (rec or {}).get("made_parent") if ours else None
        if not parent.exists():
            made_parent = str(parent)
        parent.mkdir(parents=True, exist_ok=True)
        got = _unpack(archive, parent, pfx.name)
        rec = {"prefix": str(pfx), "archive": f["archive"], "sha256": f["sha256"], "version": f["version"],
               "made_parent": made_parent, "state": "configuring", "holders": []}
        try:
            _save(root, rec)  # recorded before it appears: a crash from here on leaves a prefix known to be ours
            os.rename(got, pfx)
        finally:
            shutil.rmtree(got.parent, ignore_errors=True)
        # configured at the prefix itself: the binary writes capability.json under the prefix compiled into it
        rec.update(_configure(pfx, status_text, run), state="ready", holders=[holder])
        _save(root, rec)
        return rec


def _save(root: Path, rec: dict) -> None:
    atomic_write(_record_path(root), json.dumps(rec, indent=2) + "\n", 0o644)


def release(holder: str, *, root: Path = Path("/"), sandbox_running: Callable[[Path], bool] = lambda d: False) -> bool:
    """``holder`` lets go; the prefix is removed when no live holder is left. True when it was removed."""
    with _locked(root):
        rec = read_record(root)
        if rec is None:
            return False
        left = [h for h in _live(rec.get("holders", []), sandbox_running) if h != holder]
        if left:
            rec["holders"] = left
            _save(root, rec)
            return False
        pfx = root / Path(rec["prefix"]).relative_to(root)
        if pfx.is_dir() and not pfx.is_symlink():
            shutil.rmtree(pfx)
        if rec.get("made_parent"):
            with contextlib.suppress(OSError):
                Path(rec["made_parent"]).rmdir()
        _record_path(root).unlink()
        return True


def holds(holder: str, root: Path = Path("/")) -> bool:
    rec = read_record(root)
    return bool(rec) and holder in rec.get("holders", [])
