"""The contents record kept with a staged version: naming a version (``current``, its file name, a sha256 prefix),
reading the record capped and never through a symlink, and one line for each way it can be wrong. The stage that
writes it and `invoke diff --staged` on real SIFs: tests/staging/test_versions.py."""

from __future__ import annotations

import os

import pytest

from shipyard.containers.contents import Contents
from shipyard.errors import ShipyardError
from shipyard.staging import kept_contents, versions

A, B, C = "3f2a9c" + "0" * 58, "3f2a9d" + "1" * 58, "77aa00" + "2" * 58


@pytest.fixture
def storage(tmp_path):
    """Three versions of tiny.sif, the pointer naming the second."""
    for sha in (A, B, C):
        versions.version_path(tmp_path / "tiny.sif", sha).write_bytes(sha.encode())
    os.symlink(versions.version_path(tmp_path / "tiny.sif", B).name, tmp_path / "tiny.sif")
    return tmp_path


def test_a_version_is_named_current_by_file_name_or_sha256_prefix(storage):
    dest = storage / "tiny.sif"
    assert kept_contents.find(dest, "current") == versions.version_path(dest, B)
    assert kept_contents.find(dest, f"tiny.{C[:12]}.sif") == versions.version_path(dest, C)
    assert kept_contents.find(dest, "77aa") == versions.version_path(dest, C)
    assert kept_contents.find(dest, A) == versions.version_path(dest, A)  # the whole sha256
    with pytest.raises(ShipyardError, match=r"--staged 3f2a: names 2 staged versions .*give more of the sha256"):
        kept_contents.find(dest, "3f2a")
    with pytest.raises(ShipyardError, match=r"--staged 9999: no staged version of tiny.sif .*or `current`"):
        kept_contents.find(dest, "9999")
    with pytest.raises(ShipyardError, match=r"--staged \.\./x: no staged version"):
        kept_contents.find(dest, "../x")
    os.unlink(dest)
    with pytest.raises(ShipyardError, match=r"--staged current: .*tiny.sif names no staged version"):
        kept_contents.find(dest, "current")


def test_the_record_is_kept_and_read_back(storage):
    version = versions.version_path(storage / "tiny.sif", A)
    assert kept_contents.read(version) is None  # staged from a registry: none kept
    rec = Contents(python={"numpy": "1.26.4"}, apt={"libc6": "2.36"}, probed="apptainer exec")
    path = kept_contents.keep(version, rec, 0o640)
    assert path.name == f"tiny.{A[:12]}.sif.contents.json" and (path.stat().st_mode & 0o777) == 0o640
    assert kept_contents.read(version) == rec


def test_a_planted_or_corrupt_record_is_one_line(storage, tmp_path):
    version = versions.version_path(storage / "tiny.sif", A)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    os.symlink(elsewhere, kept_contents.path(version))
    with pytest.raises(ShipyardError, match="is a symlink, never followed"):
        kept_contents.read(version)
    os.unlink(kept_contents.path(version))
    kept_contents.path(version).write_text("{not json")
    with pytest.raises(ShipyardError, match=r"contents.json: corrupt contents record"):
        kept_contents.read(version)
    kept_contents.path(version).write_text('{"schema": 1, "python": {"numpy": 1}}')
    with pytest.raises(ShipyardError, match=r"contents.json: "):
        kept_contents.read(version)
