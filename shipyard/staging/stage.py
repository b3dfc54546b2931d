"""`invoke stage ENV --cluster C`: put ENV's image into the cluster's storage, where launchers, modules and shell
read it (``<storage>/ENV.sif`` for apptainer clusters, ``<storage>/ENV.sqsh`` for pyxis clusters).

Why a stage of its own: `build` and `pull` write ``containers/ENV.sif`` in the project, the launchers run
``<cluster storage>/ENV.sif``, and nothing connected the two. A course instructor publishes with this command; the
students' launchers then check, before ``srun``, that what lies there is what they were written for
(:mod:`shipyard.staging.record`).

Rules, whatever the source:

* **Checks first.** The environment on this cluster passes `invoke check` (the command runs the check gate,
  :mod:`shipyard.commands.stage`); ``--force`` overrides and the overridden errors go into the record.
* **Like an installer, in a directory others can write in.** One stage of an image at a time (``flock`` on
  ``.ENV.sif.lock``; a second waits). The image is written into a private 0700 directory created in the storage
  (``mkdtemp``: a random name, nothing can be planted inside), a copy with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and its final
  mode from the start; it is hashed through its own descriptor, renamed to its version's name
  (``ENV.<sha12>.sif``, :mod:`shipyard.staging.versions`), and the record binds the inode and ctime of that very
  file; then the current pointer ``ENV.sif`` is moved to it (a symlink of someone else's there is replaced, never
  followed). The record is written the
  same way and read back. Temp files of stages that died are removed and reported. A job starting in between sees a
  record that does not match and stops -- never half an image.
* **Verified.** From ``containers/``: copied (or hard-linked with ``--link``) and re-hashed against the build
  manifest's sha256. From a registry: the SIF pulled over ORAS with the manifest digest and the blob's sha256
  checked (:func:`shipyard.containers.push.pull_sif`). For pyxis from a docker image: ``enroot import`` runs as a
  batch job on the cluster's build partition (never on the login node), and the squashfs it writes is hashed here.
* **Readable by the course.** ``--mode group`` (0640, the default), ``world`` (0644) or an octal mode, for the image
  and its record; data: ``shipyard/data/stage.yaml``. A re-stage without ``--mode`` keeps the readers the staged
  image has; an explicit ``--mode`` that takes some away says whom (:func:`keep_readers`).
* **Idempotent and cheap.** When the record beside the image already names the same sha256 and input hash, the image
  is still the file it describes (:mod:`shipyard.identity`'s rule: inode and ctime, which no writer sets back) and
  the mode is the one asked for, nothing is written; ``--force`` writes and verifies it again. "Already staged" is
  the job's own rule (:func:`shipyard.staging.record.job_check`), content included (hashed once per image file).
* **One line for what goes wrong on the storage:** missing, not writable, too little space.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import os
import shutil
import socket
import stat as stat_module
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

from shipyard import __version__, identity, project, slurm, templating
from shipyard import facts as data
from shipyard.containers import common as b
from shipyard.containers import manifest as mf
from shipyard.containers import on_slurm
from shipyard.containers import push as registry_io
from shipyard.containers.contents import Contents
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, exclusive_temp, now_iso, sha256_fd
from shipyard import runtimes
from shipyard.staging import copying, kept_contents, versions
from shipyard.staging import record as staged
from shipyard.registry.model import Cluster, Environment, Registry

SOURCES = ("auto", "containers", "registry", "docker")


def facts() -> dict:
    return data.load("stage")


def parse_mode(mode: str | None) -> int:
    """``group`` | ``world`` | an octal mode such as ``0640`` -> the mode bits; the owner can always read and write."""
    modes = facts()["modes"]
    text = str(mode or facts()["default_mode"])
    raw = modes.get(text, text)
    try:
        bits = int(str(raw), 8)
    except ValueError:
        bits = -1
    if not 0 <= bits <= 0o777 or bits & 0o600 != 0o600 or bits & 0o133:
        raise ShipyardError(f"--mode {text!r}: expected {' or '.join(modes)} or an octal mode such as 0640 (owner "
                            "rw, others at most r: an image is never executable or writable by others)")
    return bits


# ------------------------------------------------------------------------------------------------ the storage


def check_storage(cluster: Cluster, storage: Path) -> None:
    """One line when the storage directory is missing or not writable by this user."""
    key = f"clusters.{cluster.name}.storage"
    if storage.exists() and not storage.is_dir():
        raise ShipyardError(f"{storage}: the image storage of cluster {cluster.name} is not a directory ({key}); "
                            f"move that file away or point {key} at a directory")
    if not storage.is_dir():
        raise ShipyardError(f"{storage}: the image storage of cluster {cluster.name} does not exist ({key}); create "
                            f"it on the shared filesystem (mkdir -p {storage}) or fix {key}")
    if not os.access(storage, os.W_OK | os.X_OK):
        raise ShipyardError(f"{storage}: no permission to write there as {getpass.getuser()} ({key}); stage from "
                            f"the account that owns the course storage, or point {key} at a writable directory")


def check_space(storage: Path, need: int) -> None:
    """One line when the storage has less room than the image plus the margin of shipyard/data/stage.yaml."""
    free = shutil.disk_usage(storage).free
    margin = int(facts()["free_margin_mib"]) << 20
    if free < need + margin:
        raise ShipyardError(f"{storage}: too little space: {_size(free)} free, the image needs {_size(need)} plus "
                            f"{_size(margin)} to spare; remove old images there or point the storage elsewhere")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _os_error(exc: OSError, storage: Path) -> ShipyardError:
    """A failed write into the storage as one line (the checks above cannot see quotas or a disk filling up now)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ShipyardError(f"{storage}: too little space (or quota) while writing the image: {exc.strerror}; "
                             "remove old images there or point the storage elsewhere")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ShipyardError(f"{storage}: no permission to write there as {getpass.getuser()}: {exc.strerror}")
    return ShipyardError(f"{storage}: {exc.strerror or exc}")


