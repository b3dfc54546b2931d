"""The base image's digest as the lock records it, and the reference the definitions bootstrap from.

Why in the lock: a tag (``nvidia/cuda:12.1.1-runtime-ubuntu22.04``) moves when its publisher rebuilds it, so the same
definition pulls other bytes next month. ``invoke lock ENV`` resolves the tag once (through base_mirror, or the
registry the reference names: shipyard/containers/base_digest.py) and writes the digest into the lock's header,
beside the Python closure's hashes; the definitions then bootstrap from ``TAG@sha256:...`` (Docker and Apptainer's
docker bootstrap pull by the digest and keep the tag for the reader). A hand-edited digest changes the rendered
files, so ``render --check`` names them stale; ``invoke lock ENV --update-base`` moves the pin on purpose.

Where no registry answered, the lock says the base is unpinned and why, the definitions keep the tag, and
``invoke check`` warns. A lock of format 1 (no ``lock-format`` line, no base lines) reads the same
as an unpinned one.

The header lines (``# key: value``, read by :func:`shipyard.definitions.pylock.read_header`)::

    # lock-format: 2
    # base: REFERENCE                     what registry.yaml names (environments.ENV.base)
    # base-digest: sha256:<64 hex>        or: unpinned
    # base-source: base_mirror HOST ...   where it was resolved (for the reader)
    # base-unpinned: WHY                  only when unpinned
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from shipyard.errors import ShipyardError

FORMAT = 2  # the lock header's format: 2 adds the base lines; 1 (no lock-format line) has none
UNPINNED = "unpinned"
DIGEST = re.compile(r"\Asha256:[0-9a-f]{64}\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


@dataclass(frozen=True)
class BasePin:
    """The base image of one lock: ``digest`` None means pinned by tag only, ``why`` says why."""

    reference: str
    digest: str | None
    source: str
    why: str | None = None

    def __post_init__(self):
        if self.digest is not None and not DIGEST.match(self.digest):
            raise ShipyardError(f"base {self.reference}: digest {self.digest!r} is not sha256:<64 hex digits>")

    def lines(self) -> list[str]:
        """The header lines (one line each: no value carries a line break or a control character)."""
        out = [f"# base: {one_line(self.reference)}",
               f"# base-digest: {self.digest or UNPINNED}",
               f"# base-source: {one_line(self.source)}"]
        if self.digest is None:
            out.append(f"# base-unpinned: {one_line(self.why or 'no registry answered')}")
        return out


def one_line(text: str, limit: int = 200) -> str:
    """``text`` as one header line: control characters (line breaks among them) as one space, at most ``limit``."""
    return _CONTROL.sub(" ", text).strip()[:limit]


def embedded_digest(reference: str) -> str | None:
    """The digest a reference already names (``NAME[:TAG]@sha256:...``), else None."""
    _, at, digest = reference.partition("@")
    return digest if at and DIGEST.match(digest) else None


def from_header(header: dict[str, str], lock: Path) -> BasePin | None:
    """The pin a lock's header records; None when it records none (format 1, or an environment without a base).
    A digest that is neither ``unpinned`` nor ``sha256:<64 hex>`` is refused, naming the lock: it would reach the
    definitions' ``From:`` line."""
    if "base" not in header:
        return None
    raw = header.get("base-digest", UNPINNED)
    if raw != UNPINNED and not DIGEST.match(raw):
        raise ShipyardError(f"{lock}: header base-digest {raw!r} is neither sha256:<64 hex digits> nor {UNPINNED}; "
                            "run `invoke lock ENV --update-base` to record it again")
    return BasePin(header["base"], None if raw == UNPINNED else raw, header.get("base-source", ""),
                   header.get("base-unpinned") if raw == UNPINNED else None)


def lock_format(header: dict[str, str], lock: Path) -> int:
    """The header's format (1 when it has no ``lock-format`` line); a format this shipyard does not know is
    refused."""
    raw = header.get("lock-format", "1")
    if not raw.isdigit() or not 1 <= int(raw) <= FORMAT:
        raise ShipyardError(f"{lock}: lock-format {raw!r} is not one this shipyard reads (1 to {FORMAT}); "
                            "re-lock with `invoke lock ENV` or use a newer shipyard")
    return int(raw)


def pinned(reference: str, pin: BasePin | None, base: str) -> str:
    """``reference`` (the one the definitions pull: the mirror's copy, or registry.yaml's own) with the digest
    ``pin`` records for registry.yaml's ``base``: ``REF@sha256:...``. Unchanged when the lock records no digest,
    records it for another base (stale: :func:`shipyard.definitions.pylock.stale_reason` says so), or the
    reference names a digest of its own."""
    if pin is None or pin.digest is None or pin.reference != base or embedded_digest(reference):
        return reference
    return f"{reference}@{pin.digest}"
