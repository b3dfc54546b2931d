"""`invoke remote.sync`: ship the project to ``<remote.root>/<project>`` through the shared connection.

What goes: the files git tracks (plus new files git does not ignore), and the environments' locks
(definitions/*.lock) even where ignored: the commands there read them. Launchers are not shipped: they are rendered
on the cluster by the forwarded `invoke launch`, where the stage record is (docs/remote.md). How: rsync through the
same master when this machine has rsync, else tar over ssh. A record of what was shipped (the commit and whether the
working tree had uncommitted changes) lands beside it as ``.shipyard-shipped.json``: jobs there name that code.
A second sync with nothing changed transfers nothing (rsync's own comparison; tar: the same manifest digest).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_join, shell_quote
from shipyard.files import read_capped, sha256_file
from shipyard.remote import transport


@dataclass(frozen=True)
class Shipped:
    commit: str  # the commit shipped ("unknown" outside a git checkout)
    dirty: bool  # the working tree had uncommitted changes to tracked files
    files: int  # files in the shipped list
    changed: int  # files (and directories) transferred or updated this time: 0 means nothing changed
    destination: str
    method: str  # rsync | tar


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, stdin=subprocess.DEVNULL, timeout=60)


_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def code_identity(root: Path, *, own_checkout: bool = False) -> tuple[str, bool | None]:
    """(commit, dirty) of the project: git's when it is a checkout (``own_checkout``: only when ``root`` is the top
    of its work tree, so that a project inside another repository, like the examples here, does not name that
    repository's commit), else the record a sync left there, else ("unknown", None)."""
    try:
        head = _git(root, "rev-parse", "--verify", "HEAD")
        top = _git(root, "rev-parse", "--show-toplevel") if own_checkout and head.returncode == 0 else None
    except (FileNotFoundError, NotADirectoryError):
        head = top = None
    if top is not None and (top.returncode != 0 or Path(top.stdout.decode().strip()).resolve() != root.resolve()):
        head = None
    if head is not None and head.returncode == 0:
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
        return head.stdout.decode().strip(), bool(status.stdout.strip())
    try:
        data = shipped_record(read_capped(root / transport.policy()["shipped_record"], "shipped_record",
                                          "the remote.sync record", regular=True))
    except (OSError, ShipyardError):
        return "unknown", None
    if not isinstance(data.get("commit"), str) or not _COMMIT.fullmatch(data["commit"]) \
            or not isinstance(data.get("dirty"), bool):
        return "unknown", None
    return data["commit"], data["dirty"]


def shipped_record(body: bytes) -> dict:
    """The record a sync left (``.shipyard-shipped.json``), from bytes someone on the cluster may have written: a JSON
    object, else {} (no record: the next sync ships everything and writes it again)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def files_to_ship(root: Path) -> list[str]:
    """Paths relative to ``root``: git's tracked and not-ignored files that exist, plus definitions/*.lock."""
    try:
        res = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    except FileNotFoundError:
        raise ShipyardError("git is not on PATH: remote.sync ships the files git tracks") from None
    if res.returncode != 0:
        raise ShipyardError(f"{root}: not a git checkout (remote.sync ships the files git tracks; run `git init` "
                            "and add the project's files)")
    names = {n for n in res.stdout.decode("utf-8", "surrogateescape").split("\0") if n}
    names |= {str(p.relative_to(root)) for p in (root / "definitions").glob("*.lock")}
    record = transport.policy()["shipped_record"]
    return sorted(n for n in names if n != record and (root / n).is_file() and not (root / n).is_symlink())


def _manifest_digest(root: Path, names: list[str]) -> str:
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode("utf-8", "surrogateescape") + b"\0" + bytes.fromhex(sha256_file(root / n)))
    return h.hexdigest()


