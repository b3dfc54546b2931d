"""`invoke build ENV`: build an image only when its inputs changed, never leave it half-written, record where it came
from.

The rules this module enforces, whatever the backend:

* **One writer.** An exclusive ``flock`` on ``containers/<env>.lock`` is held for the whole build. The kernel drops
  it when the holder dies (even by SIGKILL), so a lock can never go stale; a second build waits (or, with
  ``block=False``, exits with a line naming the holder).
* **No partial target.** Every tool writes into ``containers/<env>.<fmt>.tmp-<pid>`` beside the target; only after
  the whole build (all formats, and the %test equivalent) succeeded are the temp files renamed into place. On
  Ctrl-C, SIGTERM or SIGHUP the temp files are removed and the manifest says ``failed``. After a SIGKILL nothing can
  run, so the next build, once it holds the lock, removes the leftovers and records that the last build was killed.
* **Cache without re-hashing.** The input hash covers the resolved spec, the rendered definition text, the backend,
  the tool versions and the formats. A build is skipped when the manifest holds the same hash, says ``ok``, and each
  recorded artifact still has its recorded size and mtime (a stat, not a read of a multi-GB file).
* **Provenance.** ``containers/<env>.json`` (see :mod:`shipyard.manifest`) records the hash, each artifact's sha256
  and size, backend and tool versions, the pins, host, times and the log path.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import IO, Callable, Iterator

from shipyard import manifest as mf
from shipyard.build_log import BuildLog
from shipyard.cli import atomic_write
from shipyard.errors import ShipyardError

BACKENDS = ("apptainer", "docker")
FORMATS = ("sif", "sqsh")
SIF_MAGIC_OFFSET = 32  # after the 32-byte launch line, every SIF file carries "SIF_MAGIC"
SIF_MAGIC = b"SIF_MAGIC"
_CHUNK = 1 << 20


class BuildInterrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP turned into an exception, so the same cleanup runs as for Ctrl-C."""


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.lru_cache(maxsize=1)
def build_facts() -> dict:
    import yaml

    return yaml.safe_load(resources.files("shipyard").joinpath("data/build.yaml").read_text())


# ----------------------------------------------------------------------------------------------- paths and records


def artifact_path(reg, env_name: str, fmt: str) -> Path:
    """``<root>/containers/<env>.sif`` or ``.sqsh``: where a finished image lives."""
    return Path(reg.root) / "containers" / f"{env_name}.{fmt}"


