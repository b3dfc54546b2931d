"""One cached loader for the facts shipped as data files (``shipyard/data/*.yaml``, the schema, package lists).

Versions, timeouts, instance types and compatibility facts live in data with their sources, never as code
defaults; every stage reads them through :func:`load`, parsed once per process with libyaml where PyYAML has it.
A parsed file is also kept beside the package's bytecode (:mod:`shipyard.pycache`), named by its text's sha256:
PyYAML builds compat.yaml's objects in Python, which costs more than a command's own work.
"""

from __future__ import annotations

import functools
import hashlib
import json
import marshal
import sys
from importlib import resources

import yaml

from shipyard import pycache

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster than the pure-Python parser


def text(name: str) -> str:
    """The text of ``shipyard/data/<name>``."""
    return resources.files("shipyard").joinpath("data", name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict:
    """``shipyard/data/<name>.yaml`` (or ``<name>.json`` when the name ends so), parsed once per process.

    Callers must not mutate the result: it is shared.
    """
    if name.endswith(".json"):
        return json.loads(text(name))
    source = text(f"{name}.yaml")
    kept = (f"{name}.{hashlib.sha256(source.encode()).hexdigest()[:32]}.{sys.implementation.cache_tag}"
            f".pyyaml-{yaml.__version__}-{_LOADER.__name__}.marshal")
    parsed = pycache.read_marshal("shipyard", kept)
    if parsed is not None:  # else absent, truncated or foreign: parse the text
        return parsed
    parsed = yaml.load(source, Loader=_LOADER)
    try:
        pycache.write("shipyard", kept, marshal.dumps(parsed))
    except ValueError:  # a value marshal cannot hold (a YAML date): parsed in every process
        pass
    return parsed
