"""Shared pytest setup. Fixtures live in tests/fixtures_*.py modules (one per real service or double) and are
loaded here, so that independent areas do not edit one file."""

import pathlib
import sys

_here = pathlib.Path(__file__).parent
sys.path.insert(0, str(_here))
pytest_plugins = sorted(p.stem for p in _here.glob("fixtures_*.py")) + ["ci_skips"]  # ci_skips: CI=true fails on a skip it does not allow
