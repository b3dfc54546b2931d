"""One error type for everything a user can get wrong.

Tasks catch :class:`ShipyardError` at the invoke boundary (see :func:`shipyard.cli.task_guard`) and print its
one-line message with exit code 2, so bad input never shows a traceback.
"""

from __future__ import annotations


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
