"""One error type for everything a user can get wrong, and the did-you-mean lookup every stage uses.

Tasks catch :class:`ShipyardError` at the invoke boundary (see :func:`shipyard.cli.task_guard`) and print its
one-line message with exit code 2, so bad input never shows a traceback.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable, Mapping


class ShipyardError(Exception):
    """A user-facing failure: a one-line message that names the file, key or flag and what would be valid."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int = 2):
        # One line, always: a key or value that carries a newline is shown escaped.
        message = str(message).replace("\r", "\\r").replace("\n", "\\n")
        super().__init__(message)
        self.exit_code = exit_code


def where(path: str | None, line: int | None) -> str:
    """Format ``file:line`` for messages, tolerating unknown parts."""
    if path and line:
        return f"{path}:{line}"
    return path or "<input>"


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the closest choice, or ``""`` when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'? " if close else ""


def pick(mapping: Mapping[str, Any], name: str | None, what: str, fname: Path | str) -> Any:
    """Look up a named entry with a did-you-mean error (used for environments, clusters and registries)."""
    if not name:
        raise ShipyardError(f"{fname}: no {what} given and no defaults.{what} set")
    if name in mapping:
        return mapping[name]
    raise ShipyardError(f"{fname}: unknown {what} '{name}' ({did_you_mean(name, mapping)}"
                        f"known: {', '.join(mapping) or 'none'})")
