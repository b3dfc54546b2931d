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
  recorded artifact is still the file it was (shipyard/identity.py: size and mtime_ns, a stat, not a read of a
  multi-GB file).
* **Provenance.** ``containers/<env>.json`` (see :mod:`shipyard.containers.manifest`) records the hash, each artifact's sha256
  and size, backend and tool versions, the pins, host, times and the log path.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from shipyard import project
from shipyard.containers import contents
from shipyard.containers import manifest as mf
from shipyard.containers.apptainer import ApptainerBackend
from shipyard.containers.common import (
    BACKENDS,
    BuildInterrupted,
    Job,
    build_lock,
    copied_files,
    file_record,
    intact_or_signed,
    parse_formats,
    recover_stale,
    seed_tool_versions,
    signals_raise,
    tool_ids,
)
from shipyard.containers.docker import DockerBackend, check_repository_name
from shipyard.containers.log import BuildLog
from shipyard.definitions import pylock
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, now_iso


def input_hash(spec: dict, texts: dict[str, str], backend: str, tools: dict[str, str], formats: tuple[str, ...],
               files: dict[str, str]) -> str:
    """sha256 over everything that decides the image's content: spec, rendered texts, backend, tool versions,
    formats and the content hashes of files the definition copies in."""
    blob = json.dumps({"spec": spec, "texts": texts, "backend": backend, "tools": tools, "formats": list(formats),
                       "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()




def base_record(reg, env) -> dict | None:
    """The manifest's ``base``: the reference registry.yaml names, with base_mirror the one the build pulled, and
    the digest the definitions pulled it by when the lock pins it (:mod:`shipyard.definitions.base_pin`)."""
    if not env.base.value:
        return None
    rec = {"reference": env.base.value}
    if reg.base_mirror:
        rec["mirrored"] = reg.base_reference(env)
    pin = pylock.recorded_base(reg, env)
    if pin is not None and pin.digest and pin.reference == env.base.value:
        rec["digest"] = pin.digest
    return rec


def backend_for(name: str, fakeroot: bool):
    if name == "apptainer":
        return ApptainerBackend(fakeroot)
    if name == "docker":
        return DockerBackend()
    raise ShipyardError(f"--backend {name}: unknown backend (valid: {', '.join(BACKENDS)})")


# ----------------------------------------------------------------------------------------------- the build


def build(reg, env, **kwargs) -> mf.Manifest:
    """Build the environment ``env`` (or skip it when the cache says it is current) and return the manifest.
    Keywords: those of :func:`_build`. A full disk or quota (the log, the manifest, a definition, the image's copy)
    is one line naming the file, never a traceback."""
    try:
        return _build(reg, env, **kwargs)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = exc.filename2 or exc.filename or project.containers_dir(reg)
        raise ShipyardError(f"{where}: {exc.strerror} while building {env.name}; free space there (old images in "
                            "containers/, build logs) and build again") from None


def _build(reg, env, *, backend: str = "apptainer", fakeroot: bool = False, force: bool = False,
           formats: str | tuple[str, ...] | None = None, block: bool = True, out: IO[str] | None = None,
           quiet: bool = False, forced: list[str] | None = None) -> mf.Manifest:
    """:func:`build`. ``forced``: the `invoke check` errors that ``--force`` overrode, recorded in the manifest
    (``forced_checks``)."""
    fmts = formats if isinstance(formats, tuple) else parse_formats(formats, backend)
    if fakeroot and backend != "apptainer":
        raise ShipyardError(f"--fakeroot applies to `apptainer build` only, not to --backend {backend}")
    if backend == "docker":
        check_repository_name(env.name)
    be = backend_for(backend, fakeroot)
    be.preflight()
    root = Path(reg.root)
    inputs = be.inputs(reg, env)
    mpath = project.manifest_path(reg, env.name)
    seed_tool_versions(mf.read_manifest(mpath))
    tools = be.tools(fmts)
    key = input_hash(env.spec(), {str(p.relative_to(root)): t for p, t in inputs.items()}, backend, tools, fmts,
                     copied_files(root, [s for s in be.sources(inputs) if root / s not in inputs]))
    with build_lock(project.build_lock_path(root, env.name), block=block, out=out):
        recover_stale(reg, env.name, out)
        m = mf.read_manifest(mpath)
        if not force and m.built and m.input_hash == key \
                and all(a.path == str(project.artifact_path(reg, env.name, f).relative_to(root))
                        for f, a in (m.artifacts or {}).items()) \
                and all(intact_or_signed(reg, env.name, m, f) for f in m.artifacts or {}) \
                and be.still_there(m):
            m = mf.read_manifest(mpath)
            what = ", ".join(a.path for a in (m.artifacts or {}).values()) or m.docker_tag or ""
            print(f"{env.name}: up to date ({what}; input hash {key[:12]}); --force rebuilds", file=out)
            return m
        # the manifest before this build: its contents (those of the image now in containers/, whatever became of
        # later attempts: a failed build replaces nothing) become this build's previous_contents
        before = m
        for path, text in inputs.items():
            with contextlib.suppress(FileNotFoundError):
                if path.read_text(encoding="utf-8") == text:
                    continue
            atomic_write(path, text, mode=0o755 if path.name.endswith(".sh") else None)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")  # unique per build, sortable
        log_path = project.build_logs_dir(root) / f"{env.name}-{stamp}.log"
        mf.update_manifest(
            mpath, environment=env.name, status="building", error=None, input_hash=key, spec_hash=env.spec_hash,
            backend=backend, tools=tools, tool_ids={t: tool_ids[t] for t in tools if t in tool_ids},
            formats=list(fmts), pins={k: p.value for k, p in env.pins().items()},
            host=socket.gethostname(), pid=os.getpid(), started=now_iso(), finished=None,
            log=str(log_path.relative_to(root)), forced_checks=list(forced) if forced else None,
            base=base_record(reg, env),
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
                    target = project.artifact_path(reg, env.name, fmt)
                    os.replace(tmp, target)
                    records[fmt] = file_record(root, target)
                _fsync_dir(project.containers_dir(root))
            except BaseException as exc:
                for tmp in temps.values():
                    tmp.unlink(missing_ok=True)
                msg = _describe(exc)
                log.write(f"build failed: {msg}")
                mf.update_manifest(mpath, status="failed", error=msg, finished=now_iso(), pid=None)
                raise
            # a docker image from an earlier docker-backend build no longer describes this build
            m = mf.update_manifest(mpath, status="ok", finished=now_iso(), pid=None, artifacts=records,
                                   contents=None, previous_contents=before.contents, **{"image": None, **extra})
            done = ", ".join(a.path for a in records.values()) or extra.get("image", {}).get("tag", "")
            log.write(f"built {done}")
            # after the image is recorded as built: a probe cut short (Ctrl-C, a signal) costs only the record
            found = probe_contents(be, reg, env, extra, log)
            if found:
                m = mf.update_manifest(mpath, contents=found.to_dict())
    return m


def probe_contents(be, reg, env, extra: dict, log: BuildLog):
    """The built image's contents record (:mod:`shipyard.containers.contents`), or None when the probe could not
    read it: the image is built and tested, so a probe that fails costs the record, said in the log, not the
    build."""
    try:
        found = be.probe(reg, env, extra)
    except Exception as exc:  # any failure of a read-only probe of a finished image: recorded as "not recorded"
        log.write(f"contents not recorded: {_describe(exc)}")
        return None
    log.write("contents recorded: " + ", ".join(f"{len(found.section(s))} {contents.TITLES[s]}"
                                                for s in contents.SECTIONS))
    return found


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
