"""What a test needs is said by its marks, and this plugin holds the tests to it (loaded by tests/conftest.py).

The quick loop (``-m 'not slurm and not docker and not pypi and not slow'``) promises no Slurm daemon, no dockerd
and no network. A mark that is missing would break that promise silently: the ``sandbox`` fixture starts Slurm
whenever a test asks for it, marked or not. So:

* a test that reaches a service fixture (directly or through another fixture) without that service's mark fails at
  set-up, before the service starts, naming the mark to add (:data:`SERVICE_FIXTURES`);
* every test not marked ``pypi`` runs with ``UV_OFFLINE=1``, so a resolution against the package index that slipped
  in unmarked fails instead of quietly using the network.

tests/test_needs.py proves both with pytester.
"""

from __future__ import annotations

import pytest

# fixture -> the mark a test using it must carry. Every docker fixture depends on docker_services, every Slurm one
# on sandbox, and ``item.fixturenames`` is the closure, so naming the root fixture covers them all.
SERVICE_FIXTURES = {"sandbox": "slurm", "docker_services": "docker", "real_pyxis": "real_runtimes",
                    "real_apptainer": "real_apptainer"}
NETWORK_MARK = "pypi"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Refuse a test that uses a service without its mark, before any fixture (so the service) is set up."""
    used = getattr(item, "fixturenames", ())
    missing = [f"{fixture} needs @pytest.mark.{mark}" for fixture, mark in SERVICE_FIXTURES.items()
               if fixture in used and item.get_closest_marker(mark) is None]
    if missing:
        pytest.fail(f"{item.nodeid}: " + "; ".join(missing) + " (the quick loop deselects by these marks)",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _offline_unless_marked_pypi(request, monkeypatch):
    """uv (the lock's resolver) reads UV_OFFLINE: tests not marked ``pypi`` never reach the package index."""
    if request.node.get_closest_marker(NETWORK_MARK) is None:
        monkeypatch.setenv("UV_OFFLINE", "1")

