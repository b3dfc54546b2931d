"""The sandbox's plugstack.conf lists only SPANK plugins every user can load: each user's srun (a student's job in
the two-student handout test) loads them, and one under a directory only root can search put "Permission denied"
into that user's job log."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from shipyard import sandbox
from shipyard.errors import ShipyardError


def _plugin(d: Path, dir_mode: int = 0o755, file_mode: int = 0o755) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    lib = d / "p.so"
    lib.write_bytes(b"\x7fELF")
    lib.chmod(file_mode)
    d.chmod(dir_mode)
    return lib


@pytest.fixture
def shared_dir():
    """A folder every user can search (pytest's tmp_path is under its 0700 basetemp)."""
    d = Path(tempfile.mkdtemp(prefix="shipyard-plugstack-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def test_a_plugin_other_users_cannot_reach_is_refused(shared_dir):
    tmp_path = shared_dir
    root = tmp_path / "sb"
    (root / "etc").mkdir(parents=True)
    private = _plugin(tmp_path / "private", dir_mode=0o700)
    with pytest.raises(ShipyardError, match=rf"SPANK plugin {private}: {tmp_path / 'private'} is not searchable by "
                                            r"others \(mode 0700\), but every user's srun loads it"):
        sandbox.set_plugstack([private], root)
    unreadable = _plugin(tmp_path / "open", file_mode=0o700)
    with pytest.raises(ShipyardError, match=r"it is not readable by others \(mode 0700\)"):
        sandbox.set_plugstack([unreadable], root)
    assert not (root / "etc" / "plugstack.conf").exists()  # nothing half-written
    shared = _plugin(tmp_path / "shared")
    sandbox.set_plugstack([shared], root)
    assert (root / "etc" / "plugstack.conf").read_text() == f"optional {shared}\n"


def test_what_blocks_other_users(shared_dir, tmp_path):
    assert sandbox.unreadable_by_others(shared_dir / "missing.so") is None  # not installed yet: Slurm says so
    assert sandbox.unreadable_by_others(_plugin(shared_dir / "ok")) is None
    # pytest's own basetemp (pytest-of-USER, 0700) held the pyxis double: the case that was found
    basetemp_user = next(p for p in tmp_path.parents if p.name.startswith("pytest-of-"))
    assert basetemp_user.stat().st_mode & 0o777 == 0o700
    assert sandbox.unreadable_by_others(_plugin(tmp_path / "x")) == f"{basetemp_user} is not searchable by others " \
        "(mode 0700)"
