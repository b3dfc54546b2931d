"""What is inside a built image, read from the image itself: the contents record of the build manifest.

The lock pins the Python closure, but apt packages and the CUDA libraries of the base image float, and a tag can
move. So after a build shipyard runs one probe inside the finished image (``apptainer exec IMAGE /bin/sh -c PROBE``,
or a container of the docker image) that prints the venv's ``pip list --format=json``, ``dpkg-query -W``, the
CUDA/cuDNN/NCCL libraries found (shipyard/data/build.yaml ``contents``) and, for a SIF, its labels file; a docker
image's labels come from the engine's inspect. :func:`parse_probe` turns that text into a typed :class:`Contents`,
which the manifest keeps (``contents``, and the build before's as ``previous_contents``); ``invoke show ENV
--contents`` prints it and ``invoke diff ENV`` compares two of them (:func:`diff`).

The record is versioned on its own (``"schema"``), so that the manifest can keep a record another shipyard wrote: one
of an unknown version is one error line, never a guess.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Iterable

from shipyard import facts
from shipyard.definitions.layout import VENV
from shipyard.errors import ShipyardError

SCHEMA = 1
SECTIONS = ("python", "apt", "libraries", "labels")
TITLES = {"python": "Python packages", "apt": "apt packages", "libraries": "libraries", "labels": "labels"}
MARK = "@@shipyard-contents"
# the labels Apptainer writes into every SIF (inside the image: /.singularity.d/labels.json)
SIF_LABELS = "/.singularity.d/labels.json"


@dataclass(frozen=True)
class Contents:
    """One image's contents: name -> version per section (libraries: path -> the version in its file name;
    labels: key -> value). ``probed``: how it was read (``apptainer exec`` or ``docker run``)."""

    python: dict[str, str] = field(default_factory=dict)
    apt: dict[str, str] = field(default_factory=dict)
    libraries: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    probed: str | None = None

    def section(self, name: str) -> dict[str, str]:
        return getattr(self, name)

    def to_dict(self) -> dict:
        out: dict = {"schema": SCHEMA, **{s: dict(sorted(self.section(s).items())) for s in SECTIONS}}
        if self.probed:
            out["probed"] = self.probed
        return out

    @classmethod
    def from_dict(cls, data, where: str) -> Contents:
        if not isinstance(data, dict):
            raise ShipyardError(f"{where}: corrupt contents record (expected a JSON object)")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise ShipyardError(f"{where}: contents record schema {schema!r}, this shipyard reads schema {SCHEMA}; "
                                "rebuild with `invoke build ENV --force` (or use the shipyard that wrote it)")
        unknown = sorted(set(data) - set(SECTIONS) - {"schema", "probed"})
        if unknown:
            raise ShipyardError(f"{where}: corrupt contents record (unknown field {unknown[0]!r})")
        sections = {}
        for s in SECTIONS:
            value = data.get(s, {})
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in value.items()):
                raise ShipyardError(f"{where}: corrupt contents record ({s} must map names to version strings)")
            sections[s] = dict(value)
        probed = data.get("probed")
        if probed is not None and not isinstance(probed, str):
            raise ShipyardError(f"{where}: corrupt contents record (probed must be a string)")
        return cls(**sections, probed=probed)


def settings() -> dict:
    """shipyard/data/build.yaml ``contents``: the library names, where to look, the probe's time limit."""
    return facts.load("build")["contents"]


def probe_script() -> str:
    """The POSIX shell script run inside the image: each section after a marker line, the end marked too (a
    probe cut short is refused rather than read as an image with fewer packages). Each marker starts a line of
    its own even after output with no final newline (Apptainer's labels.json has none)."""
    cfg = settings()
    names = " -o ".join(f"-name {shlex.quote(n)}" for n in cfg["libraries"])
    roots = " ".join(shlex.quote(r) for r in cfg["roots"])
    python = f"{VENV}/bin/python"
    return "\n".join([
        f"printf '\\n%s\\n' '{MARK} python'",
        f"if [ -x {python} ]; then {python} -m pip list --format=json --disable-pip-version-check 2>/dev/null "
        "|| echo '[]'; else echo '[]'; fi",
        f"printf '\\n%s\\n' '{MARK} apt'",
        "if command -v dpkg-query > /dev/null 2>&1; then dpkg-query -W 2>/dev/null; fi",
        f"printf '\\n%s\\n' '{MARK} libraries'",
        f"find {roots} -xdev -type f \\( {names} \\) 2>/dev/null",
        f"printf '\\n%s\\n' '{MARK} labels'",
        f"if [ -f {SIF_LABELS} ]; then cat {SIF_LABELS}; fi",
        f"printf '\\n%s\\n' '{MARK} end'",
    ]) + "\n"


# ----------------------------------------------------------------------------------------------- parsers