# ------------------------------------------------------------------------------------------------ sources


@dataclass
class Source:
    """Where the image comes from: what it should hash to (when known before writing), what built it, and how to
    write it into a temp path."""

    kind: str  # containers | registry | docker
    reference: str  # a path, oras://REF:TAG or dockerd://TAG
    input_hash: str
    spec_sha256: str | None
    size: int  # for the space check (0: unknown before the write)
    write: Callable[[Path], dict] = field(repr=False)  # writes the temp file; returns extra record fields
    sha256: str | None = None  # None: known only after the write (enroot import)
    pushed_digest: str | None = None
    after: dict = field(default_factory=dict)  # what write() learnt: a pulled digest, an input hash annotation
    contents: Contents | None = None  # what the image holds, as its build recorded it (kept with the version)


def _manifest(reg: Registry, env: Environment) -> tuple[Path, mf.Manifest]:
    mpath = project.manifest_path(reg, env.name)
    m = mf.read_manifest(mpath)
    if not m.built:
        state = f"the last build {m.status}" if m.status else "it was never built"
        raise ShipyardError(f"{mpath}: cannot stage {env.name}: {state}; run `invoke build {env.name}` first "
                            "(or stage from a registry with --from registry)")
    return mpath, m


def _pushed_digest(m: mf.Manifest) -> str | None:
    return ", ".join(m.pushed_digests) or None


