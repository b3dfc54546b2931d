"""Helpers shared by every invoke task: the error boundary and optional positional arguments.

Kept here so that ``tasks.py`` stays a thin layer of flags -> package calls.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable, Sequence

from invoke.parser.parser import ParseMachine

from shipyard.errors import ShipyardError


def task_guard(fn: Callable) -> Callable:
    """Turn a :class:`ShipyardError` into one line on stderr and its exit code (2 by default), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ShipyardError as exc:
            print(f"shipyard: error: {exc}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        except KeyboardInterrupt:
            print("shipyard: interrupted", file=sys.stderr)
            raise SystemExit(130) from None

    return wrapper


OPTIONAL_POSITIONALS = {"env", "environment"}


def allow_optional_positionals(names=OPTIONAL_POSITIONALS) -> None:
    """Let `invoke build pytorch-2.3` and `invoke launch --nodes 2` share one task signature.

    invoke treats every positional argument as required. Tasks here declare ``positional=["env"]`` with a None
    default; this hook fills a missing one with "" just before invoke checks for missing positionals, and the task
    treats "" as "use defaults.environment". Called once from tasks.py, before any parsing happens.
    """
    if getattr(ParseMachine, "_shipyard_optional", False):
        return
    original = ParseMachine.complete_context

    def complete_context(self):
        if self.context:
            for arg in self.context.positional_args:
                if arg.value is None and arg.name in names:
                    arg.value = ""
        return original(self)

    ParseMachine.complete_context = complete_context
    ParseMachine._shipyard_optional = True


def argv_after_dashdash(argv: Sequence[str]) -> tuple[str, ...]:
    """The words after the first standalone ``--`` in ``sys.argv``, exactly as the shell passed them.

    invoke hands a task its ``--`` remainder as one string joined with spaces, which loses quoting
    (``"a b"`` becomes two words); the training command must reach the script's argv unchanged, so it is read here.
    """
    argv = list(argv)
    return tuple(argv[argv.index("--") + 1:]) if "--" in argv else ()
