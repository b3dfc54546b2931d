"""`remote.sync` against a remote root others can write, without a network: the "ssh" runs the remote script with
bash on this machine, so the record it reads back is a file of the test."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from shipyard.remote import sync as sync_module
from shipyard.remote import transport


@pytest.fixture
def local_ssh(tmp_path, monkeypatch):
    """A cluster whose remote root is a folder of the test; ssh runs its script here."""
    remote = tmp_path / "remote"
    remote.mkdir()
    cluster = SimpleNamespace(name="c", login="login", remote=SimpleNamespace(root=str(remote), prelude=""))
    monkeypatch.setattr(transport, "require_master", lambda c: SimpleNamespace(login="login", cluster="c"))
    monkeypatch.setattr(transport, "ssh_argv", lambda dest, script, **kw: ["bash", "-c", script])
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print(1)\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "train.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    return cluster, root, remote / "proj"


def _sync_within(cluster, root, seconds=30):
    got = {}

    def run():
        try:
            got["shipped"] = sync_module.sync(cluster, root, method="tar")
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever it was
            got["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return t, got


@pytest.mark.parametrize("body", ["[]", "null", '"x"', "{", '{"manifest": 5}', "\udcff"])
def test_a_remote_record_of_another_type_is_no_record(local_ssh, body):
    cluster, root, target = local_ssh
    target.mkdir()
    (target / ".shipyard-shipped.json").write_bytes(body.encode("utf-8", "surrogateescape"))
    shipped = sync_module.sync(cluster, root, method="tar")
    assert shipped.changed and (target / "train.py").read_text() == "print(1)\n"
    assert json.loads((target / ".shipyard-shipped.json").read_text())["files"] == 1


def test_a_fifo_at_the_remote_record_is_no_record_not_a_hang(local_ssh):
    cluster, root, target = local_ssh
    target.mkdir()
    os.mkfifo(target / ".shipyard-shipped.json")
    t, got = _sync_within(cluster, root, 30)
    if t.is_alive():
        os.close(os.open(target / ".shipyard-shipped.json", os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail("remote.sync hangs on a FIFO at the remote record")
    assert "error" not in got, got
    assert got["shipped"].changed and (target / ".shipyard-shipped.json").is_file()


def test_an_oversized_remote_record_is_no_record(local_ssh):
    cluster, root, target = local_ssh
    target.mkdir()
    (target / ".shipyard-shipped.json").write_text('{"manifest": "' + "a" * 200000 + '"}')
    assert sync_module.sync(cluster, root, method="tar").changed
    # a second sync with nothing changed reads its own record back and ships nothing
    assert sync_module.sync(cluster, root, method="tar").changed == 0


def test_shipped_files_are_hashed_in_blocks_not_read_whole(tmp_path, monkeypatch):
    (tmp_path / "big").write_bytes(b"x" * (3 << 20))
    (tmp_path / "small").write_bytes(b"y")
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} read whole"))
    want = hashlib.sha256()
    for n in ("big", "small"):
        want.update(n.encode() + b"\0" + hashlib.sha256((b"x" * (3 << 20)) if n == "big" else b"y").digest())
    assert sync_module._manifest_digest(tmp_path, ["big", "small"]) == want.hexdigest()


@pytest.mark.parametrize("body", [b"[]", b'{"commit": "' + b"a" * 40 + b'\\n", "dirty": false}',
                                  b'{"commit": "' + b"a" * 40 + b'", "dirty": "no"}', b"\xff"])
def test_a_local_record_of_another_type_is_unknown_code(tmp_path, body):
    (tmp_path / ".shipyard-shipped.json").write_bytes(body)
    assert sync_module.code_identity(tmp_path) == ("unknown", None)


def test_a_fifo_or_device_as_the_local_record_is_unknown_code_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / ".shipyard-shipped.json")
    assert sync_module.code_identity(tmp_path) == ("unknown", None)
    (tmp_path / ".shipyard-shipped.json").unlink()
    (tmp_path / ".shipyard-shipped.json").symlink_to("/dev/zero")
    assert sync_module.code_identity(tmp_path) == ("unknown", None)
    good = json.dumps({"commit": "a" * 40, "dirty": True})
    (tmp_path / ".shipyard-shipped.json").unlink()
    (tmp_path / ".shipyard-shipped.json").write_text(good)
    assert sync_module.code_identity(tmp_path) == ("a" * 40, True)