def from_containers(reg: Registry, env: Environment, fmt: str, link: bool, mode: int = 0o600) -> Source:
    mpath, m = _manifest(reg, env)
    art = m.artifact(fmt)
    src = project.artifact_path(reg, env.name, fmt)
    if not art or not src.is_file():
        how = "--backend docker builds .sqsh where enroot exists; or stage with --from docker" if fmt == "sqsh" else \
            f"run `invoke build {env.name}`"
        raise ShipyardError(f"{src}: no {fmt} image of {env.name} in containers/ ({how})")
    if not b.intact_or_signed(reg, env.name, m, fmt):
        raise ShipyardError(f"{src} changed since it was built (size/mtime differ from {mpath.name}); rebuild with "
                            f"`invoke build {env.name} --force`")
    art = mf.read_manifest(mpath).artifact(fmt)  # re-recorded if signing changed the file

    learnt: dict = {}

    def write(tmp: Path) -> dict:
        if link:
            try:
                os.link(src, tmp)
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise ShipyardError(f"--link: {src} and {tmp.parent} are on different filesystems; "
                                        "stage without --link to copy") from None
                raise
        else:
            # the final mode from the start, never through a link; readable: the copy's hash is read back from it
            fd, made = exclusive_temp(tmp, mode, "copy", readable=True)
            try:
                with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
                    learnt["copied"] = (*copying.copy_hashing(fin, fout), tmp)
                os.replace(made, tmp)
            except BaseException:
                made.unlink(missing_ok=True)
                raise
        return {"linked": bool(link)}

    return Source("containers", str(src.relative_to(reg.root)), m.input_hash, m.spec_hash, art.size,
                  write, sha256=art.sha256, pushed_digest=_pushed_digest(m), after=learnt, contents=_contents(m))


def _contents(m: mf.Manifest) -> Contents | None:
    """The build's contents record, kept with the staged version for `invoke diff --staged`; a corrupt one is not
    kept (the stage itself does not depend on it, and `invoke show --contents` names the problem)."""
    try:
        return m.contents_record
    except ShipyardError:
        return None


def from_registry(reg: Registry, env: Environment, registry_name: str | None, tag: str | None,
                  out: IO[str] | None) -> Source:
    """The SIF over ORAS (tag default: the one the last push recorded), digest and blob sha256 verified."""
    target = reg.registry_target(registry_name)
    if target.scheme != "oras":  # the schema allows oras:// and docker:// only
        raise ShipyardError(f"registries.{target.name}: {target.uri} is a docker:// registry; apptainer clusters "
                            "stage a SIF from an oras:// registry (pyxis clusters import docker:// images)")
    m = mf.read_manifest(project.manifest_path(reg, env.name))
    known = m.pushed_to(target.name)
    if tag is None:
        if not known:
            raise ShipyardError(f"no push of {env.name} to registry '{target.name}' is recorded here; give --tag")
        tag = known.tag
    else:
        registry_io.check_tag(tag)
    expect = known.digest_for(tag) if known else None
    ref = "oras://" + registry_io.reference(target, env.name, tag)
    info: dict = {}

    def write(tmp: Path) -> dict:
        # registry failures (a timeout, an unknown tag) are the registry's, said as such: requests' errors are
        # OSErrors, and the stage would otherwise report them as the storage's
        what = f"pull {ref}"
        with registry_io.one_line(target, what, local_errors=False), registry_io.transfer_deadline(target, what):
            info.update(registry_io.pull_sif(target, env.name, tag, tmp, expect, out))
        b.check_sif(tmp)
        return {"pulled": info.get("pulled")}

    return Source("registry", ref, (known.input_hash if known else None) or "", m.spec_hash, 0, write,
                  pushed_digest=expect, after=info)


def enroot_uri(target, env_name: str, tag: str) -> str:
    """enroot's form of a registry image: ``docker://REGISTRY#REPO/ENV:TAG`` (its ``#`` separates the host)."""
    repo = f"{target.repository}/{env_name}" if target.repository else env_name
    return f"docker://{target.host}#{repo}:{tag}"


