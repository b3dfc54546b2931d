"""A bytecode folder of a test's own, for what shipyard keeps beside the package's bytecode (shipyard/pycache.py)."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture
def bytecode_folder(tmp_path, monkeypatch):
    """A bytecode folder of this test's own (Python's pycache_prefix), with bytecode writing on."""
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    init = __import__("shipyard").__file__
    folder = tmp_path / "prefix" / os.path.dirname(init).lstrip(os.sep)
    folder.mkdir(parents=True)
    return folder
