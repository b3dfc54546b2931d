"""`invoke compat.refresh`: shipyard's compatibility facts (shipyard/data/compat.yaml) compared with what PyPI's
metadata says now, read with uv (:mod:`shipyard.registry.refresh`); the file is written only when asked.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO

import yaml

from shipyard.errors import ShipyardError
from shipyard.files import atomic_write
from shipyard.registry import compat, refresh


def compat_refresh(torch: str | None = None, write: bool = False, companions: bool = True, path: Path | None = None,
                   out: IO[str] | None = None) -> int:
    """`invoke compat.refresh`: print the diff between compat.yaml and what the metadata says; write it only with
    ``write``; 1 when it differs and was not written.

    No :class:`Context`: the facts it refreshes ship with shipyard, so it runs without a registry.yaml.
    """
    out = out or sys.stdout
    path = path or refresh.COMPAT_PATH
    text = path.read_text(encoding="utf-8")
    committed = yaml.safe_load(text)  # the committed file as it is on disk (facts.load caches the package copy)
    patches = [p.strip() for p in torch.split(",")] if torch else compat.known_torch_versions()
    uv = refresh.Uv.default()
    print(f"compat refresh: reading PyPI metadata of {len(patches)} torch release(s) with uv "
          f"({uv.platform}; files uploaded before {refresh.cutoff()}, compat.yaml review.date)", file=out)
    derived = refresh.derive(patches, uv, companions=companions)
    coverage = refresh.variant_coverage(uv, patches, derived)
    if not torch:  # the release lists are about the data as a whole, not about the torch releases asked for
        refresh.derive_releases(uv, committed, derived)
    new = refresh.refreshed_text(text, derived, committed)
    for note in derived.notes + coverage:
        print(f"note: {note}", file=out)
    if not derived.wheels:
        raise ShipyardError(f"compat refresh: the index listed no wheel of the {len(patches)} torch release(s) asked "
                            f"for ({uv.platform}): nothing was compared and {path.name} is unchanged; check the "
                            "network and the index uv reads (UV_DEFAULT_INDEX, UV_INDEX_URL, UV_OFFLINE)")
    read = f"{len(derived.wheels)} of {len(patches)} release(s) read" if len(derived.wheels) < len(patches) \
        else f"{len(patches)} release(s) read"
    d = refresh.diff(text, new)
    if not d:
        print(f"compat refresh: {path.name} agrees with the metadata ({read}, {uv.runs} uv runs)", file=out)
        return 0
    print(d, end="", file=out)
    if not write:
        print(f"compat refresh: {path.name} NOT written; review the diff above, then rerun with --write", file=out)
        return 1
    atomic_write(path, new)
    print(f"compat refresh: wrote {path}", file=out)
    return 0
