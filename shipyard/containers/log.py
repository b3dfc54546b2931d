"""Build output: stream to the terminal with elapsed time, keep every line in containers/logs/, hide credentials.

A build runs for minutes; the user needs to see that it moves (the elapsed-time prefix is the progress indication)
and, when it fails, to find the whole output again later (the log file, named in the manifest). Registry
credentials may sit in the environment of the process that builds; any value of a credential variable is replaced
by ``***`` before a line reaches the terminal or the log, so a tool that echoes its environment cannot leak it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import IO

# Names of environment variables whose values are secrets (registry passwords and tokens).
_SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|TOKEN|SECRET|_AUTH$|CREDENTIAL)", re.IGNORECASE)


def secret_values(environ: os._Environ | dict | None = None) -> list[str]:
    """Values of credential-like variables in ``environ`` (longest first, so a value containing another is hidden
    whole). Values shorter than 4 characters are left alone: hiding them would mangle ordinary text."""
    environ = os.environ if environ is None else environ
    vals = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= 4}
    return sorted(vals, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    return text


class BuildLog:
    """One build's log: ``write(line)`` sends a redacted line to the terminal (with elapsed time) and to the file."""

    def __init__(self, path: Path, out: IO[str] | None = None, quiet: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.out = out or sys.stdout
        self.quiet = quiet
        self.start = time.monotonic()
        self.secrets = secret_values()
        self._fh = open(self.path, "a", encoding="utf-8", errors="replace")

    def write(self, line: str, echo: bool = True) -> None:
        line = redact(line.rstrip("\n"), self.secrets)
        self._fh.write(line + "\n")
        self._fh.flush()
        if echo and not self.quiet:
            t = int(time.monotonic() - self.start)
            print(f"[{t // 60:02d}:{t % 60:02d}] {line}", file=self.out, flush=True)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> "BuildLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
