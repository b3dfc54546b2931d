"""A student running shipyard from an install they cannot write (a course's shared checkout or site-wide install),
as a real unprivileged user: the commands work and print what the owner's would, and nothing of the student's lands
in the package's bytecode folders, where shipyard keeps derived data (shipyard/pycache.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from fixtures_launch import as_user, make_user, searchable_for_others
from fixtures_projects import shipped_project

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shipyard"


def _student_files(uid: int) -> list[str]:
    return sorted(str(p) for folder in PACKAGE.rglob("__pycache__") for p in folder.iterdir()
                  if p.lstat().st_uid == uid)


@pytest.mark.skipif(os.geteuid() != 0, reason="making the student user (useradd) needs root")
def test_a_student_of_a_shared_install_gets_the_owners_launcher_and_keeps_nothing_in_it():
    base = Path(tempfile.mkdtemp(prefix="shipyard-pycache-student-"))
    base.chmod(0o755)
    name = f"sy-pyc-{uuid.uuid4().hex[:6]}"
    restore = searchable_for_others([Path(sys.executable).resolve(), Path(sys.prefix) / "bin", PACKAGE])
    try:
        u = make_user(name, base / name)
        project = shipped_project(Path(u.pw_dir) / "project")
        subprocess.run(["chown", "-R", f"{u.pw_uid}:{u.pw_gid}", str(project)], check=True)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONDONTWRITEBYTECODE", "SHIPYARD_REGISTRY", "PYTHONPYCACHEPREFIX")}
        env["PYTHONPATH"] = str(ROOT)
        argv = [sys.executable, "-m", "shipyard", "launch", "--dry-run", "--force", "--", "examples/train.py"]

        def run(prefix: list[str]) -> str:
            res = subprocess.run([*prefix, *argv], cwd=project, env=env, capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, res.stderr[-3000:]
            assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr[-3000:]
            return res.stdout

        # the student first: their launcher is rendered anew, and keeping it in the install fails quietly
        students = [run(as_user(u)) for _ in range(2)]
        owners = run([])  # the install's owner (who may keep derived data there), in the student's project
        assert students == [owners, owners]
        assert owners.startswith("#!/bin/bash")
        assert _student_files(u.pw_uid) == []
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True)
        for d, mode in restore:
            d.chmod(mode)
        shutil.rmtree(base, ignore_errors=True)
