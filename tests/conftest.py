"""Shared pytest setup: what more than one test folder uses. A folder's own fixtures live in its conftest.py
(tests/<package>/conftest.py); services and doubles shared across folders live in tests/fixtures_*.py, loaded here;
tests/needs.py holds every test to the marks that say what it needs."""

import pathlib
import sys

_here = pathlib.Path(__file__).parent
sys.path.insert(0, str(_here))
# needs: the marks a service fixture requires; ci_skips: CI=true fails on a skip tests/allowed_skips.yaml does not
# allow; machine_notes: a failed service test says how much space and memory the machine had; handoff: a file one
# run of `invoke test` makes for another; run_order: a module's place in its run
pytest_plugins = ["pytester", "needs", *sorted(p.stem for p in _here.glob("fixtures_*.py")), "ci_skips",
                  "machine_notes", "handoff", "run_order"]
