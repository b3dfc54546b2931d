"""Fixtures of the definitions tests only."""

from __future__ import annotations

import pytest


@pytest.fixture
def lock_project(make_project):
    """``lock_project(text=None) -> Registry``: the ``lock`` preset (or ``text``), one project dir per test, so a
    second call edits the registry beside the first call's locks."""
    return lambda text=None: make_project(text or "lock", use=False)
