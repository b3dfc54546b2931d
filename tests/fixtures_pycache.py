"""A bytecode folder of a test's own, for what shipyard keeps beside the package's bytecode (shipyard/pycache.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

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


def task_processes(project: Path, prefix: Path, argv: list[str], runs: int = 2,
                   after: Callable[[], None] = lambda: None) -> list[tuple[str, bool]]:
    """Run `shipyard ARGV` ``runs`` times, each in a new process in ``project``, with bytecode (and what shipyard
    keeps beside it) under ``prefix``, calling ``after`` after each; returns each run's stdout and whether it
    imported Jinja2."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "SHIPYARD_REGISTRY")}
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    script = (f"import sys, runpy\nsys.argv = {['shipyard', *argv]!r}\n"
              "try:\n    runpy.run_module('shipyard', run_name='__main__')\nexcept SystemExit:\n    pass\n"
              "print('JINJA2' if 'jinja2' in sys.modules else 'NO-JINJA2')\n")
    out = []
    for _ in range(runs):
        res = subprocess.run([sys.executable, "-c", script], cwd=project, env=env, capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr
        text, _, last = res.stdout.rstrip("\n").rpartition("\n")
        out.append((text, last == "JINJA2"))
        after()
    return out