def _ssh_run(dest, script: str, *, input: bytes | None = None, timeout: float) -> subprocess.CompletedProcess:
    argv = transport.ssh_argv(dest, script)
    try:
        return subprocess.run(argv, input=input if input is not None else b"", capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ShipyardError(f"ssh to {dest.login}: no answer within {timeout:.0f} s") from None


def _fail(what: str, res: subprocess.CompletedProcess) -> ShipyardError:
    last = (res.stderr.decode(errors="replace").strip().splitlines() or [f"exit {res.returncode}"])[-1]
    return ShipyardError(f"{what}: {last}", exit_code=1)


def sync(cluster, root: Path, *, method: str | None = None) -> Shipped:
    """Ship ``root`` to ``cluster`` (the master must be open: :func:`transport.require_master`)."""
    p = transport.policy()
    dest = transport.require_master(cluster)
    target = transport.project_dir(cluster, root.name)
    names = files_to_ship(root)
    commit, dirty = code_identity(root)
    method = method or ("rsync" if shutil.which("rsync") else "tar")
    timeout = p["ssh"]["sync_timeout_s"]
    digest = _manifest_digest(root, names)
    record_path = f"{target}/{p['shipped_record']}"
    # the record as it lies on the cluster (a remote root others may write): a regular file only (a FIFO there would
    # hold the read until the timeout), at most the cap plus one byte; anything else is no record
    cap = int(facts.load("limits")["input_bytes"]["shipped_record"])
    q = shell_quote(record_path)
    old = _ssh_run(dest, f"if [ -f {q} ] && [ ! -L {q} ]; then head -c {cap + 1} -- {q}; fi 2>/dev/null || true",
                   timeout=timeout)
    previous = shipped_record(old.stdout) if len(old.stdout) <= cap else {}
    dirs = _parents(names)
    mk = _ssh_run(dest, _prepare_script(target, dirs), timeout=timeout)
    if mk.returncode == _REFUSED:
        raise _refused(cluster.name, mk)
    if mk.returncode != 0:
        raise _fail(f"mkdir {target} on {cluster.name}", mk)
    if method == "rsync":
        changed = _rsync(dest, root, names, target, timeout)
    elif previous.get("manifest") == digest:
        changed = 0
    else:
        changed = _tar(dest, root, names, target, timeout)
    record = {"commit": commit, "dirty": dirty, "files": len(names), "manifest": digest}
    if changed or any(previous.get(k) != v for k, v in record.items()):
        body = json.dumps(record, indent=1, sort_keys=True).encode() + b"\n"
        # a temp file of mktemp's (created exclusively: never through a link planted at a fixed name), then mv
        res = _ssh_run(dest, f"umask 022 && tmp=$(mktemp {shell_quote(record_path + '.XXXXXX')}) && "
                             f'cat > "$tmp" && chmod 644 "$tmp" && mv -fT -- "$tmp" {shell_quote(record_path)}',
                       input=body, timeout=timeout)
        if res.returncode != 0:
            raise _fail(f"writing {record_path} on {cluster.name}", res)
        changed = changed or 1
    return Shipped(commit, bool(dirty), len(names), changed, target, method)


_REFUSED = 3  # the remote prepare script's exit code for "a link someone else made is in the way"


def _parents(names: list[str]) -> list[str]:
    """Every folder the shipped files sit in (``a``, ``a/b`` for ``a/b/f``), parents first."""
    out = {str(PurePosixPath(*parts[:i])) for parts in (PurePosixPath(n).parts for n in names)
           for i in range(1, len(parts))}
    return sorted(out, key=lambda d: (d.count("/"), d))


def _prepare_script(target: str, dirs: list[str]) -> str:
    """The remote shell that makes ``<remote.root>/<project>`` and refuses, with exit :data:`_REFUSED` and one line,
    a project folder that is a symbolic link or not the user's own, and a symbolic link at any of ``dirs`` inside it
    (the folders the files go into): a remote root others can write is as hostile as shared storage, and a link there
    would receive the project (and every forwarded command would run in it)."""
    why = "which remote.sync never follows (someone else may have put it there): remove it"
    lines = [
        f"t={shell_quote(target)}",
        f'if [ -L "$t" ]; then echo "$t is a symbolic link, {why}" >&2; exit {_REFUSED}; fi',
        'mkdir -p -- "$t" || exit 1',
        f'if [ -L "$t" ] || [ ! -d "$t" ]; then echo "$t is a symbolic link, {why}" >&2; exit {_REFUSED}; fi',
        f'if [ ! -O "$t" ]; then echo "$t belongs to another user: remove it or set remote.root to a folder of your '
        f'own" >&2; exit {_REFUSED}; fi',
    ]
    lines.append('cd -- "$t" || exit 1')
    if dirs:
        lines += [f"for d in {shell_join(dirs)}; do",
                  f'  if [ -L "$d" ]; then echo "$t/$d is a symbolic link, {why}" >&2; exit {_REFUSED}; fi',
                  "done"]
    return "\n".join(lines)


def _refused(cluster_name: str, res: subprocess.CompletedProcess) -> ShipyardError:
    return ShipyardError(f"remote.sync to cluster {cluster_name}: "
                         + (res.stderr.decode(errors="replace").strip().splitlines() or ["refused"])[-1])


def _rsync(dest, root: Path, names: list[str], target: str, timeout: float) -> int:
    """rsync through the master (its ssh gets the same options); the count of itemized changes."""
    ssh = shell_join(["ssh", *dest.options(), *sum((["-o", o] for o in transport.policy()["ssh"]["batch_options"]),
                                                    [])])
    argv = ["rsync", "-rlpt", "--itemize-changes", "--from0", "--files-from=-", "--protect-args", "-e", ssh,
            "--", "./", f"{dest.login}:{target}/"]
    try:
        res = subprocess.run(argv, cwd=root, input=b"\0".join(n.encode("utf-8", "surrogateescape") for n in names),
                             capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ShipyardError(f"rsync to {dest.login}: not done within {timeout:.0f} s") from None
    if res.returncode != 0:
        raise _fail(f"rsync to {cluster_label(dest)}", res)
    return sum(1 for line in res.stdout.decode(errors="replace").splitlines() if line.strip())


def _tar(dest, root: Path, names: list[str], target: str, timeout: float) -> int:
    """tar over ssh: the whole list (used only when the manifest digest changed). Each folder goes in as a member of
    its own before its files: GNU tar then replaces a link found at a folder's name by a real folder instead of
    extracting through it (a second guard behind :func:`_prepare_script`'s refusal)."""
    members = _parents(names) + names
    tar = subprocess.run(["tar", "-c", "--null", "--no-recursion", "-T", "-", "-f", "-"], cwd=root,
                         capture_output=True, timeout=timeout,
                         input=b"\0".join(n.encode("utf-8", "surrogateescape") for n in members))
    if tar.returncode != 0:
        raise _fail("tar", tar)
    # the same checks again in the command that extracts (into the folder it checked: cd, then tar -x there)
    res = _ssh_run(dest, _prepare_script(target, _parents(names)) + "\ntar -x -f -", input=tar.stdout,
                   timeout=timeout)
    if res.returncode == _REFUSED:
        raise _refused(dest.cluster, res)
    if res.returncode != 0:
        raise _fail(f"tar to {cluster_label(dest)}", res)
    return len(names)


def cluster_label(dest) -> str:
    return f"{dest.login} (cluster {dest.cluster})"
