"""The build manifest ``containers/<env>.json``: what an image is, what made it, and where it went.

One reader (:func:`read_manifest`) and one writer (:func:`update_manifest`), both typed: every stage that reads the
manifest (build, sign, push, pull, stage, the launcher binding, doctor) gets a :class:`Manifest`, never a raw dict,
so a field is spelled once, here.

Versioned: the writer stamps ``"schema": SCHEMA``. A file without the field is read as version 1, the layout shipyard
wrote before the field existed (the same keys); version 2 added the contents records (``contents``,
``previous_contents``: :mod:`shipyard.containers.contents`), so a version 1 file reads as a manifest with none. A file
of another version is one error line that says which versions this shipyard reads (a newer shipyard wrote it, or it
was edited by hand).

Several writers touch one manifest (build, sign, push), sometimes from different processes. Every change is
therefore a read-modify-write under an exclusive ``fcntl`` lock on a sidecar file, finished with an atomic rename
(``shipyard.files.atomic_write``): a reader never sees a half-written manifest, and two writers never lose each other's
fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from shipyard import identity
from shipyard.containers.contents import Contents
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, read_capped_text, sha256_file

SCHEMA = 2
READS = (1, 2)  # the schemas a manifest may have: 1 is 2 without the contents records


@dataclass(frozen=True)
class Artifact:
    """One image file of a build: where it is (relative to the project), its sha256, and its identity stamp."""

    path: str
    sha256: str
    size: int
    mtime_ns: int
    ino: int | None = None  # None: recorded before the identity rule had inode and ctime (re-hashed once)
    ctime_ns: int | None = None

    @classmethod
    def of(cls, root: Path, path: Path) -> Artifact:
        """Record ``path`` as it is now (hashes the file)."""
        st = identity.stamp(path)
        return cls(str(path.relative_to(root)), sha256_file(path), st.size, st.mtime_ns, st.ino, st.ctime_ns)

    @property
    def stamp(self) -> identity.Stamp:
        return identity.Stamp(self.size, self.mtime_ns, self.ino, self.ctime_ns)

    def intact(self, root: Path) -> bool:
        """The file is still the one recorded, by :mod:`shipyard.identity`'s rule (a stat, no read)."""
        return identity.changed(Path(root) / self.path, self.stamp) is None


@dataclass(frozen=True)
class Pushed:
    """What the manifest remembers of a push, as pull and stage read it: the reference, its manifest digest, and
    the input hash of the image that was pushed."""

    reference: str  # oras://HOST/REPO:TAG or docker://HOST/REPO:TAG
    digest: str | None
    input_hash: str | None

    @property
    def tag(self) -> str:
        return self.reference.rsplit(":", 1)[1]

    def digest_for(self, tag: str) -> str | None:
        """The digest to expect when pulling ``tag``: known only when it is the tag that was pushed."""
        return self.digest if self.reference.endswith(f":{tag}") else None


