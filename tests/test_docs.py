"""The user docs stay true: every ``shipyard.x.y`` they name imports (a module, or an attribute of one), every
relative link points at a file, and the README stays short enough to start from."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "examples/course/README.md",
        *sorted((ROOT / "docs").glob("*.md"))]


def named_paths() -> set[str]:
    """Dotted names such as shipyard.containers.manifest.read_manifest; `a/b/c` runs name several attributes."""
    out = set()
    for doc in DOCS:
        for m in re.finditer(r"\bshipyard(?:\.[A-Za-z_]\w*)+(?:/[A-Za-z_]\w*)*", doc.read_text()):
            head, *more = m.group(0).split("/")
            out.add(head)
            out.update(head.rsplit(".", 1)[0] + "." + name for name in more)
    return out


def resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("dotted", sorted(named_paths()))
def test_named_python_paths_exist(dotted):
    assert resolve(dotted) is not None


def test_some_paths_are_named():
    assert {"shipyard.containers.manifest.read_manifest", "shipyard.launch.launcher.build"} <= named_paths()


def test_relative_links_exist():
    missing = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists():
                missing.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert missing == []


def test_readme_starts_where_newcomers_start():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    order = [text.index(h) for h in ("## Two commands", "## The instructor's path", "## The student's path", "## Tasks")]
    assert order == sorted(order)


def test_pipeline_reference_is_in_docs():
    for name in ("registry", "definitions", "build", "stage", "launch", "jobs", "sandbox", "testing",
                 "launcher-rules"):
        assert (ROOT / "docs" / f"{name}.md").is_file(), name


def test_tasks_work_from_a_folder_outside_the_checkout(tmp_path):
    """A course folder anywhere: `python -m shipyard` (what the `shipyard` console entry point runs) finds the tasks
    in the installed package and the folder's own registry.yaml; there is no tasks.py in the folder."""
    import os
    import subprocess
    import sys
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"shipyard": "shipyard.__main__:run"}
    course = tmp_path / "my-course"
    course.mkdir()
    (course / "registry.yaml").write_text((ROOT / "examples" / "course" / "registry.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
    res = subprocess.run([sys.executable, "-m", "shipyard", "list"], cwd=course, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "course-dev" in res.stdout and "gwdg" in res.stdout
    help_ = subprocess.run([sys.executable, "-m", "shipyard", "--help", "course.handout"], cwd=course, env=env,
                           capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0 and help_.stdout.startswith("Usage: shipyard [--core-opts] course.handout"), help_.stdout
    assert sorted(p.name for p in course.iterdir()) == ["registry.yaml"]


def test_examples_course_carries_no_generated_files():
    """What a rehearsal writes (launch/, containers/, definitions/*.def, logs, checkpoints, a copied train.py) is not
    part of the example; the locks are inputs, committed on purpose."""
    import subprocess

    files = subprocess.run(["git", "ls-files", "examples/course"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    assert sorted(files) == ["examples/course/README.md", "examples/course/definitions/course-dev.lock",
                             "examples/course/definitions/course.lock", "examples/course/registry.yaml"]
