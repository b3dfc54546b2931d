"""Fixtures of the definitions tests only."""

from __future__ import annotations

import pytest

from shipyard.containers import base_digest


@pytest.fixture
def lock_project(make_project):
    """``lock_project(text=None) -> Registry``: the ``lock`` preset (or ``text``), one project dir per test, so a
    second call edits the registry beside the first call's locks."""
    return lambda text=None: make_project(text or "lock", use=False)


@pytest.fixture(autouse=True)
def base_lookup_offline(request, monkeypatch):
    """A test not marked ``pypi`` has no network (tests/needs.py runs uv offline for it): the base image's tag lookup
    of `invoke lock` gets no answer at once, as from a registry out of reach, so the lock records the base unpinned
    without waiting out retries, and never asks a public registry. tests/containers/test_base_digest.py looks bases
    up in a registry of its own."""
    if request.node.get_closest_marker("pypi"):
        return

    def out_of_reach(src):
        raise base_digest._NoAnswer(f"no answer from {src.words} (the test runs offline)")

    monkeypatch.setattr(base_digest, "_lookup", out_of_reach)
