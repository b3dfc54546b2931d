"""One cached loader for the facts shipped as data files (``shipyard/data/*.yaml``, the schema, package lists).

Versions, timeouts, instance types and compatibility facts live in data with their sources, never as code
defaults; every stage reads them through :func:`load`, parsed once per process with libyaml where PyYAML has it.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import yaml

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
    return yaml.load(text(f"{name}.yaml"), Loader=_LOADER)