def from_docker_registry(reg: Registry, env: Environment, cluster: Cluster, registry_name: str | None,
                         tag: str | None, out: IO[str] | None) -> Source:
    """``enroot import docker://REGISTRY#ENV:TAG`` of a pushed docker image, as a batch job on the build partition
    (pyxis clusters). A plain-HTTP registry (``insecure: true``) gets ``ENROOT_ALLOW_HTTP=yes`` in the job; the
    registry's host must be an address the build nodes reach (their 127.0.0.1 is their own)."""
    target = reg.registry_target(registry_name)
    if target.scheme != "docker":
        raise ShipyardError(f"registries.{target.name}: {target.uri} is an oras:// registry of SIF files; pyxis "
                            "clusters import a docker image (a docker:// registry, or --from docker)")
    m = mf.read_manifest(project.manifest_path(reg, env.name))
    known = m.pushed_to(target.name)
    if tag is None:
        if not known:
            raise ShipyardError(f"no push of {env.name} to registry '{target.name}' is recorded here; give --tag")
        tag = known.tag
    else:
        registry_io.check_tag(tag)
    registry_io.check_repository_name(env.name)
    source = enroot_uri(target, env.name, tag)

    def write(tmp: Path) -> dict:
        job = import_job(reg, env, cluster, source, tmp, out, allow_http=target.insecure)
        if not tmp.is_file():
            raise ShipyardError(f"enroot import job {job} wrote no {tmp.name}; see its log in containers/logs/")
        return {"import_job": job}

    return Source("registry", source, (known.input_hash if known else None) or "", m.spec_hash, 0, write,
                  pushed_digest=known.digest_for(tag) if known else None)


def from_docker(reg: Registry, env: Environment, cluster: Cluster, out: IO[str] | None) -> Source:
    """``enroot import dockerd://IMAGE`` of the docker-backend build, as a batch job on the build partition."""
    _, m = _manifest(reg, env)
    image = m.docker_tag
    if not image:
        raise ShipyardError(f"{env.name} has no docker image (it was built with --backend apptainer); build it with "
                            f"`invoke build {env.name} --backend docker`")
    source = f"dockerd://{image}"

    def write(tmp: Path) -> dict:
        job = import_job(reg, env, cluster, source, tmp, out)
        if not tmp.is_file():
            raise ShipyardError(f"enroot import job {job} wrote no {tmp.name}; see its log in containers/logs/")
        return {"import_job": job}

    return Source("docker", source, m.input_hash, m.spec_hash, 0, write,
                  pushed_digest=_pushed_digest(m))


def render_import_job(reg: Registry, env: Environment, cluster: Cluster, source: str, tmp: Path,
                      allow_http: bool = False) -> str:
    """The batch script that runs ``enroot import`` on the build partition (golden-tested; values quoted)."""
    f = facts()
    d = on_slurm._directive
    return templating.render("shipyard.staging", "stage_import.sbatch.j2", trim_blocks=True,
        version=__version__, env=env.name, cluster=cluster.name,
        job_name=d(f"stage-{env.name}", "job name"),
        partition=d(cluster.build_partition, f"clusters.{cluster.name}.scheduler.build_partition"),
        time=d(cluster.build_time or f["import_time"], f"clusters.{cluster.name}.scheduler.build_time"),
        account=d(cluster.account, f"clusters.{cluster.name}.scheduler.account"),
        output=d(str(project.build_logs_dir(reg) / f"{env.name}-stage-%j.out"), "log path (project dir)"),
        modules=cluster.modules, source=source, tmp=str(tmp), allow_http=allow_http)


def import_job(reg: Registry, env: Environment, cluster: Cluster, source: str, tmp: Path,
               out: IO[str] | None, allow_http: bool = False) -> str:
    script = project.build_logs_dir(reg) / f"{env.name}-stage.sbatch"
    atomic_write(script, render_import_job(reg, env, cluster, source, tmp, allow_http), mode=0o755)
    job = slurm.submit(cluster, script)
    log = project.build_logs_dir(reg) / f"{env.name}-stage-{job}.out"
    print(f"enroot import of {source} runs as job {job} on partition {cluster.build_partition}; log: {log}",
          file=out, flush=True)
    on_slurm.ended(slurm.Job(cluster, job), log, out or open(os.devnull, "w"), what="enroot import job",
                   poll=float(facts()["import_poll_s"]))
    return job


# ------------------------------------------------------------------------------------------------ staging


def lock_path(dest: Path) -> Path:
    """The lock file beside ``dest`` that serialises stages of that image (``.ENV.sif.lock``)."""
    return dest.with_name(f".{dest.name}.lock")


