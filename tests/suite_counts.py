"""How many tests a pytest run selected, written where ``$SHIPYARD_TEST_SELECTED`` says once collection ends.

`invoke test` (tests/suite_runner.py) loads it into each of its pytest runs with ``-p`` and compares the number with
the test cases of the run's JUnit XML: a run whose process ends early with status 0 (a plugin's ``pytest.exit``, a
worker that stopped reporting) ran fewer tests than it selected, and fails instead of counting what it never ran.
JUnit XML holds what ran, not what was selected; this is the one number pytest does not write down itself. Under
pytest-xdist only the controller writes: every worker collects the same selection and the first one says it."""

from __future__ import annotations

import json
import os

import pytest

SELECTED_ENV = "SHIPYARD_TEST_SELECTED"


def _write(count: int) -> None:
    path = os.environ.get(SELECTED_ENV)
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"selected": count}, fh)
    os.replace(tmp, path)


def pytest_collection_finish(session):
    if not hasattr(session.config, "workerinput"):
        _write(len(session.items))


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_xdist_node_collection_finished(node, ids):
    path = os.environ.get(SELECTED_ENV)
    if path and not os.path.exists(path):
        _write(len(ids))
