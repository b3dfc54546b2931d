"""What every image build shares, whatever the backend: paths and records of artifacts, the input files a
definition copies in, the per-environment flock, recovery after a killed build, child processes that die with the
builder, tool versions, and the ``Job`` a backend receives.

Backends (:mod:`shipyard.containers.apptainer`, :mod:`shipyard.containers.docker`) import only this module;
:mod:`shipyard.containers.engine` puts them together.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from shipyard import identity, project
from shipyard.containers import manifest as mf
from shipyard.containers.log import BuildLog
from shipyard.definitions.render import BUILD_NET_CONTEXT
from shipyard.errors import ShipyardError
from shipyard.files import copied_tree, sha256_file

BACKENDS = ("apptainer", "docker")
FORMATS = ("sif", "sqsh")
SIF_MAGIC_OFFSET = 32  # after the 32-byte launch line, every SIF file carries "SIF_MAGIC"
SIF_MAGIC = b"SIF_MAGIC"
TAIL_LINES = 50  # the last lines of a build tool's output that run_streaming's ``explain`` reads


class BuildInterrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP turned into an exception, so the same cleanup runs as for Ctrl-C."""


# ----------------------------------------------------------------------------------------------- paths and records


def file_record(root: Path, path: Path) -> mf.Artifact:
    """What the manifest keeps about one artifact: path (relative to the project), sha256 and identity stamp."""
    return mf.Artifact.of(Path(root), path)


def intact_or_signed(reg, env_name: str, m: mf.Manifest, fmt: str) -> bool:
    """The artifact is still the recorded one (:meth:`Artifact.intact`, the rule of :mod:`shipyard.identity`), or
    its stamp moved with the same content (``stage --link`` adds a hard link and moves the ctime; a manifest from
    before inode and ctime were recorded), or a SIF that ``invoke sign`` changed in place (signing appends a
    signature object) with the sha256 the signature recorded. Either way the artifact is re-recorded once and kept,
    instead of being rebuilt (which would throw a signature away)."""
    record = m.artifact(fmt)
    if not record:
        return False
    if record.intact(reg.root):
        return True
    path = Path(reg.root) / record.path
    if path.is_symlink() or not path.is_file():
        return False
    got = sha256_file(path)  # the stamp moved (a hard link by `stage --link`, a chmod, an older manifest): content
    signed = m.signed_sha256
    if got != record.sha256 and (fmt != "sif" or not signed or got != signed):
        return False
    record_artifact(reg, env_name, fmt)
    return True


def record_artifact(reg, env_name: str, fmt: str) -> mf.Manifest:
    """Re-record an artifact that another step changed in place (e.g. ``apptainer sign`` adds a signature to the
    SIF): new sha256 and stamp, so the cache stays valid. Returns the updated manifest."""
    path = project.artifact_path(reg, env_name, fmt)
    if not path.is_file():
        raise ShipyardError(f"{path}: no {fmt} artifact; run `invoke build {env_name}` first")
    mpath = project.manifest_path(reg, env_name)
    artifacts = dict(mf.read_manifest(mpath).artifacts or {})
    artifacts[fmt] = file_record(Path(reg.root), path)
    return mf.update_manifest(mpath, artifacts=artifacts)


def copy_sources(text: str, syntax: str) -> list[str]:
    """The project files a rendered definition copies into the image: ``%files`` lines of a .def, ``COPY`` lines
    of a Dockerfile. Read from the text itself, so the build context and the cache key hold exactly what the build
    uses (the environment's ``files:`` and, when locked, definitions/ENV.lock)."""
    out: list[str] = []
    section = None
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if syntax == "def":
            if line.startswith("%"):
                section = words[0]
            elif section == "%files":
                out.append(words[0])
        elif words[0].upper() == "COPY" and not any(w.startswith("--from=") for w in words):
            # the build-network directory is generated per build (shipyard/containers/buildnet.py), not a source
            out += [w for w in words[1:-1] if not w.startswith("--") and w.rstrip("/") != BUILD_NET_CONTEXT]
    return list(dict.fromkeys(out))


def copied_files(root: Path, sources: list[str]) -> dict[str, str]:
    """sha256 of every file a build copies in (a directory counts file by file): part of the input hash."""
    out: dict[str, str] = {}
    for rel in sources:
        src = root / rel
        if not src.exists():
            raise ShipyardError(f"{rel}: the definition copies it into the image, but it does not exist under {root}")
        try:  # symlinks: to a file inside the project only (shipyard/files.py copied_tree)
            paths = copied_tree(root, rel)
        except ValueError as exc:
            raise ShipyardError(f"the definition copies {rel} into the image, but {exc}") from None
        for p in paths:
            out[str(p.relative_to(root))] = sha256_file(p)
    return out


# ----------------------------------------------------------------------------------------------- lock and recovery


