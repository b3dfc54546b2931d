"""invoke's tasks in the checkout: shipyard's own (shipyard/tasks.py, installed with the package) and `invoke test`,
which runs this checkout's suite (tests/suite_runner.py) and so exists only here, not in `shipyard TASK`."""

import sys
from pathlib import Path

from invoke import Collection

from shipyard import collector

# the invoke program itself (not a test importing this file): shipyard's start is not walked by the cyclic collector
# until the task's command module is loaded (shipyard/collector.py)
collector.hold_in("invoke", "inv")

from shipyard import tasks as shipyard_tasks  # noqa: E402  (after the hold)
from shipyard.taskspec import Spec, make  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent / "tests"))  # the runner and its pytest plugin live there

TEST = Spec(
    "test", "Install what the tests need (Slurm, munge, dockerd, registry, shellcheck, ...) and run the whole suite.",
    {"no_install": (False, "do not apt-get install missing test packages"),
     "k": (None, "only tests matching this pytest -k expression"),
     "pytest_args": ("", "extra pytest arguments, one shell-quoted string (e.g. '-x -q')")},
    # lazy: the runner loads the sandbox's helpers, which no other task needs
    "suite_runner:main", lambda run, f: run(f.pytest_args, f.k, install=not f.no_install))

SPECS = (TEST,)

ns = Collection(*shipyard_tasks.ns.tasks.values(), *shipyard_tasks.ns.collections.values(), make(TEST))