def _symlink_error(path: Path) -> ShipyardError:
    return ShipyardError(f"{path} is a symlink, which `invoke stage` never follows or writes through (someone else "
                         "put it there); remove it and check who can write in the storage")


@contextmanager
def _locked(dest: Path, perm: int, storage: Path, out: IO[str] | None):
    """Hold the per-destination lock (flock on ``.ENV.sif.lock``, never through a symlink) while staging ``dest``; a
    second stage of the same image waits, up to ``lock_wait_s`` of shipyard/data/stage.yaml."""
    path = lock_path(dest)
    # O_NONBLOCK: a FIFO planted at the lock's name opens without waiting for a writer, then is refused below
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, perm)
        except PermissionError:
            fd = os.open(path, os.O_RDONLY | flags)  # another stager's lock file: flock works read-only
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise _symlink_error(path) from None
        raise _os_error(exc, storage) from None
    try:
        if not stat_module.S_ISREG(os.fstat(fd).st_mode):
            raise ShipyardError(f"{path}: not a regular file (the lock of {dest.name}); remove it")
        deadline = time.monotonic() + float(facts()["lock_wait_s"])
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ShipyardError(f"{path}: another stage of {dest.name} still holds the lock after "
                                        f"{facts()['lock_wait_s']} s; wait for it and try again") from None
                if not told:
                    print(f"waiting for another stage of {dest} (lock {path})", file=out, flush=True)
                    told = True
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the lock


locked = _locked  # the same lock for --list/--rollback/--prune (shipyard/staging/history.py)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale(dest: Path, out: IO[str] | None) -> None:
    """Under the lock, the temp files and directories of stages of ``dest`` that ended without cleaning up (killed,
    host down) are removed and reported; those of a stage on another host, or not ours, are reported and left."""
    host = os.uname().nodename
    prefix = f".{dest.name}.stage."
    for entry in sorted(dest.parent.glob(prefix + "*")) + sorted(dest.parent.glob(project.temp_glob(dest))):
        rest = entry.name[len(prefix):].split(".") if entry.name.startswith(prefix) else []
        try:
            st = entry.lstat()
            pid = int(rest[-2]) if len(rest) >= 3 else None
            same_host = ".".join(rest[:-2]) == host
        except (OSError, ValueError):
            continue
        if pid is not None and (not same_host or _alive(pid)):
            print(f"left {entry}: a stage of {dest.name} on {'.'.join(rest[:-2])} (pid {pid})", file=out)
            continue
        try:
            if stat_module.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as exc:
            print(f"left {entry}: a stale temp file of a stage of {dest.name} that ended; cannot remove it "
                  f"({exc.strerror})", file=out)
            continue
        print(f"removed {entry}: a stale temp file of a stage of {dest.name} that ended", file=out)


def up_to_date(dest: Path, src: Source, mode: int) -> staged.StageRecord | None:
    """The existing record when ``dest`` is already this image with this mode, by the job's own rule
    (:func:`shipyard.staging.record.job_check`: a record a job would refuse is never "already staged"). The content
    is verified last, once per image file (cached like the job's check), only when all else says up to date."""
    rec, _ = staged.job_check(dest, content=False)
    if not rec:
        return None
    if src.reference.startswith("docker://") and not src.input_hash:
        return None  # a registry tag with no recorded push behind it: it may have moved since, so import again
    same = rec.sha256 == src.sha256 if src.sha256 else \
        rec.source_reference == src.reference and rec.input_hash == src.input_hash
    if not same or (src.input_hash and rec.input_hash != src.input_hash):
        return None
    image = versions.current(dest)
    if image.lstat().st_mode & 0o777 != mode or staged.record_path(dest).lstat().st_mode & 0o777 != mode:
        return None
    return None if staged.content_differs(dest, rec) else rec