def parse_pip_list(text: str, where: str = "pip list") -> dict[str, str]:
    """``pip list --format=json`` -> {canonical name: version} (PEP 503 names: ``Jinja2`` and ``jinja2`` are one)."""
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError as exc:
        raise ShipyardError(f"{where}: not pip's JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list):
        raise ShipyardError(f"{where}: not pip's JSON (expected a list of packages)")
    from packaging.utils import canonicalize_name  # lazy: it loads packaging's platform tags, at every launcher's start

    out = {}
    for item in data:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                and isinstance(item.get("version"), str)):
            raise ShipyardError(f"{where}: not pip's JSON (an entry without a name and version: {str(item)[:80]})")
        out[canonicalize_name(item["name"])] = item["version"]
    return out


def parse_dpkg(text: str) -> dict[str, str]:
    """``dpkg-query -W`` (``${binary:Package}\\t${Version}`` per line) -> {package: version}. A package dpkg knows
    but has not installed (only its config files left) has no version and is not in the image's contents."""
    out = {}
    for line in text.splitlines():
        name, _, version = line.partition("\t")
        if name.strip() and version.strip():
            out[name.strip()] = version.strip()
    return out


_SO_VERSION = re.compile(r"\.so\.(.+)$")


def parse_libraries(text: str) -> dict[str, str]:
    """Paths found by the probe -> {path: the version its file name carries after ``.so.``}."""
    out = {}
    for line in text.splitlines():
        path = line.strip()
        m = _SO_VERSION.search(path.rsplit("/", 1)[-1])
        if path.startswith("/") and m:
            out[path] = m.group(1)
    return out


def parse_labels(text: str, where: str = "labels") -> dict[str, str]:
    """A labels JSON object (Apptainer's labels.json, or a docker image's Config.Labels) -> {key: value}."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShipyardError(f"{where}: not a JSON object of labels ({exc.msg})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ShipyardError(f"{where}: not a JSON object of labels")
    return {str(k): str(v) for k, v in data.items()}


def parse_probe(text: str, probed: str, labels: dict[str, str] | None = None) -> Contents:
    """The probe's whole output -> :class:`Contents`. ``labels`` given (docker: from the engine) replace the
    labels section. Output without every section and the end marker is refused (the probe did not finish)."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(MARK + " "):
            current = line[len(MARK) + 1:].strip()
            parts[current] = []
        elif current is not None:
            parts[current].append(line)
    missing = [s for s in (*SECTIONS, "end") if s not in parts]
    if missing:
        raise ShipyardError(f"contents probe ({probed}): its output has no {missing[0]} section; the probe did not "
                            "finish in the image")
    body = {s: "\n".join(parts[s]) for s in SECTIONS}
    return Contents(
        python=parse_pip_list(body["python"], f"contents probe ({probed}): pip list"),
        apt=parse_dpkg(body["apt"]),
        libraries=parse_libraries(body["libraries"]),
        labels=labels if labels is not None else parse_labels(body["labels"], f"contents probe ({probed}): {SIF_LABELS}"),
        probed=probed,
    )


# ----------------------------------------------------------------------------------------------- text


def _rows(items: Iterable[tuple[str, str]], indent: str = "  ") -> list[str]:
    items = list(items)
    width = max((len(k) for k, _ in items), default=0)
    return [f"{indent}{k.ljust(width)}  {v}".rstrip() for k, v in items]


def render(contents: Contents, title: str) -> str:
    """The record as text, one section after another, each sorted by name (`invoke show ENV --contents`)."""
    lines = [title + (f" (read with {contents.probed})" if contents.probed else "")]
    for s in SECTIONS:
        entries = contents.section(s)
        lines.append(f"{TITLES[s]} ({len(entries)}):")
        lines += _rows(sorted(entries.items())) or ["  (none)"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Change:
    """One difference between two records: ``old`` None = added, ``new`` None = removed."""

    section: str
    name: str
    old: str | None
    new: str | None


def diff(old: Contents, new: Contents) -> list[Change]:
    """Every name whose version differs between ``old`` and ``new``, section by section, sorted by name."""
    out = []
    for s in SECTIONS:
        a, b = old.section(s), new.section(s)
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                out.append(Change(s, name, a.get(name), b.get(name)))
    return out


def render_diff(changes: list[Change], old_title: str, new_title: str) -> str:
    """`invoke diff`'s text: per section a count line, then ``~ name old -> new``, ``+ name new``, ``- name old``."""
    lines = [f"from {old_title}", f"to   {new_title}"]
    for s in SECTIONS:
        mine = [c for c in changes if c.section == s]
        changed = sum(1 for c in mine if c.old is not None and c.new is not None)
        added = sum(1 for c in mine if c.old is None)
        removed = sum(1 for c in mine if c.new is None)
        if not mine:
            lines.append(f"{TITLES[s]}: no change")
            continue
        lines.append(f"{TITLES[s]}: {changed} changed, {added} added, {removed} removed")
        rows = []
        for c in mine:
            if c.old is None:
                rows.append((f"+ {c.name}", c.new or ""))
            elif c.new is None:
                rows.append((f"- {c.name}", c.old))
            else:
                rows.append((f"~ {c.name}", f"{c.old} -> {c.new}"))
        lines += _rows(rows)
    return "\n".join(lines) + "\n"
