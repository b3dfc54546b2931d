"""invoke's tasks in the checkout: shipyard's own (shipyard/tasks.py, installed with the package) and `invoke test`,
which runs this checkout's suite (tests/suite_runner.py) and so exists only here, not in `shipyard TASK`."""

import sys
from pathlib import Path

from invoke import Collection, task

from shipyard import tasks as shipyard_tasks
from shipyard.cli import task_guard

sys.path.append(str(Path(__file__).resolve().parent / "tests"))  # the runner and its pytest plugin live there


@task(
    name="test",
    help={
        "no_install": "do not apt-get install missing test packages",
        "k": "only tests matching this pytest -k expression",
        "pytest_args": "extra pytest arguments, one shell-quoted string (e.g. '-x -q')",
    },
)
@task_guard
def test_(c, no_install=False, k=None, pytest_args=""):
    """Install what the tests need (Slurm, munge, dockerd, registry, shellcheck, ...) and run the whole suite."""
    import suite_runner  # lazy: the runner loads the sandbox's helpers, which no other task needs

    raise SystemExit(suite_runner.main(pytest_args, k, install=not no_install))


ns = Collection(*shipyard_tasks.ns.tasks.values(), *shipyard_tasks.ns.collections.values(), test_)
