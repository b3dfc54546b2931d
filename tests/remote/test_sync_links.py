"""remote.sync against a remote root others can write: a link planted at the remote project folder (either method)
or at a folder inside it (tar) is refused in one line, and nothing reaches where the link points. The remote side
is this machine's bash and tar (the ssh words replaced by ``bash -c``); the real ssh path is
tests/remote/test_remote_ssh.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from shipyard.errors import ShipyardError
from shipyard.remote import sync, transport


@pytest.fixture
def local_remote(tmp_path, monkeypatch):
    """(cluster, project checkout, remote root): the remote commands run here, in bash."""
    monkeypatch.setattr(transport, "require_master", lambda cluster: SimpleNamespace(login="here", cluster="c"))
    monkeypatch.setattr(transport, "ssh_argv", lambda dest, script, tty=False: ["bash", "-c", script])
    root = tmp_path / "remote-root"
    root.mkdir()
    proj = tmp_path / "proj"
    (proj / "containers").mkdir(parents=True)
    (proj / "containers" / "recipe.txt").write_text("r\n")
    (proj / "deep" / "er").mkdir(parents=True)
    (proj / "deep" / "er" / "f.txt").write_text("f\n")
    (proj / "train.py").write_text("print()\n")
    git = ["git", "-C", str(proj), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "p"], check=True)
    cluster = SimpleNamespace(name="far", login="far-login", remote=SimpleNamespace(root=str(root)))
    return cluster, proj, root


@pytest.fixture
def elsewhere(tmp_path):
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


def test_tar_ships_the_files_and_its_record(local_remote):
    cluster, proj, root = local_remote
    shipped = sync.sync(cluster, proj, method="tar")
    assert shipped.changed and (root / "proj" / "deep" / "er" / "f.txt").read_text() == "f\n"
    assert (root / "proj" / ".shipyard-shipped.json").is_file()
    assert [p.name for p in (root / "proj").iterdir() if ".shipyard-shipped.json." in p.name] == []


@pytest.mark.parametrize("planted", ["containers", "deep", "deep/er"])
def test_tar_refuses_a_link_planted_at_a_folder_of_the_project(local_remote, elsewhere, planted):
    cluster, proj, root = local_remote
    (root / "proj" / Path(planted).parent).mkdir(parents=True, exist_ok=True)
    (root / "proj" / planted).symlink_to(elsewhere)
    with pytest.raises(ShipyardError) as exc:
        sync.sync(cluster, proj, method="tar")
    msg = str(exc.value)
    assert "\n" not in msg and f"proj/{planted} is a symbolic link" in msg and "remove it" in msg
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("method", ["tar", "rsync"])
def test_a_link_planted_at_the_remote_project_folder_is_refused(local_remote, elsewhere, method):
    cluster, proj, root = local_remote
    (root / "proj").symlink_to(elsewhere)
    with pytest.raises(ShipyardError, match=r"remote-root/proj is a symbolic link, which remote.sync never follows"):
        sync.sync(cluster, proj, method=method)
    assert list(elsewhere.iterdir()) == []


def test_tar_replaces_a_link_at_a_files_name_and_never_writes_through_it(local_remote, elsewhere):
    cluster, proj, root = local_remote
    (elsewhere / "secret").write_text("s\n")
    (root / "proj").mkdir()
    (root / "proj" / "train.py").symlink_to(elsewhere / "secret")
    sync.sync(cluster, proj, method="tar")
    assert not (root / "proj" / "train.py").is_symlink() and (elsewhere / "secret").read_text() == "s\n"


def test_the_folders_tar_sends_come_before_their_files():
    assert sync._parents(["a/b/c.txt", "a/d.txt", "e.txt", "f/g.txt"]) == ["a", "f", "a/b"]


def test_tar_checks_again_in_the_command_that_extracts(local_remote, elsewhere, monkeypatch):
    """A link planted after the first check (before the archive arrives) is refused by the extracting command."""
    cluster, proj, root = local_remote

    def plant_then_run(dest, script, tty=False):
        if "tar -x" in script:
            (root / "proj" / "containers").symlink_to(elsewhere)
        return ["bash", "-c", script]

    monkeypatch.setattr(transport, "ssh_argv", plant_then_run)
    with pytest.raises(ShipyardError, match=r"proj/containers is a symbolic link"):
        sync.sync(cluster, proj, method="tar")
    assert list(elsewhere.iterdir()) == []
