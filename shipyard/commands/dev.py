"""`invoke test`: install what the tests need and run the whole suite (:mod:`shipyard.dev.testing` does the work).

A command like the others so that `tasks.py` stays flags -> one call; it needs no registry.
"""

from __future__ import annotations

import shlex

from shipyard.dev import testing


def test(pytest_args: str = "", k: str | None = None, install: bool = True) -> int:
    """`invoke test [-k EXPR] [--pytest-args '...'] [--no-install]`: pytest's exit code."""
    args = shlex.split(pytest_args) + (["-k", k] if k else [])
    return testing.run_tests(args, install=install)
