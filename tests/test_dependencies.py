"""A fresh machine works: every package shipyard's code imports is declared in pyproject.toml, and nothing declared
goes unused (deptry, configured under [tool.deptry]); the tests' own imports are declared as dependencies or test
extras (an AST walk). Why: CI once passed only because its machine had a tool installed by hand."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def _deptry(where: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deptry", "."], cwd=where, capture_output=True, text=True,
                          timeout=120, env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"})


def test_runtime_imports_equal_declared_dependencies():
    res = _deptry(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def test_deptry_catches_an_undeclared_import(tmp_path):
    """The check can fail: a project that imports yaml without declaring it is reported (DEP001 where yaml is not
    installed, DEP003 "transitive" where it is, as here)."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\ndependencies = []\n')
    (tmp_path / "p.py").write_text("import yaml\n")
    res = _deptry(tmp_path)
    assert res.returncode == 1 and "'yaml' imported" in res.stdout + res.stderr


def _declared() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"]) + [r for extra in meta["optional-dependencies"].values() for r in extra]
    return {Requirement(r).name.lower().replace("_", "-") for r in reqs}


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_test_imports_are_declared():
    """Every third-party module a test imports belongs to a declared dependency or test extra."""
    local = {p.stem for p in TESTS.glob("**/*.py")} | {"shipyard", "tasks", "conftest"}
    dists = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = {}
    for path in sorted(TESTS.glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top in local or top in sys.stdlib_module_names:
                    continue
                owners = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if not owners & declared:
                    missing.setdefault(top, path.name)
    assert not missing, f"imported by tests but not declared in pyproject.toml: {missing}"
