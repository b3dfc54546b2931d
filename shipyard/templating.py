"""One way to load the Jinja2 templates under shipyard/templates/, shared by every renderer.

Every generated artifact is a template file rendered from the model. All renderers want the same safety settings:
an undefined name is an error (StrictUndefined), never an empty string in a script; no HTML autoescaping; the
trailing newline kept, so output is byte-stable. Each renderer adds only its own filters (shell or Lua quoting).
"""

from __future__ import annotations

from typing import Callable, Mapping

import jinja2


def template_environment(folder: str = "", filters: Mapping[str, Callable] | None = None,
                         trim_blocks: bool = False) -> jinja2.Environment:
    """A Jinja2 environment for ``shipyard/templates/<folder>`` with ``filters`` registered.

    Callers cache the result (``functools.lru_cache``); building it parses nothing until a template is asked for.
    """
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("shipyard", f"templates/{folder}" if folder else "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=trim_blocks,
        lstrip_blocks=trim_blocks,
    )
    env.filters.update(filters or {})
    return env