def temp_path(target: Path) -> Path:
    """The temp file beside ``target`` that a tool writes into (same filesystem, so the rename is atomic)."""
    return target.with_name(f"{target.name}.tmp-{os.getpid()}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_record(root: Path, path: Path) -> dict:
    """What the manifest keeps about one artifact: path (relative to the project), sha256, size and mtime_ns."""
    st = path.stat()
    return {"path": str(path.relative_to(root)), "sha256": sha256_file(path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns}


def intact(root: Path, record: dict) -> bool:
    """Fast path: the file still has the recorded size and mtime. No read of its content."""
    try:
        st = (Path(root) / record["path"]).stat()
    except (OSError, KeyError, TypeError):
        return False
    return st.st_size == record.get("size") and st.st_mtime_ns == record.get("mtime_ns")


def intact_or_signed(reg, env_name: str, m: dict, fmt: str) -> bool:
    """Like :func:`intact`, but a SIF that ``invoke sign`` changed in place (signing appends a signature object)
    still counts: when its sha256 is the one the signature recorded, the artifact is re-recorded once and kept,
    instead of being rebuilt (which would throw the signature away)."""
    record = (m.get("artifacts") or {}).get(fmt)
    if not record:
        return False
    if intact(reg.root, record):
        return True
    sig = m.get("signature") or {}
    path = Path(reg.root) / record["path"]
    if fmt != "sif" or not sig.get("image_sha256") or not path.is_file() \
            or sha256_file(path) != sig["image_sha256"]:
        return False
    record_artifact(reg, env_name, fmt)
    return True


def record_artifact(reg, env_name: str, fmt: str) -> dict:
    """Re-record an artifact that another step changed in place (e.g. ``apptainer sign`` adds a signature to the
    SIF): new sha256, size and mtime, so the cache stays valid. Returns the updated manifest."""
    path = artifact_path(reg, env_name, fmt)
    if not path.is_file():
        raise ShipyardError(f"{path}: no {fmt} artifact; run `invoke build {env_name}` first")
    mpath = mf.manifest_path(reg, env_name)
    artifacts = dict(mf.read_manifest(mpath).get("artifacts", {}))
    artifacts[fmt] = file_record(Path(reg.root), path)
    return mf.update_manifest(mpath, artifacts=artifacts)


def input_hash(spec: dict, texts: dict[str, str], backend: str, tools: dict[str, str], formats: tuple[str, ...],
               files: dict[str, str]) -> str:
    """sha256 over everything that decides the image's content: spec, rendered texts, backend, tool versions,
    formats and the content hashes of files the definition copies in."""
    blob = json.dumps({"spec": spec, "texts": texts, "backend": backend, "tools": tools, "formats": list(formats),
                       "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


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
        elif words[0].upper() == "COPY":
            out += [w for w in words[1:-1] if not w.startswith("--")]
    return list(dict.fromkeys(out))


def copied_files(root: Path, sources: list[str]) -> dict[str, str]:
    """sha256 of every file a build copies in (a directory counts file by file): part of the input hash."""
    out: dict[str, str] = {}
    for rel in sources:
        src = root / rel
        if not src.exists():
            raise ShipyardError(f"{rel}: the definition copies it into the image, but it does not exist under {root}")
        paths = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
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
    containers = Path(reg.root) / "containers"
    removed = []
    for fmt in FORMATS:
        for p in containers.glob(f"{env_name}.{fmt}.tmp-*"):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    mpath = mf.manifest_path(reg, env_name)
    m = mf.read_manifest(mpath)
    if m.get("status") == "building":
        why = (f"the previous build (pid {m.get('pid')} on {m.get('host')}, started {m.get('started')}) "
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
    import threading

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


def run_streaming(argv: list[str], log: BuildLog, cwd: Path | None = None, env: dict | None = None) -> None:
    """Run a build tool, streaming its merged output line by line into ``log``; raise on a non-zero exit.

    The tool runs in its own session (the builder decides when it stops) and dies with the builder."""
    log.write("$ " + " ".join(argv))
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
        rc = proc.wait()
    except BaseException:
        _terminate(proc)
        raise
    if rc != 0:
        raise ShipyardError(f"`{' '.join(argv[:2])}` exited with {rc}; full output in {log.path}")


# tool identity (resolved path, size, mtime) -> version string; seeded from the last manifest by build(), so the
# cache fast path does not start `apptainer --version` again for a binary that did not change
_known_versions: dict[str, str] = {}
_tool_ids: dict[str, str] = {}


def tool_identity(path: str) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def tool_version(tool: str) -> str:
    """``apptainer --version`` / ``enroot version`` as one string (the cache key changes when the tool does).

    Asked once per tool binary: a binary with the same resolved path, size and mtime as last time reports the
    version recorded then (the same stat-not-read rule as for artifacts)."""
    path = shutil.which(tool)
    if not path:
        raise ShipyardError(f"{tool}: not found on PATH")
    ident = tool_identity(path)
    _tool_ids[tool] = ident
    if ident in _known_versions:
        return _known_versions[ident]
    argv = [path, "version"] if tool == "enroot" else [path, "--version"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise ShipyardError(f"`{tool} {argv[1]}` failed ({res.returncode}): {res.stderr.strip()[:200]}")
    version = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
    _known_versions[ident] = version
    return version


def _seed_tool_versions(m: dict) -> None:
    for tool, ident in (m.get("tool_ids") or {}).items():
        if tool in (m.get("tools") or {}):
            _known_versions.setdefault(ident, m["tools"][tool])


def check_sif(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(SIF_MAGIC_OFFSET + len(SIF_MAGIC))
    if head[SIF_MAGIC_OFFSET:] != SIF_MAGIC:
        raise ShipyardError(f"{path.name}: the tool exited 0 but wrote no SIF image (no SIF magic)")


# ----------------------------------------------------------------------------------------------- preflight


def _free_bytes(path: Path) -> tuple[Path, int]:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return p, st.f_bavail * st.f_frsize


def _has_mapping(path: str, user: str, uid: int) -> bool:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return False
    return any(line.split(":", 1)[0] in (user, str(uid)) for line in lines if line.strip() and ":" in line)


def preflight_apptainer(*, fakeroot: bool, environ: dict | None = None, uid: int | None = None,
                        user: str | None = None, which: Callable[[str], str | None] = shutil.which,
                        subuid: str = "/etc/subuid", subgid: str = "/etc/subgid",
                        min_free_gib: dict | None = None) -> list[str]:
    """Every reason an ``apptainer build`` would fail late, found before it starts (empty list: go)."""
    environ = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    if user is None:
        import pwd

        user = pwd.getpwuid(uid).pw_name
    problems = []
    if not which("apptainer"):
        problems.append("apptainer is not on PATH: install it (or `module load apptainer`), "
                        "or use --backend docker, or --slurm to build on a cluster node that has it")
    if fakeroot and uid != 0:
        mapped = _has_mapping(subuid, user, uid) and _has_mapping(subgid, user, uid)
        if not mapped and not which("fakeroot"):
            problems.append(f"--fakeroot needs a subuid/subgid mapping for {user} in {subuid} and {subgid} "
                            f"(admin: `apptainer config fakeroot --add {user}`) or the fakeroot command on PATH")
    facts = build_facts()
    need = min_free_gib or facts["min_free_gib"]
    for key, var in (("tmpdir", "APPTAINER_TMPDIR"), ("cachedir", "APPTAINER_CACHEDIR")):
        d = Path(os.path.expanduser(environ.get(var) or facts["default_dirs"][key]))
        where, free = _free_bytes(d)
        if free < need[key] * 2**30:
            problems.append(f"{var} ({d}) has {free / 2**30:.1f} GiB free on {where}; a build needs at least "
                            f"{need[key]} GiB: set {var} to a directory on a larger disk")
    return problems


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


class ApptainerBackend:
    """``apptainer build [--fakeroot] containers/ENV.sif.tmp-PID definitions/ENV.def`` (run in the project root)."""

    name = "apptainer"

    def __init__(self, fakeroot: bool = False):
        self.fakeroot = fakeroot

    def preflight(self) -> None:
        problems = preflight_apptainer(fakeroot=self.fakeroot)
        if problems:
            raise ShipyardError("preflight: " + "; ".join(problems))

    def inputs(self, reg, env) -> dict[Path, str]:
        from shipyard import definitions

        return {definitions.definition_path(reg, env.name): definitions.render_definition(env, reg)}

    def sources(self, inputs: dict[Path, str]) -> list[str]:
        return [src for p, t in inputs.items() if p.suffix == ".def" for src in copy_sources(t, "def")]

    def tools(self, formats) -> dict[str, str]:
        return {"apptainer": tool_version("apptainer")}

    def still_there(self, m: dict) -> bool:
        return True

    def run(self, job: Job) -> tuple[dict[str, Path], dict]:
        from shipyard import definitions

        target = artifact_path(job.reg, job.env.name, "sif")
        tmp = temp_path(target)
        argv = ["apptainer", "build"] + (["--fakeroot"] if job.fakeroot else [])
        argv += [str(tmp.relative_to(job.root)), str(definitions.definition_path(job.reg, job.env.name)
                                                      .relative_to(job.root))]
        try:
            run_streaming(argv, job.log, cwd=job.root)
            check_sif(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return {"sif": tmp}, {}


def backend_for(name: str, fakeroot: bool):
    if name == "apptainer":
        return ApptainerBackend(fakeroot)
    if name == "docker":
        from shipyard.build_docker import DockerBackend

        return DockerBackend()
    raise ShipyardError(f"--backend {name}: unknown backend (valid: {', '.join(BACKENDS)})")


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


# ----------------------------------------------------------------------------------------------- the build


def build(reg, env_name: str, *, backend: str = "apptainer", fakeroot: bool = False, force: bool = False,
          formats: str | tuple[str, ...] | None = None, block: bool = True, out: IO[str] | None = None,
          quiet: bool = False) -> dict:
    """Build ``env_name`` (or skip it when the cache says it is current) and return the manifest."""
    env = reg.environment(env_name)
    fmts = formats if isinstance(formats, tuple) else parse_formats(formats, backend)
    if fakeroot and backend != "apptainer":
        raise ShipyardError(f"--fakeroot applies to `apptainer build` only, not to --backend {backend}")
    be = backend_for(backend, fakeroot)
    be.preflight()
    root = Path(reg.root)
    inputs = be.inputs(reg, env)
    mpath = mf.manifest_path(reg, env.name)
    _seed_tool_versions(mf.read_manifest(mpath))
    tools = be.tools(fmts)
    key = input_hash(env.spec(), {str(p.relative_to(root)): t for p, t in inputs.items()}, backend, tools, fmts,
                     copied_files(root, [s for s in be.sources(inputs) if root / s not in inputs]))
    containers = root / "containers"
    with build_lock(containers / f"{env.name}.lock", block=block, out=out):
        recover_stale(reg, env.name, out)
        m = mf.read_manifest(mpath)
        if not force and m.get("status") == "ok" and m.get("input_hash") == key \
                and all(intact_or_signed(reg, env.name, m, f) for f in m.get("artifacts", {})) \
                and be.still_there(m):
            m = mf.read_manifest(mpath)
            what = ", ".join(r["path"] for r in m.get("artifacts", {}).values()) or m.get("image", {}).get("tag", "")
            print(f"{env.name}: up to date ({what}; input hash {key[:12]}); --force rebuilds", file=out)
            return m
        for path, text in inputs.items():
            with contextlib.suppress(FileNotFoundError):
                if path.read_text(encoding="utf-8") == text:
                    continue
            atomic_write(path, text, mode=0o755 if path.name.endswith(".sh") else None)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")  # unique per build, sortable
        log_path = containers / "logs" / f"{env.name}-{stamp}.log"
        mf.update_manifest(
            mpath, environment=env.name, status="building", error=None, input_hash=key, spec_hash=env.spec_hash,
            backend=backend, tools=tools, tool_ids={t: _tool_ids[t] for t in tools if t in _tool_ids},
            formats=list(fmts), pins={k: p.value for k, p in env.pins().items()},
            host=socket.gethostname(), pid=os.getpid(), started=now_iso(), finished=None,
            log=str(log_path.relative_to(root)),
        )
        temps: dict[str, Path] = {}
        with BuildLog(log_path, out=out, quiet=quiet) as log, signals_raise():
            log.write(f"shipyard build {env.name}: backend {backend}, formats {','.join(fmts)}, "
                      f"input hash {key[:12]}, log {log_path.relative_to(root)}")
            job = Job(reg, env, fmts, fakeroot, tag=f"shipyard/{env.name}:{key[:12]}", log=log)
            try:
                temps, extra = be.run(job)
                records = {}
                for fmt, tmp in temps.items():
                    target = artifact_path(reg, env.name, fmt)
                    os.replace(tmp, target)
                    records[fmt] = file_record(root, target)
                _fsync_dir(containers)
            except BaseException as exc:
                for tmp in temps.values():
                    tmp.unlink(missing_ok=True)
                msg = _describe(exc)
                log.write(f"build failed: {msg}")
                mf.update_manifest(mpath, status="failed", error=msg, finished=now_iso(), pid=None)
                raise
            # a docker image from an earlier docker-backend build no longer describes this build
            m = mf.update_manifest(mpath, status="ok", finished=now_iso(), pid=None, artifacts=records,
                                   **{"image": None, **extra})
            done = ", ".join(r["path"] for r in records.values()) or extra.get("image", {}).get("tag", "")
            log.write(f"built {done}")
    return m


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BuildInterrupted):
        return f"interrupted by {exc.args[0] if exc.args else 'a signal'}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    first = (str(exc).strip().splitlines() or [""])[0]
    return first if isinstance(exc, ShipyardError) else f"{type(exc).__name__}: {first}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_command(env_name: str | None, *, backend: str = "apptainer", fakeroot: bool = False, force: bool = False,
                  formats: str | None = None, block: bool = True, slurm: bool = False, cluster: str | None = None,
                  partition: str | None = None, wait: bool = False, registry=None, out: IO[str] | None = None) -> int:
    """`invoke build`: locally, or as a batch job on a cluster's build partition with ``slurm=True``."""
    from shipyard.registry import load

    reg = load(registry)
    env = reg.environment(env_name or None)
    if slurm:
        from shipyard import build_slurm

        return build_slurm.submit(reg, env.name, cluster_name=cluster or None, partition=partition or None,
                                  backend=backend, fakeroot=fakeroot, force=force, formats=formats, wait=wait,
                                  out=out)
    if wait or partition or cluster:
        raise ShipyardError("--wait, --partition and --cluster only apply with --slurm")
    build(reg, env.name, backend=backend, fakeroot=fakeroot, force=force, formats=formats, block=block, out=out)
    return 0
