"""Where a module's tests run within their pytest run: ``pytestmark = pytest.mark.run_order(N)`` (default 0), lower
first, collection order otherwise. The sort is stable, so each module's tests stay together and in their order.

What it is for: the real-runtimes run of `invoke test` is CI's longest, one test after another; a module that takes
what another run makes for it (tests/handoff.py) runs after that run is done."""

from __future__ import annotations


def _order(item) -> int:
    mark = item.get_closest_marker("run_order")
    return mark.args[0] if mark else 0


def pytest_collection_modifyitems(items):
    items.sort(key=_order)