def keep_readers(dest: Path, mode: str | None, perm: int) -> tuple[int, str | None]:
    """The mode to stage with, and a line to say about it. A re-stage without ``--mode`` keeps the readers the
    staged image has (a course published to everyone stays published: the default would lock its students out); an
    explicit ``--mode`` that takes readers away goes on and says whom it drops."""
    try:
        st = dest.lstat()
    except FileNotFoundError:
        return perm, None
    if not stat_module.S_ISREG(st.st_mode):
        return perm, None
    had = stat_module.S_IMODE(st.st_mode)
    if mode is None:
        if had & 0o044 & ~perm:
            try:
                kept = parse_mode(f"{had | perm:04o}")
            except ShipyardError:
                return perm, None
            return kept, (f"{dest.name}: keeping its readers (mode {kept:04o}, was {had:04o}); pass --mode to "
                          "change that")
        return perm, None
    lost = had & 0o044 & ~perm
    if lost:
        who = " and ".join(w for w, bit in (("its group", 0o040), ("everyone else", 0o004)) if lost & bit)
        return perm, (f"{dest.name}: narrowing mode {had:04o} to {perm:04o} as --mode asks: {who} can no longer "
                      "read the image (jobs of those students will fail)")
    return perm, None


def request(cluster: Cluster, source: str = "auto", mode: str | None = None):
    """Refuse a request that cannot stage anything before the checks run: a runtime without images, an unknown
    ``--from`` or ``--mode``. Returns the cluster's runtime and the mode bits."""
    rt = runtimes.get(cluster.runtime, f"clusters.{cluster.name}.runtime")
    if not rt.containerised:
        raise ShipyardError(f"cluster {cluster.name} uses the {rt.name} runtime, which runs no image: nothing to "
                            "stage (stage for an apptainer or pyxis cluster)")
    if source not in SOURCES:
        raise ShipyardError(f"--from {source!r}: expected one of {', '.join(SOURCES)}")
    return rt, parse_mode(mode)


def stage(reg: Registry, env: Environment, cluster: Cluster, *, source: str = "auto",
          registry_name: str | None = None, tag: str | None = None, mode: str | None = None, link: bool = False,
          forced: list[str] | None = None, force: bool = False, out: IO[str] | None = None) -> staged.StageRecord:
    """Stage ``env``'s image into ``cluster``'s storage; return its record. ``forced``: the `invoke check` errors
    that ``--force`` overrode (the command ran the gate): recorded. With ``force`` (``--force``) the image is
    written and verified again even when its record says it is up to date."""
    rt, perm = request(cluster, source, mode)
    fmt = rt.suffix
    dest = Path(rt.image(reg.root, env.name, cluster))
    storage = dest.parent
    check_storage(cluster, storage)
    perm, note = keep_readers(versions.current(dest), mode, perm)
    if note:
        print(note, file=out)
    if source == "auto":
        source = "containers" if fmt == "sif" or project.artifact_path(reg, env.name, fmt).is_file() else "docker"
    if source == "docker" and fmt != "sqsh":
        raise ShipyardError(f"--from docker: cluster {cluster.name} runs apptainer (.sif); stage --from "
                            "containers or --from registry")
    if link and source != "containers":
        raise ShipyardError("--link applies to --from containers only")
    src = (from_containers(reg, env, fmt, link, perm) if source == "containers" else
           from_registry(reg, env, registry_name, tag, out) if source == "registry" and fmt == "sif" else
           from_docker_registry(reg, env, cluster, registry_name, tag, out) if source == "registry" else
           from_docker(reg, env, cluster, out))
    with _locked(dest, perm, storage, out):
        _clean_stale(dest, out)
        rec = up_to_date(dest, src, perm) if not (forced or force) else None
        if rec:
            print(f"{env.name}: already staged at {versions.current(dest)} (sha256 {rec.sha256[:12]}, input hash "
                  f"{rec.input_hash[:12]}); nothing to do", file=out)
            return rec
        earlier = versions.version_path(dest, src.sha256) if src.sha256 and not (forced or force) else None
        if earlier and earlier != versions.current(dest) and up_to_date(earlier, src, perm):
            versions.point(dest, earlier)  # a version staged before (then rolled back from): current again
            print(f"{env.name}: {dest.name} points at {earlier.name} again (staged before; sha256 "
                  f"{src.sha256[:12]})", file=out)
            return staged.read_record(earlier)[0]
        check_space(storage, src.size)
        return _write(env, cluster, src, dest, perm, forced, out)


