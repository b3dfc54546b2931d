"""The record beside a staged image, ``<storage>/<env>.sif.json`` (or ``.sqsh.json``), and what binds a launcher to it.

Why a record: a launcher names a path, and a path says nothing about what lies there today. `invoke stage` writes,
beside every image it puts into a cluster's storage, the image's sha256, the input hash of the build that made it,
the spec sha256, where it came from and the digest it was pushed under, plus the image's identity stamp when it was
staged (:mod:`shipyard.identity`: size, mtime_ns, inode and ctime_ns). A launcher names the sha256 and input hash it was written for;
before ``srun`` its job compares them with the record, the image's stamp with the record's (one ``stat``), and the
image's sha256 with its own (once per image file, cached by stamp: :data:`shipyard.identity` explains why the record
alone is not enough). Anything else -- another image staged since, an image changed in place,
no record at all -- stops the job with one line naming both hashes.

One reader (:func:`read_record`) and one writer (:func:`write_record`) of :class:`StageRecord`. The record is JSON
written with one key per line (sorted, two-space indent), so that the batch script can read a field with ``sed`` on a
node without Python. It carries ``"schema": SCHEMA``. A record without the field was written before records were
versioned; schema 1 had no inode and ctime. Either reads as "stage it again", like a record of an unknown version.
A record is read only when it is a regular file (never through a symlink), at most :data:`MAX_BYTES`, with every field
of the schema's type: hashes are exactly 64 lowercase hex digits (``fullmatch``: a hash ending in a newline is not a
hash) and the stamp's fields non-negative integers.

The record lives in the staging package: `invoke stage` writes it; the launcher, ``doctor`` and stage itself read it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat as stat_module
from dataclasses import dataclass
from pathlib import Path

from shipyard import facts, identity, project
from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError
from shipyard.files import exclusive_write, sha256_fd
from shipyard.staging import versions

SCHEMA = 2
MAX_BYTES = int(facts.load("limits")["input_bytes"]["stage_record"])  # a record is about 1 KiB
_HEX64 = re.compile(r"[0-9a-f]{64}")
RECORD_SUFFIX = ".json"
# the fields the batch script reads with sed (each is a string or an integer on its own line)
SHELL_FIELDS = ("sha256", "input_hash") + identity.SHELL_FIELDS


@dataclass(frozen=True)
class StageRecord:
    """What `invoke stage` recorded about the image beside it. The first four fields are what a job checks."""

    sha256: str
    input_hash: str
    size: int
    mtime_ns: int
    ino: int | None = None  # required in a record read back (schema 2); None only while building one
    ctime_ns: int | None = None
    environment: str | None = None
    cluster: str | None = None
    image: str | None = None  # the file name in the storage
    spec_sha256: str | None = None
    pushed_digest: str | None = None
    source: dict | None = None  # {"kind": containers|registry|docker, "reference": ..., what the source learnt}
    mode: str | None = None  # "0640"
    staged: str | None = None  # UTC time
    staged_by: str | None = None  # user@host
    shipyard: str | None = None  # the version that staged it
    forced_checks: list | None = None  # the `invoke check` errors --force overrode

    @property
    def stamp(self) -> identity.Stamp:
        return identity.Stamp(self.size, self.mtime_ns, self.ino, self.ctime_ns)

    @property
    def source_kind(self) -> str | None:
        return (self.source or {}).get("kind")

    @property
    def source_reference(self) -> str | None:
        return (self.source or {}).get("reference")

    def to_dict(self) -> dict:
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        # spec_sha256 and pushed_digest are written even when unknown: the record says it does not know
        out.update(spec_sha256=self.spec_sha256, pushed_digest=self.pushed_digest, schema=SCHEMA)
        return out


def record_path(image: str | Path) -> Path:
    """``<storage>/<env>.sif`` -> ``<storage>/<env>.sif.json``; for stage's current pointer, the record of the
    version it names (:mod:`shipyard.staging.versions`)."""
    return Path(str(versions.current(image)) + RECORD_SUFFIX)


def render_record(rec: StageRecord) -> str:
    """The record's text: sorted keys, one per line (the batch script's ``sed`` relies on it)."""
    return json.dumps(rec.to_dict(), indent=2, sort_keys=True) + "\n"


def write_record(image: str | Path, rec: StageRecord, mode: int | None = None) -> Path:
    """Write ``rec`` beside ``image``: a new file created exclusively under a random name with its final mode, then
    renamed over the old record (a symlink at the record's name is replaced, never followed); read back and verified."""
    path = exclusive_write(record_path(image), render_record(rec), mode=0o644 if mode is None else mode)
    back, why = read_record(image)
    if back is None or back.to_dict() != rec.to_dict():
        raise ShipyardError(f"{path}: the record read back differs from the one written ({why or 'another record'}); "
                            "someone else writes in this storage: stage again and check who can write there")
    return path


def _read_small(path: Path) -> str:
    """The text of ``path``, refused when it is a symlink, not a regular file or larger than :data:`MAX_BYTES`."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    return data.decode("utf-8")


def _no_duplicates(pairs: list) -> dict:
    """A JSON object whose keys are unique: with two, ``json`` keeps the last and the job's ``sed`` the first."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _invalid(data: dict) -> str | None:
    """Why ``data`` is not a record of this schema (None: it is)."""
    for key in ("sha256", "input_hash"):
        v = data.get(key)
        if not isinstance(v, str) or not (_HEX64.fullmatch(v) or (key == "input_hash" and v == "")):
            return f"{key} is not 64 lowercase hex digits"
    for key in identity.SHELL_FIELDS:
        v = data.get(key)
        if type(v) is not int or v < 0:
            return f"{key} is not a non-negative integer"
    for key in ("environment", "cluster", "image", "mode", "staged", "staged_by", "shipyard", "spec_sha256",
                "pushed_digest"):
        v = data.get(key)
        if v is not None and (not isinstance(v, str) or any(c in v for c in "\n\r\0")):
            return f"{key} is not a one-line string"
    src = data.get("source")
    if src is not None and not (isinstance(src, dict) and all(isinstance(k, str) for k in src)
                                and all(isinstance(src.get(k), (str, type(None))) for k in ("kind", "reference"))):
        return "source is not an object with string kind and reference"
    checks = data.get("forced_checks")
    if checks is not None and not (isinstance(checks, list) and all(isinstance(c, str) for c in checks)):
        return "forced_checks is not a list of strings"
    return None


def read_record(image: str | Path) -> tuple[StageRecord | None, str]:
    """(record, "") when the record beside ``image`` is a readable record of this schema; else (None, why not)."""
    rec, _, why = _load(image)
    return rec, why


def _load(image: str | Path) -> tuple[StageRecord | None, str, str]:
    """:func:`read_record`'s (record, why) with the record's text between them."""
    path = record_path(image)
    text = ""
    try:
        text = _read_small(path)
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except FileNotFoundError:
        return None, text, f"{path} does not exist"
    except PermissionError:
        return None, text, f"{path} is not readable"
    except OSError as exc:
        if path.is_symlink():
            return None, text, f"{path} is a symlink, never a stage record (someone else put it there); stage again"
        return None, text, f"{path}: unreadable ({exc.strerror or exc})"
    except (ValueError, RecursionError) as exc:
        return None, text, f"{path}: unreadable ({exc}); stage the image again"
    if not isinstance(data, dict):
        return None, text, f"{path}: not a shipyard stage record (expected a JSON object)"
    schema = data.get("schema")
    if schema != SCHEMA:
        what = "has no schema field (written by an older shipyard)" if schema is None else \
            f"is stage record schema {schema!r}, this shipyard reads schema {SCHEMA}"
        return None, text, f"{path} {what}; stage the image again"
    why = _invalid(data)
    if why:
        return None, text, f"{path}: not a valid stage record ({why}); stage the image again"
    names = {f.name for f in dataclasses.fields(StageRecord)}
    try:
        rec = StageRecord(**{k: v for k, v in data.items() if k in names})
    except TypeError:
        return None, text, f"{path}: not a shipyard stage record (needs {', '.join(SHELL_FIELDS)})"
    return rec, text, ""


def image_changed(image: str | Path, rec: StageRecord) -> str | None:
    """None when ``image`` is still the file its record describes (:mod:`shipyard.identity`'s rule); else why not."""
    image = versions.current(image)
    if identity.changed(image, rec.stamp) is None:
        return None
    try:
        now = identity.stamp(image).describe()
    except OSError as exc:
        return f"{image}: {exc.strerror or exc}"
    return f"{image} changed after it was staged ({now}; the record says {rec.stamp.describe()})"


# The job reads a field of the record with this sed expression (the launcher template's shipyard_field), taking the
# first line that matches: a key on its own line, two spaces in, its value bare or in quotes, a comma or not.
SHELL_FIELD_LINE = r'^  "KEY": "\{0,1\}\([0-9a-f]*\)"\{0,1\},\{0,1\}$'


def shell_field(text: str, key: str) -> str:
    """The value of ``key`` as the job's ``sed`` (:data:`SHELL_FIELD_LINE`) reads it from the record's ``text``;
    "" when no line matches."""
    line_re = re.compile(r'  "%s": "?([0-9a-f]*)"?,?' % re.escape(key))
    for line in text.split("\n"):  # sed's lines: a carriage return stays part of its line
        m = line_re.fullmatch(line)
        if m:
            return m.group(1)
    return ""


def _cache_dir() -> Path | None:
    """The user's own cache of verified images (the job's ``shipyard_cache``): used only when it is a directory of
    this user with mode 0700, not a symlink; else None (verify every time, cache nothing)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "shipyard" / "verified-images"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if not stat_module.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o777 != 0o700:
        return None
    return path


def _cache_key(rec: StageRecord) -> str:
    return f"{rec.sha256} {rec.size} {rec.mtime_ns} {rec.ino} {rec.ctime_ns}"


def content_differs(image: str | Path, rec: StageRecord) -> str | None:
    """None when ``image``'s content hashes to ``rec.sha256``, verified as the job does: once per image file, cached
    by its stamp in the user's own 0700 cache (the same entries the job writes and reads), the hash read through a
    descriptor whose stamp is the record's; else why not, in one line. ``image`` may be stage's pointer to its
    current version (the version file is what is read)."""
    image = versions.current(image)
    cache = _cache_dir()
    entry = cache / rec.sha256 if cache else None
    if entry is not None:
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                cached = os.read(fd, 300).decode("utf-8", "replace") if stat_module.S_ISREG(
                    os.fstat(fd).st_mode) else ""
            finally:
                os.close(fd)
        except OSError:
            cached = ""
        if cached == _cache_key(rec):
            return None
    try:
        fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"{image}: {exc.strerror or exc}"
    try:
        if identity.fstamp(fd) != rec.stamp or not stat_module.S_ISREG(os.fstat(fd).st_mode):
            return f"{image} changed after it was staged (its stamp is not its record's)"
        got = sha256_fd(fd)
    finally:
        os.close(fd)
    if got != rec.sha256:
        return (f"{image} has content sha256 {got}, its record says {rec.sha256} (the file was replaced and its "
                "record rewritten)")
    if entry is not None:
        try:
            exclusive_write(entry, _cache_key(rec), mode=0o600)
        except OSError:
            pass  # a cache that cannot be written only means verifying again next time
    return None


def job_check(image: str | Path, content: bool = True) -> tuple[StageRecord | None, str]:
    """(record, "") when a job would accept the record beside ``image`` and the image itself; else (None, why not).

    The job's rule (the launcher's pre-srun check), whoever asks -- the job, `invoke stage` ("already staged") or
    ``doctor``: the record is a typed record of this schema (:func:`read_record`) that the job's ``sed`` reads the same
    (:func:`shell_field`: a record re-formatted onto one line, with CRLF, other indentation or a duplicate key is not),
    the image still has the record's stamp (:func:`image_changed`) and, with ``content``, its content hashes to the
    record's sha256 (:func:`content_differs`)."""
    rec, text, why = _load(image)
    if rec is None:
        return None, why
    for key in SHELL_FIELDS:
        want = str(getattr(rec, key))
        got = shell_field(text, key)
        if got != want:
            return None, (f"{record_path(image)}: the job reads {key} as {got or 'nothing'}, not {want} (the record "
                          "is not in the one-key-per-line form `invoke stage` writes); stage the image again")
    why = image_changed(image, rec) or (content_differs(image, rec) if content else None)
    return (None, why) if why else (rec, "")


@dataclass(frozen=True)
class Binding:
    """The image a launcher is written for: its sha256 and input hash, and where they were read."""

    sha256: str
    input_hash: str
    source: str  # "stage record <path>" | "build manifest <path>"
    spec_sha256: str | None = None  # the spec the image was built from (None: not recorded)


def binding(root: Path, env_name: str, image: str | None, fmt: str) -> Binding | None:
    """What ``image`` should be: its stage record when this machine can read it (the login node of the cluster),
    else the local build manifest's artifact of that format (the image `invoke stage` would put there); None when
    neither is known (``image`` None: the build manifest only)."""
    rec, _ = read_record(image) if image else (None, "")
    if rec and rec.sha256 and rec.input_hash:
        return Binding(str(rec.sha256), str(rec.input_hash), f"stage record {record_path(image)}",
                       str(rec.spec_sha256) if rec.spec_sha256 else None)
    mpath = project.manifest_path(root, env_name)
    try:
        m = mf.read_manifest(mpath)
    except (ShipyardError, OSError):
        return None
    art = m.artifact(fmt)
    if m.built and art and art.sha256 and m.input_hash:
        return Binding(art.sha256, m.input_hash, f"build manifest {mpath}", m.spec_hash)
    return None
