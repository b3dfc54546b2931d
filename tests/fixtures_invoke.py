"""The one way tests run shipyard's real command line: ``sys.executable -m invoke -r <project root> ARGS``.

The CLI is tested as a user runs it, in a child process (invoke's own parsing, the task guard's exit codes, what
reaches stdout and stderr). ``-r`` names this checkout's tasks.py, so the working directory is free to be a test's
throw-away project; by default it is the project root, as for a user in a checkout.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Sequence

import pytest

ROOT = Path(__file__).resolve().parent.parent


class InvokeCLI:
    """Runs ``python -m invoke -r ROOT ARGS``; the fixture ``invoke`` is one of these.

    ``env`` and ``cwd`` mean what they mean to :mod:`subprocess` (``env`` is the child's whole environment, None
    inherits this process's), except that ``cwd`` defaults to the project root.
    """

    def __init__(self, root: Path = ROOT):
        self.root = Path(root)

    def argv(self, *args: str) -> list[str]:
        """The argv, for tests that start the process themselves (a shell line, a process they signal)."""
        return [sys.executable, "-m", "invoke", "-r", str(self.root), *map(str, args)]

    def __call__(self, *args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 timeout: float | None = 300, input: str | None = None) -> subprocess.CompletedProcess:
        """Run to completion; text output captured. The timeout turns a hang into a failure instead of a stuck run."""
        return subprocess.run(self.argv(*args), cwd=cwd or self.root, env=None if env is None else dict(env),
                              capture_output=True, text=True, timeout=timeout, input=input)

    def popen(self, *args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
              **kwargs) -> subprocess.Popen:
        """Start without waiting (builds racing for a lock, a process to interrupt); ``kwargs`` go to Popen."""
        return subprocess.Popen(self.argv(*args), cwd=cwd or self.root, env=None if env is None else dict(env),
                                **kwargs)

    def run_all(self, argvs: Sequence[Sequence[str]], workers: int = 2, **kwargs) -> list[subprocess.CompletedProcess]:
        """Run many short commands, at most ``workers`` at a time (the tests share two cores), results in order."""
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda a: self(*a, **kwargs), argvs))


# for module-level helpers of test files (they cannot take fixtures); the fixture is this same object
invoke_cli = InvokeCLI()


@pytest.fixture(scope="session")
def invoke() -> InvokeCLI:
    """``invoke(*args, env=None, cwd=None, timeout=300, input=None) -> CompletedProcess`` for the real CLI."""
    return invoke_cli


def task_program():
    """invoke's Program over this checkout's tasks, for a run inside the test process: a copy of the collection, as
    `invoke -r` loads one. invoke consumes a task's help texts while it builds its parser (``Task.arg_opts`` pops
    them), so a run on tasks.py's own ``ns`` would leave its tasks without help for every later in-process run."""
    from invoke import Collection, Program

    import tasks

    return Program(namespace=Collection.from_module(tasks))
