"""The one registry factory: ``make_project(registry)`` writes a throw-away project (a temp dir holding
registry.yaml) and returns its loaded :class:`Registry`. Every test project comes from here.

``registry`` is a preset name from :data:`PRESETS` or registry text. By default the project is *in use* as a user's
would be: the current directory and ``$SHIPYARD_REGISTRY`` point at it. Calls in one test share one directory
(``name``), so a second call rewrites the registry beside what the first one left (locks, manifests): the way a
user edits registry.yaml. The named project fixtures (``project``, ``launch_project``, ...) are one line over this
factory, kept only so the test files that use them did not all change at once.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _repo() -> str:
    return (ROOT / "registry.yaml").read_text()


def _course() -> str:
    return (ROOT / "examples" / "course" / "registry.yaml").read_text()


def _build() -> str:
    from fixtures_build import PROJECT_REGISTRY

    return PROJECT_REGISTRY.format(registry="127.0.0.1:9")  # registries point at a closed port


def _launch() -> str:
    from fixtures_launch import LAUNCH_REGISTRY

    return LAUNCH_REGISTRY


def _lock() -> str:
    from fixtures_lock import REGISTRY_TEXT

    return REGISTRY_TEXT


def _tools() -> str:
    from fixtures_tools import tools_registry_text

    return tools_registry_text()


# name -> registry text: build (build/push/stage), launch (one cluster per fabric), lock, repo (this checkout's
# registry.yaml, with the sandbox cluster), course (examples/course), tools (repo + login hosts and hostile storage)
PRESETS: dict[str, Callable[[], str]] = {"build": _build, "launch": _launch, "lock": _lock, "repo": _repo,
                                         "course": _course, "tools": _tools}


def write_project(root: Path, registry: str) -> Path:
    """Write ``registry`` (a preset name or registry text) as ``root/registry.yaml``; return its path."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "registry.yaml"
    path.write_text(PRESETS[registry]() if registry in PRESETS else registry)
    return path


def shipped_project(root: Path) -> Path:
    """``root`` made a project folder of this checkout's own inputs, as a user's would be: registry.yaml and examples/
    (the training script `invoke launch -- examples/train.py` names), without bytecode; returns ``root``."""
    write_project(root, "repo")
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture
def make_project(tmp_path, monkeypatch):
    """``make_project(registry="build", *, name="proj", use=True) -> Registry`` (see the module docstring)."""
    from shipyard import registry as registries

    def make(registry: str = "build", *, name: str = "proj", use: bool = True):
        path = write_project(tmp_path / name, registry)
        if use:
            monkeypatch.chdir(path.parent)
            monkeypatch.setenv("SHIPYARD_REGISTRY", str(path))
        return registries.load(path)

    return make