@contextlib.contextmanager
def build_lock(path: Path, block: bool = True, out: IO[str] | None = None) -> Iterator[None]:
    """Hold the exclusive build lock of one environment. The file names its holder (pid and host) for messages."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            if not block:
                raise ShipyardError(f"{path}: another build of this environment is running ({holder}); "
                                    "wait for it, or run without --no-block to queue behind it") from None
            print(f"waiting for the running build ({holder}) to finish ...", file=out, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def recover_stale(reg, env_name: str, out: IO[str] | None = None) -> list[Path]:
    """Run while holding the lock: remove temp files of a builder that died, and mark its manifest ``failed``.

    Whoever held the lock before us is gone, so any ``*.tmp-*`` beside the targets is garbage, and a manifest still
    saying ``building`` belongs to a builder killed without cleanup (SIGKILL, power loss).
    """
    removed = []
    for fmt in FORMATS:
        target = project.artifact_path(reg, env_name, fmt)
        exact = re.compile(re.escape(target.name + project.TEMP_INFIX) + r"[0-9]+\Z")
        # only names project.temp_path() makes (the glob alone also matches another environment's files when that
        # environment is named like a temp file, e.g. "x.sif.tmp-1")
        for p in (p for p in target.parent.glob(project.temp_glob(target)) if exact.match(p.name)):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    mpath = project.manifest_path(reg, env_name)
    m = mf.read_manifest(mpath)
    if m.status == "building":
        why = (f"the previous build (pid {m.pid} on {m.host}, started {m.started}) "
               "was killed before it finished")
        mf.update_manifest(mpath, status="failed", error=why, finished=None, pid=None)
        print(f"{env_name}: {why}; removed its partial output", file=out)
    elif removed:
        print(f"{env_name}: removed partial output of an interrupted build: "
              + ", ".join(p.name for p in removed), file=out)
    return removed


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While building, SIGTERM and SIGHUP raise :class:`BuildInterrupted` (Ctrl-C already raises
    KeyboardInterrupt), so temp files are removed and the manifest says ``failed``."""

    def handler(signum, frame):
        raise BuildInterrupted(signal.Signals(signum).name)

    if threading_main():
        old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    else:
        old = {}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()


# ----------------------------------------------------------------------------------------------- child processes


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux PR_SET_PDEATHSIG: the tool gets SIGTERM if the builder is SIGKILLed, instead of writing on alone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except Exception:
        pass


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_streaming(argv: list[str], log: BuildLog, cwd: Path | None = None, env: dict | None = None,
                  explain: Callable[[list[str]], str | None] | None = None) -> None:
    """Run a build tool, streaming its merged output line by line into ``log``; raise on a non-zero exit (exit
    code 1: the build failed, the input was fine). ``explain`` turns the tool's last lines into what failed, for
    that one line; without it, or when it finds nothing, the line names the tool's exit code.

    The tool runs in its own session (the builder decides when it stops) and dies with the builder."""
    log.write("$ " + " ".join(argv))
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, env=env, text=True, errors="replace", bufsize=1,
                                start_new_session=True, preexec_fn=_die_with_parent)
    except FileNotFoundError:
        raise ShipyardError(f"{argv[0]}: not found on PATH") from None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line.rstrip("\n"))
        rc = proc.wait()
    except BaseException:
        _terminate(proc)
        raise
    if rc != 0:
        what = (explain(list(tail)) if explain else None) or f"`{' '.join(argv[:2])}` exited with {rc}"
        raise ShipyardError(f"{what}; full output in {log.path}", exit_code=1)


# tool identity (resolved path, size, mtime) -> version string; seeded from the last manifest by build(), so the
# cache fast path does not start `apptainer --version` again for a binary that did not change
_known_versions: dict[str, str] = {}
tool_ids: dict[str, str] = {}


def tool_identity(path: str) -> str:
    real = os.path.realpath(path)
    st = identity.stamp(real)
    return f"{real}:{st.size}:{st.mtime_ns}"


def tool_version(tool: str) -> str:
    """``apptainer --version`` / ``enroot version`` as one string (the cache key changes when the tool does).

    Asked once per tool binary: a binary with the same resolved path, size and mtime as last time reports the
    version recorded then (a stat, not a run; the version cache's own key)."""
    path = shutil.which(tool)
    if not path:
        raise ShipyardError(f"{tool}: not found on PATH")
    ident = tool_identity(path)
    tool_ids[tool] = ident
    if ident in _known_versions:
        return _known_versions[ident]
    argv = [path, "version"] if tool == "enroot" else [path, "--version"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise ShipyardError(f"`{tool} {argv[1]}` failed ({res.returncode}): {res.stderr.strip()[:200]}")
    version = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
    _known_versions[ident] = version
    return version


def seed_tool_versions(m: mf.Manifest) -> None:
    for tool, ident in (m.tool_ids or {}).items():
        if tool in (m.tools or {}):
            _known_versions.setdefault(ident, m.tools[tool])


def check_sif(path: Path, why: str = "the tool exited 0 but wrote no SIF image") -> None:
    """Refuse a file without SIF's magic bytes (``SIF_MAGIC`` at offset 32), in one line."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(SIF_MAGIC_OFFSET + len(SIF_MAGIC))
    except OSError as exc:
        raise ShipyardError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if head[SIF_MAGIC_OFFSET:] != SIF_MAGIC:
        raise ShipyardError(f"{path.name}: {why} (no SIF magic)")


# ----------------------------------------------------------------------------------------------- backends


@dataclass
class Job:
    """What a backend gets: the environment, where things go, and the open log."""

    reg: object
    env: object
    formats: tuple[str, ...]
    fakeroot: bool
    tag: str
    log: BuildLog | None = None

    @property
    def root(self) -> Path:
        return Path(self.reg.root)


def parse_formats(text: str | None, backend: str) -> tuple[str, ...]:
    """``--formats sif,sqsh`` -> ('sif', 'sqsh'); the default is every format the backend can make."""
    if not text:
        return ("sif",) if backend == "apptainer" else FORMATS
    fmts = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise ShipyardError(f"--formats {text}: unknown format {bad[0] if bad else '(none)'} "
                            f"(valid: {', '.join(FORMATS)})")
    if backend == "apptainer" and fmts != ("sif",):
        raise ShipyardError(f"--formats {text}: the apptainer backend makes only sif; .sqsh comes from "
                            "`enroot import dockerd://`, so use --backend docker")
    return fmts


