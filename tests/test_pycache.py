"""shipyard.pycache: derived data beside the package's bytecode is written only where Python writes bytecode, and
read back only from a regular file of the package's owner that nobody else can write."""

from __future__ import annotations

import os
import sys

import pytest

from shipyard import pycache


def test_written_data_reads_back(bytecode_folder):
    pycache.write("shipyard", "x.data", b"kept")
    assert pycache.read("shipyard", "x.data") == b"kept"
    assert (bytecode_folder / "x.data").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in bytecode_folder.iterdir()] == ["x.data"]  # no temporary file left


def test_nothing_is_written_where_python_writes_no_bytecode(bytecode_folder, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    pycache.write("shipyard", "x.data", b"kept")
    assert not (bytecode_folder / "x.data").exists()
    assert pycache.read("shipyard", "x.data") is None


def test_a_symlink_is_not_followed(bytecode_folder, tmp_path):
    (tmp_path / "elsewhere").write_bytes(b"planted")
    (bytecode_folder / "x.data").symlink_to(tmp_path / "elsewhere")
    assert pycache.read("shipyard", "x.data") is None


def test_a_file_others_can_write_is_not_read(bytecode_folder):
    pycache.write("shipyard", "x.data", b"kept")
    os.chmod(bytecode_folder / "x.data", 0o666)
    assert pycache.read("shipyard", "x.data") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_a_file_of_another_owner_is_not_read(bytecode_folder):
    pycache.write("shipyard", "x.data", b"kept")
    os.chown(bytecode_folder / "x.data", 12345, 12345)
    assert pycache.read("shipyard", "x.data") is None


def test_an_unwritable_folder_is_no_error(bytecode_folder, monkeypatch):
    monkeypatch.setattr(sys, "pycache_prefix", "/proc/no-such-place")
    pycache.write("shipyard", "x.data", b"kept")  # nothing happens, nothing raises
    assert pycache.read("shipyard", "x.data") is None



def test_marshalled_data_reads_back_and_anything_else_reads_as_none(bytecode_folder):
    import marshal

    pycache.write("shipyard", "m.marshal", marshal.dumps({"a": "x", "b": 1, 2: "y"}))
    assert pycache.read_marshal("shipyard", "m.marshal") == {"a": "x", "b": 1, 2: "y"}
    assert pycache.read_mapping("shipyard", "m.marshal", str) == {"a": "x"}  # other entries dropped
    for name, data in (("cut", marshal.dumps({"a": "x"})[:-3]), ("foreign", b"not marshal"), ("empty", b"")):
        pycache.write("shipyard", name, data)
        assert pycache.read_marshal("shipyard", name) is None and pycache.read_mapping("shipyard", name, str) == {}
    pycache.write("shipyard", "list", marshal.dumps(["a"]))
    assert pycache.read_mapping("shipyard", "list", str) == {}
    assert pycache.read_marshal("shipyard", "absent") is None


def test_a_listing_holds_the_regular_files_of_a_prefix_and_removing_never_follows_a_link(bytecode_folder, tmp_path):
    pycache.write("shipyard", "kept-a", b"a")
    pycache.write("shipyard", "other", b"o")
    (bytecode_folder / "kept-dir").mkdir()
    (tmp_path / "elsewhere").write_bytes(b"planted")
    (bytecode_folder / "kept-link").symlink_to(tmp_path / "elsewhere")
    listed = pycache.listing("shipyard", "kept-")
    assert list(listed) == ["kept-a"] and listed["kept-a"] == (bytecode_folder / "kept-a").stat().st_mtime_ns
    pycache.remove("shipyard", "kept-link")
    pycache.remove("shipyard", "kept-gone")  # already gone: no error
    assert (tmp_path / "elsewhere").read_bytes() == b"planted" and not (bytecode_folder / "kept-link").is_symlink()
    pycache.remove("shipyard", "kept-a")
    assert pycache.listing("shipyard", "kept-") == {} and pycache.read("shipyard", "other") == b"o"


def test_nothing_is_listed_or_removed_where_python_writes_no_bytecode(bytecode_folder, monkeypatch):
    pycache.write("shipyard", "kept-a", b"a")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert pycache.listing("shipyard", "kept-") == {}
    pycache.remove("shipyard", "kept-a")
    assert (bytecode_folder / "kept-a").exists()
