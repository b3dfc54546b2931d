"""Fixtures of the launch tests only, each one line over make_project (tests/fixtures_projects.py)."""

from __future__ import annotations

import pytest
from fixtures_launch import FAKE_ROOT, LAUNCH_REGISTRY, PROBE


@pytest.fixture
def launch_registry():
    """The ``launch`` registry rooted at a fixed fake project path (goldens hold absolute paths); no files."""
    from shipyard import registry

    return registry.load_text(LAUNCH_REGISTRY, "registry.yaml", path=FAKE_ROOT / "registry.yaml")


@pytest.fixture
def launch_project(make_project):
    """The ``launch`` preset in use; returns the project directory."""
    return make_project("launch", name=".").root


@pytest.fixture
def tools_registry(make_project):
    """The ``tools`` preset (login hosts, hostile storage), not in use."""
    return make_project("tools", use=False)


@pytest.fixture
def sandbox_project(sandbox, make_project, monkeypatch):
    """This checkout's registry.yaml (its `sandbox` cluster) in use, with the probe job, talking to the sandbox."""
    root = make_project("repo", name=".").root
    (root / "probe.py").write_text(PROBE)
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    return root