@dataclass(frozen=True)
class Manifest:
    """A build manifest. Every field is optional: a manifest grows as build, sign, push and pull add to it; ``None``
    means "not recorded" (and is not written). Nested records the manifest only carries (the docker image, the
    signature, pushes and pulls) stay mappings, owned by the module that writes them."""

    environment: str | None = None
    status: str | None = None  # building | ok | failed | pulled
    error: str | None = None
    input_hash: str | None = None
    spec_hash: str | None = None
    backend: str | None = None
    tools: dict | None = None  # tool -> version string
    tool_ids: dict | None = None  # tool -> "realpath:size:mtime_ns" (the version cache's key)
    formats: list | None = None
    pins: dict | None = None
    host: str | None = None
    pid: int | None = None
    started: str | None = None
    finished: str | None = None
    log: str | None = None
    forced_checks: list | None = None
    base: dict | None = None  # {"reference": what registry.yaml names, "mirrored": what was pulled} (base_mirror)
    artifacts: dict[str, Artifact] | None = None  # format (sif, sqsh) -> artifact
    image: dict | None = None  # docker backend: {"tag", "id"}
    signature: dict | None = None  # shipyard.containers.sign
    verification: dict | None = None  # shipyard.containers.sign
    pushed: dict | None = None  # registry name -> push record (shipyard.containers.push)
    pulled: dict | None = None  # registry name -> pull record
    contents: dict | None = None  # what the image holds, read from it after the build (Contents.to_dict())
    previous_contents: dict | None = None  # the same record of the build before this one

    def artifact(self, fmt: str) -> Artifact | None:
        return (self.artifacts or {}).get(fmt)

    @property
    def built(self) -> bool:
        """The last build finished (``status: ok``)."""
        return self.status == "ok"

    def pushed_to(self, registry_name: str) -> Pushed | None:
        """The last push to ``registry_name``, when one is recorded."""
        rec = (self.pushed or {}).get(registry_name)
        return Pushed(rec["reference"], rec.get("digest"), rec.get("input_hash")) if rec else None

    @property
    def pushed_digests(self) -> list[str]:
        """Every digest this image was pushed under, sorted, once each."""
        return sorted({p["digest"] for p in (self.pushed or {}).values() if p.get("digest")})

    @property
    def docker_tag(self) -> str | None:
        """The docker-backend image's tag (None: no docker image was built)."""
        return (self.image or {}).get("tag")

    @property
    def docker_id(self) -> str | None:
        return (self.image or {}).get("id")

    @property
    def signed_sha256(self) -> str | None:
        """The sha256 the SIF had after the latest `invoke sign` (None: never signed)."""
        return (self.signature or {}).get("image_sha256")

    @property
    def signers(self) -> list[dict]:
        """One entry per `invoke sign` of the current image, oldest first, each with the key's ``fingerprint``
        ([]: never signed). A signature recorded as one signer's fields at the top level reads as that one signer."""
        sig = self.signature or {}
        if "signers" in sig:
            return list(sig["signers"])
        return [{k: v for k, v in sig.items() if k != "image_sha256"}] if sig.get("fingerprint") else []

    @property
    def contents_record(self) -> Contents | None:
        """The contents of the current image (None: built by a shipyard that did not record them, or not built)."""
        return None if self.contents is None else Contents.from_dict(self.contents, "build manifest contents")

    @property
    def previous_contents_record(self) -> Contents | None:
        """The contents of the build before the current one (None: no earlier build recorded them)."""
        return (None if self.previous_contents is None
                else Contents.from_dict(self.previous_contents, "build manifest previous_contents"))

    def to_dict(self) -> dict:
        out: dict = {"schema": SCHEMA}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "artifacts":
                value = {fmt: dataclasses.asdict(a) for fmt, a in value.items()}
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict, where: str) -> Manifest:
        schema = data.get("schema", 1)
        if schema not in READS:
            raise ShipyardError(f"{where}: build manifest schema {schema!r}, this shipyard reads schemas "
                                f"{', '.join(map(str, READS))}; "
                                "rebuild with `invoke build ENV --force` (or use the shipyard that wrote it)")
        names = {f.name for f in dataclasses.fields(cls)}
        known = names - {"contents", "previous_contents"} if schema == 1 else names
        unknown = sorted(set(data) - known - {"schema"})
        if unknown:
            raise ShipyardError(f"{where}: not a shipyard build manifest of schema {schema} (unknown field "
                                f"{unknown[0]!r}); delete it and rebuild with `invoke build ENV --force`")
        fields = {k: v for k, v in data.items() if k in names}
        why = _untyped(fields)
        if why:
            raise ShipyardError(f"{where}: corrupt build manifest ({why}); delete it and rebuild with "
                                "`invoke build ENV --force`")
        for key in ("contents", "previous_contents"):
            if fields.get(key) is not None:
                Contents.from_dict(fields[key], f"{where} ({key})")  # refused here, not when a command reads it
        try:
            if fields.get("artifacts") is not None:
                fields["artifacts"] = {fmt: _artifact(a) for fmt, a in fields["artifacts"].items()}
        except (TypeError, AttributeError, ValueError) as exc:
            why = f": {exc}" if isinstance(exc, ValueError) else ""
            raise ShipyardError(f"{where}: corrupt build manifest (artifacts need path, sha256, size, mtime_ns"
                                f"{why}); delete it and rebuild with `invoke build ENV --force`") from None
        return cls(**fields)


_HEX64 = re.compile(r"[0-9a-f]{64}")
_STRINGS = ("environment", "status", "error", "spec_hash", "backend", "host", "started", "finished", "log")
_MAPPINGS = ("tools", "tool_ids", "pins", "base", "artifacts", "image", "signature", "verification", "pushed",
             "pulled")