def _write(env: Environment, cluster: Cluster, src: Source, dest: Path, perm: int, forced: list[str] | None,
           out: IO[str] | None) -> staged.StageRecord:
    """Write the image into a private (0700) directory of the storage under a random name, hash it through its own
    descriptor, give it its mode, rename it to ``dest`` and record the stamp of that very file (its inode and the
    ctime after the rename); then the record."""
    storage = dest.parent
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.stage.{os.uname().nodename}.{os.getpid()}.",
                                     dir=storage))
    except OSError as exc:
        raise _os_error(exc, storage) from None
    tmp = work / dest.name
    try:
        extra = src.write(tmp)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat_module.S_ISREG(os.fstat(fd).st_mode):
                raise ShipyardError(f"{tmp}: the staged copy is not a regular file; nothing was replaced")
            after = src.after
            copied = after.pop("copied", None)
            fst = os.fstat(fd)
            if copied and copied[3] == tmp and copied[:2] == (fst.st_dev, fst.st_ino):
                got = copied[2]  # hashed as written and fsync'ed, and this is that very file
            else:
                got = sha256_fd(fd)
            want = src.sha256 or (after.get("layer_digest", "").removeprefix("sha256:") or None)
            if want and got != want:
                raise ShipyardError(f"{tmp}: the staged copy hashes to sha256 {got}, the source says {want}; "
                                    "nothing was replaced (check the storage's filesystem and try again)")
            os.fchmod(fd, perm)
            pointer, dest = dest, versions.version_path(dest, got)  # this build's own name; the pointer moves last
            os.replace(tmp, dest)
            st = identity.fstamp(fd)  # the file this process wrote and hashed, whatever lies at dest now
        finally:
            os.close(fd)
    except OSError as exc:
        raise _os_error(exc, storage) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if identity.changed(dest, st):
        raise ShipyardError(f"{dest} was replaced right after this stage renamed its image there (someone else "
                            "writes in this storage); check who can write there and stage again")
    record = staged.StageRecord(
        environment=env.name, cluster=cluster.name, image=dest.name, sha256=got, size=st.size,
        mtime_ns=st.mtime_ns, ino=st.ino, ctime_ns=st.ctime_ns,
        input_hash=src.input_hash or after.get("input_hash") or "",
        spec_sha256=src.spec_sha256, pushed_digest=src.pushed_digest or after.get("digest"),
        source={"kind": src.kind, "reference": src.reference, **{k: v for k, v in extra.items() if v}},
        mode=f"{perm:04o}", staged=now_iso(), staged_by=f"{getpass.getuser()}@{socket.gethostname()}",
        shipyard=__version__, forced_checks=list(forced) if forced else None,
    )
    try:
        staged.write_record(dest, record, mode=perm)
        if src.contents is not None and src.sha256 == got:  # the build's record describes these very bytes
            kept_contents.keep(dest, src.contents, perm)
        _move_pointer(pointer, dest)
    except OSError as exc:
        raise _os_error(exc, storage) from None
    print(f"staged {env.name} at {dest} (sha256 {got[:12]}, input hash {record.input_hash[:12]}, mode "
          f"{perm:04o}, from {src.kind} {src.reference}); {pointer.name} now names it", file=out)
    return record


def _move_pointer(pointer: Path, version: Path) -> None:
    """Point ``pointer`` at ``version``. An image staged by an older shipyard (a regular file at the pointer's
    name) is replaced by the pointer, and its record, now describing nothing, goes with it."""
    legacy = not versions.is_pointer(pointer) and pointer.is_file() and not pointer.is_symlink()
    versions.point(pointer, version)
    if legacy:
        old = Path(str(pointer) + staged.RECORD_SUFFIX)
        if old.is_file() and not old.is_symlink():
            old.unlink()
