"""shipyard/files.py's writer for folders others can write: a link planted at any path it touches is refused or
replaced, never followed, chmod'ed or kept."""

from __future__ import annotations

import os

import pytest

from shipyard.errors import ShipyardError
from shipyard.files import SharedFolder


@pytest.fixture
def private(tmp_path):
    """A directory someone would like to see opened up or written into (0700, holds a secret)."""
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    (d / "secret").write_text("s\n")
    return d


def test_creates_folder_and_entries_with_their_modes(tmp_path):
    with SharedFolder(tmp_path / "out", "--out X") as f:
        f.mkdir("logs", 0o755)
        f.write("a/b/run.sh", "#!/bin/bash\n", 0o755)
        f.write("note.md", "n\n", 0o644)
    out = tmp_path / "out"
    assert (out.stat().st_mode & 0o777, (out / "logs").stat().st_mode & 0o777) == (0o755, 0o755)
    assert (out / "a" / "b" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (out / "note.md").read_text() == "n\n" and (out / "note.md").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_a_directory_link_is_refused_and_its_target_keeps_its_mode(tmp_path, private):
    out = tmp_path / "out"
    out.mkdir()
    (out / "logs").symlink_to(private)
    with SharedFolder(out, "--out X") as f, pytest.raises(ShipyardError, match=r"--out X: logs: is a symbolic link"):
        f.mkdir("logs", 0o755)
    assert private.stat().st_mode & 0o777 == 0o700


def test_a_link_on_a_files_path_is_refused_and_nothing_is_written_through_it(tmp_path, private):
    out = tmp_path / "out"
    out.mkdir()
    (out / "src").symlink_to(private)
    with SharedFolder(out, "--out X") as f, pytest.raises(ShipyardError, match=r"src: is a symbolic link"):
        f.write("src/train.py", "print()\n")
    assert sorted(p.name for p in private.iterdir()) == ["secret"]


def test_a_link_at_a_files_name_is_replaced_not_followed(tmp_path, private):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.sh").symlink_to(private / "secret")
    with SharedFolder(out, "--out X") as f:
        f.write("run.sh", "mine\n", 0o755)
    assert not (out / "run.sh").is_symlink() and (out / "run.sh").read_text() == "mine\n"
    assert (private / "secret").read_text() == "s\n" and (private / "secret").stat().st_mode & 0o777 == 0o644


def test_the_folder_itself_as_a_link_is_refused(tmp_path, private):
    (tmp_path / "out").symlink_to(private)
    with pytest.raises(ShipyardError, match="--out X: is a symbolic link"):
        SharedFolder(tmp_path / "out", "--out X")


def test_an_existing_folder_keeps_its_mode(tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o770)
    os.chmod(out, 0o770)
    (out / "logs").mkdir(mode=0o750)
    os.chmod(out / "logs", 0o750)
    with SharedFolder(out, "--out X") as f:
        f.mkdir("logs", 0o755)
    assert (out.stat().st_mode & 0o777, (out / "logs").stat().st_mode & 0o777) == (0o770, 0o750)


@pytest.mark.parametrize("rel", ["../x", "/abs", "a/../b", ""])
def test_paths_outside_the_folder_are_refused(tmp_path, rel):
    with SharedFolder(tmp_path / "out", "--out X") as f, pytest.raises(ValueError):
        f.write(rel, "x")