_LISTS = ("formats", "forced_checks")
# what a push record's reference looks like: the scheme, a repository and a tag (its tag is what `pull` asks for)
_REFERENCE = re.compile(r"(oras|docker)://[^\s:/]+(:[0-9]+)?/[^\s:]+:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def is_input_hash(value: object) -> bool:
    """An input hash as a build computes it (:func:`shipyard.containers.engine.input_hash`): 64 lowercase hex."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def _untyped(fields: dict) -> str | None:
    """Why a manifest's top-level fields are not of their types (None: they are). Checked on read, so that a
    wrong type is one line here, not a traceback where a field is used (a tag cut from the input hash, a push
    record's reference split at its colon)."""
    for key in _STRINGS:
        if fields.get(key) is not None and not isinstance(fields[key], str):
            return f"{key} is not a string"
    for key in _MAPPINGS:
        if fields.get(key) is not None and not isinstance(fields[key], dict):
            return f"{key} is not a mapping"
    for key in _LISTS:
        if fields.get(key) is not None and not isinstance(fields[key], list):
            return f"{key} is not a list"
    if fields.get("pid") is not None and type(fields["pid"]) is not int:
        return "pid is not a whole number"
    if fields.get("input_hash") is not None and not is_input_hash(fields["input_hash"]):
        return "input_hash is not 64 lowercase hex digits"
    sig = fields.get("signature") or {}
    if "signers" in sig and not (isinstance(sig["signers"], list) and all(isinstance(x, dict) for x in sig["signers"])):
        return "signature.signers is not a list of mappings"
    for key in ("image_sha256", "fingerprint"):
        if sig.get(key) is not None and not isinstance(sig[key], str):
            return f"signature.{key} is not a string"
    for key in ("tag", "id"):
        if (fields.get("image") or {}).get(key) is not None and not isinstance(fields["image"][key], str):
            return f"image.{key} is not a string"
    for name, rec in (fields.get("pushed") or {}).items():
        if not isinstance(rec, dict):
            return f"pushed.{name} is not a mapping"
        if not isinstance(rec.get("reference"), str) or not _REFERENCE.fullmatch(rec["reference"]):
            return f"pushed.{name}.reference is not an oras:// or docker:// reference with a tag"
        if rec.get("digest") is not None and not (isinstance(rec["digest"], str)
                                                  and re.fullmatch(r"sha256:[0-9a-f]{64}", rec["digest"])):
            return f"pushed.{name}.digest is not sha256:<64 hex digits>"
        if rec.get("input_hash") is not None and not is_input_hash(rec["input_hash"]):
            return f"pushed.{name}.input_hash is not 64 lowercase hex digits"
    return None


def _artifact(a: dict) -> Artifact:
    """One ``artifacts`` entry, its field types checked (a string size or a list path would end in a traceback
    far from here: in the stamp comparison or a path join)."""
    art = Artifact(**a)
    if not isinstance(art.path, str) or not art.path or "\0" in art.path:
        raise ValueError(f"path {art.path!r} is not a relative path")
    if not isinstance(art.sha256, str) or not _HEX64.fullmatch(art.sha256):
        raise ValueError(f"sha256 {art.sha256!r} is not 64 lowercase hex digits")
    for key in ("size", "mtime_ns", "ino", "ctime_ns"):
        v = getattr(art, key)
        if not (v is None and key in ("ino", "ctime_ns")) and (type(v) is not int or v < 0):
            raise ValueError(f"{key} {v!r} is not a whole number")
    return art


def read_manifest(path: str | os.PathLike) -> Manifest:
    """The manifest at ``path``; an empty one when it does not exist yet. A corrupt manifest is a one-line error."""
    path = Path(path)
    try:
        text = read_capped_text(path, "manifest", "a build manifest")
    except FileNotFoundError:
        return Manifest()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShipyardError(f"{path}: corrupt build manifest ({exc.msg} at line {exc.lineno}); "
                            "delete it and rebuild with `invoke build ENV --force`") from None
    if not isinstance(data, dict):
        raise ShipyardError(f"{path}: corrupt build manifest (expected a JSON object)")
    return Manifest.from_dict(data, str(path))


@contextlib.contextmanager
def _merge_lock(path: Path) -> Iterator[None]:
    """Exclusive lock for one read-modify-write of ``path`` (a sidecar ``.lock`` file: the manifest itself is
    replaced by rename, so it cannot carry the lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def render(m: Manifest | dict) -> str:
    """Canonical text of a manifest: sorted keys, stable indentation, trailing newline (diff- and golden-friendly)."""
    data = m.to_dict() if isinstance(m, Manifest) else m
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def update_manifest(path: str | os.PathLike, **fields) -> Manifest:
    """Set ``fields`` (names of :class:`Manifest` fields) in the manifest at ``path`` atomically; return the result.

    A field set to ``None`` is removed. Top-level merge only: a caller that owns a nested mapping (``signature``,
    ``pushed``) passes the whole mapping.
    """
    path = Path(path)
    with _merge_lock(path):
        m = dataclasses.replace(read_manifest(path), **fields)
        atomic_write(path, render(m))
    return m
