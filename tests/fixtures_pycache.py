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


@pytest.fixture
def fresh_renders(bytecode_folder, monkeypatch):
    """Nothing rendered or kept in this process (as in a new one); kept files go to the test's own bytecode folder."""
    from shipyard import rendered

    monkeypatch.setattr(rendered, "_used", {})
    monkeypatch.setattr(rendered, "_new", {})
    new_render_process()
    return bytecode_folder


def new_render_process() -> None:
    """What a new process starts from: nothing kept in memory, every source read again (write first with
    ``rendered._save()`` what the next process should find)."""
    from shipyard import jinja_environment, rendered

    rendered._new.clear()
    rendered._used.clear()
    for cached in (rendered._templates, rendered._code, rendered._jinja2, rendered._module_source):
        cached.cache_clear()
    jinja_environment.template_environment.cache_clear()


def spy_render_keys(monkeypatch) -> list:
    """The keys ``shipyard.rendered.key`` gives from now on, in order (None: a context with no key)."""
    from shipyard import rendered

    keys, real = [], rendered.key
    monkeypatch.setattr(rendered, "key", lambda *args: keys.append(real(*args)) or keys[-1])
    return keys
