"""How many tests a pytest run selected and how many it ran, written where ``$SHIPYARD_TEST_COUNTS`` says when the
session ends (`invoke test` loads it into each of its pytest runs with ``-p`` and reads the file). A run whose process ends early with status 0 (a plugin's ``pytest.exit``,
a worker that stopped reporting) ran fewer tests than it selected: `invoke test` fails it instead of counting what it
never ran. Under pytest-xdist only the controller writes: workers' reports reach it through the same hook."""

from __future__ import annotations

import json
import os

import pytest

from shipyard.dev.testing import COUNTS_ENV
_selected: list[int] = []
_ran: set[str] = set()


def pytest_collection_finish(session):
    if not hasattr(session.config, "workerinput"):
        _selected.append(len(session.items))


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_xdist_node_collection_finished(node, ids):
    """The controller's count under xdist: every worker collects the same selection; the first one says it."""
    if not _selected:
        _selected.append(len(ids))


def pytest_runtest_logreport(report):
    _ran.add(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(COUNTS_ENV)
    if not path or hasattr(session.config, "workerinput"):
        return
    selected = _selected[-1] if _selected else 0
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"selected": selected, "ran": len(_ran), "exitstatus": int(exitstatus)}, fh)
    os.replace(tmp, path)
