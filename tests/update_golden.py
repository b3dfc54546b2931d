"""Show, and on request accept, the differences between what the code now generates and the golden files.

    python -m tests.update_golden                  # run the golden tests, print a unified diff per differing file
    python -m tests.update_golden --accept         # the same, then write the new text over those golden files
    python -m tests.update_golden -- -k launch     # pytest arguments after `--` (default: every file using golden())

The tests only compare (tests/helpers_registry.py `golden`): a test that rewrote its golden file and then compared
would always pass. This command runs them with SHIPYARD_GOLDEN_ACTUAL set, so each differing output is written to a
temporary folder; it prints the diffs from there, and only --accept copies them over tests/golden/. Review the diff
and say in the commit why the generated text changed.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden"
ACTUAL_ENV = "SHIPYARD_GOLDEN_ACTUAL"  # the name tests/helpers_registry.py reads


def golden_test_files() -> list[str]:
    """The test files that call golden(): the default selection."""
    return sorted(str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_*.py") if "golden(" in p.read_text())


def diff(rel: Path, golden: Path, actual: Path) -> str:
    """A unified diff from the golden file (``rel`` below tests/golden/) to the new text."""
    old = golden.read_text().splitlines(keepends=True) if golden.exists() else []
    rel = Path("tests", "golden", rel)
    return "".join(difflib.unified_diff(old, actual.read_text().splitlines(keepends=True),
                                        f"a/{rel}" if old else "/dev/null", f"b/{rel}"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.update_golden", description=__doc__.splitlines()[0])
    ap.add_argument("--accept", action="store_true", help="write the new text over the differing golden files")
    ap.add_argument("pytest_args", nargs="*", help="pytest arguments (after --); default: every golden test file")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shipyard-golden-") as tmp:
        env = {**os.environ, ACTUAL_ENV: tmp}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(args.pytest_args or golden_test_files())]
        res = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True)
        changed = sorted(p for p in Path(tmp).rglob("*") if p.is_file())
        for actual in changed:
            rel = actual.relative_to(tmp)
            print(diff(rel, GOLDEN / rel, actual), end="")
        if args.accept:
            for actual in changed:
                target = GOLDEN / actual.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(actual, target)
        verb = "updated" if args.accept else "differ (--accept writes them)"
        print(f"{len(changed)} golden file(s) {verb}" if changed else "golden files: no differences")
    if res.returncode not in (0, 1) or (res.returncode == 1 and not changed):
        # failures that are not golden differences: show pytest's own report
        print(res.stdout[-4000:], res.stderr[-2000:], sep="\n", file=sys.stderr)
        return res.returncode or 1
    return 1 if changed and not args.accept else 0


if __name__ == "__main__":
    raise SystemExit(main())
