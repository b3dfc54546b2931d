"""Hostile storage: what someone else who can write in a course's shared image storage, or the file's own
owner, tries against `invoke stage` and the job's pre-srun image check. Each test failed before the fix."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import helpers_stage
from fixtures_launch import run_launch
from helpers_stage import storage
from test_stage import _launch

from shipyard import project
from shipyard.errors import ShipyardError
from shipyard.files import sha256_file
from shipyard.staging import record as staged
from shipyard.staging import copying, versions
from shipyard.staging import stage as stage_module

pytestmark = pytest.mark.real_apptainer


def _check_block(text: str) -> str:
    """The launcher's pre-srun image check, as bash runs it."""
    start = text.index("\nimage=")
    return text[start:text.index("\n", text.index("matches its stage record", start))]


def _run(block: str, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    return subprocess.run(["bash", "-c", block], capture_output=True, text=True, env=env)


def _swap_same_size(dest: Path) -> None:
    """Replace ``dest``'s bytes in place by others of the same size and set its mtime back (what `touch -d` does)."""
    st = dest.stat()
    data = bytearray(dest.read_bytes())
    data[-1] ^= 0xFF
    dest.write_bytes(bytes(data))
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert dest.stat().st_size == st.st_size and dest.stat().st_mtime_ns == st.st_mtime_ns


def test_same_size_image_with_mtime_restored_is_refused_by_job_and_restaged(built, tmp_path):
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    block = _check_block(_launch(built, environment="tiny", cluster="lab", dry_run=True))
    dest = storage(built) / "tiny.sif"
    ok = _run(block, tmp_path / "home")
    assert ok.returncode == 0, ok.stderr
    _swap_same_size(dest)
    assert staged.image_changed(dest, rec) is not None
    res = _run(block, tmp_path / "home")
    assert res.returncode == 3 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "changed after it was staged" in res.stderr
    # stage does not call the swapped file "already staged"; with --force neither
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out)
    assert "already staged" not in out.getvalue() and sha256_file(dest) == rec.sha256
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out, force=True)
    assert "already staged" not in out.getvalue() and "staged tiny" in out.getvalue()


def test_an_edited_record_naming_another_file_is_refused_by_content(built, tmp_path):
    """Someone replaces the image and writes a record with the right hashes and the new file's stamp."""
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    block = _check_block(_launch(built, environment="tiny", cluster="lab", dry_run=True))
    dest = versions.current(storage(built) / "tiny.sif")  # the version the launcher names
    evil = dest.with_name("evil")
    evil.write_bytes(dest.read_bytes()[:-1] + b"!")
    os.replace(evil, dest)
    data = json.loads(staged.record_path(dest).read_text())
    st = dest.stat()
    data.update(size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino, ctime_ns=st.st_ctime_ns)
    staged.record_path(dest).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    res = _run(block, tmp_path / "home")
    assert res.returncode == 3 and len(res.stderr.strip().splitlines()) == 1, (res.stdout, res.stderr)
    assert rec.sha256 in res.stderr


def test_a_symlinked_record_is_refused(built, tmp_path):
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    block = _check_block(_launch(built, environment="tiny", cluster="lab", dry_run=True))
    dest = storage(built) / "tiny.sif"
    rp = staged.record_path(dest)
    copy = tmp_path / "copy.json"
    copy.write_text(rp.read_text())
    rp.unlink()
    rp.symlink_to(copy)
    res = _run(block, tmp_path / "home")
    assert res.returncode == 3 and "symlink" in res.stderr, res.stderr
    rec, why = staged.read_record(dest)
    assert rec is None and "symlink" in why


def test_a_record_hash_ending_in_a_newline_is_not_a_record(built):
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    dest = storage(built) / "tiny.sif"
    rp = staged.record_path(dest)
    data = json.loads(rp.read_text())
    data["sha256"] += "\n"
    data["input_hash"] += "\nsleep 1000"
    rp.write_text(json.dumps(data))
    rec, why = staged.read_record(dest)
    assert rec is None and "sha256" in why
    text = _launch(built, environment="tiny", cluster="lab", dry_run=True)
    assert "sleep 1000" not in text and text.index("#SBATCH") < 1000


def test_a_symlink_at_the_old_temp_name_is_never_written_through(built, tmp_path):
    dest = storage(built) / "tiny.sif"
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    os.chmod(victim, 0o600)
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        project.temp_path(dest, pid).symlink_to(victim)
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    assert victim.read_text() == "mine\n" and victim.stat().st_mode & 0o777 == 0o600
    image = versions.current(dest)  # the pointer stage made, naming a regular file it wrote
    assert versions.is_pointer(dest) and image.is_file() and not image.is_symlink()


def test_the_temp_copy_has_the_final_mode_from_the_start_and_a_dead_stagers_temp_is_removed(built, monkeypatch):
    dest = storage(built) / "tiny.sif"
    stale = dest.parent / f".tiny.sif.stage.{os.uname().nodename}.999999999.abcdef"
    stale.write_bytes(b"partial")
    seen = {}
    real = copying.copy_hashing

    def spy(fin, fout, *a):
        st = os.fstat(fout.fileno())
        seen["mode"], seen["name"] = st.st_mode & 0o777, os.readlink(f"/proc/self/fd/{fout.fileno()}")
        seen["dir"] = os.stat(os.path.dirname(seen["name"])).st_mode & 0o777
        return real(fin, fout, *a)
    monkeypatch.setattr(copying, "copy_hashing", spy)
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out)
    assert seen["mode"] == 0o640 and seen["dir"] == 0o700 and Path(seen["name"]).parent.parent == dest.parent
    assert not stale.exists() and f"removed {stale}" in out.getvalue()


def test_a_copy_is_hashed_as_it_is_written_and_not_read_again(built, monkeypatch):
    """One pass: the bytes are hashed on their way to the storage and fsync'ed; the record's sha256 is theirs."""
    reads = []
    monkeypatch.setattr(stage_module, "sha256_fd", lambda fd: reads.append(fd) or "0" * 64)
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    dest = storage(built) / "tiny.sif"
    assert reads == [] and rec.sha256 == hashlib.sha256(dest.read_bytes()).hexdigest()


def test_bytes_that_differ_from_the_manifest_on_the_way_are_refused(built, monkeypatch):
    real = copying.copy_hashing

    def flip(fin, fout):
        dev, ino, _ = real(fin, fout)
        return dev, ino, "f" * 64  # what a bad read of the source would hash to
    monkeypatch.setattr(copying, "copy_hashing", flip)
    with pytest.raises(ShipyardError, match="the staged copy hashes to sha256 f{64}, the source says"):
        helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    assert not (storage(built) / "tiny.sif").exists()


def test_two_stages_of_one_image_are_serialised(built):
    dest = storage(built) / "tiny.sif"
    lock = stage_module.lock_path(dest)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o640)
    fcntl.flock(fd, fcntl.LOCK_EX)
    done = threading.Event()

    def run():
        helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
        done.set()
    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.0)
    assert not done.is_set() and not dest.exists()
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    t.join(30)
    assert done.is_set() and staged.read_record(dest)[0] is not None


def test_a_symlink_at_the_lock_or_record_name_is_one_line(built, tmp_path):
    dest = storage(built) / "tiny.sif"
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    stage_module.lock_path(dest).symlink_to(victim)
    with pytest.raises(ShipyardError, match="symlink"):
        helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    assert victim.read_text() == "mine\n"


def test_an_env_name_with_a_trailing_newline_is_refused():
    """`^NAME$` matched "NAME\\n" (``$`` before a final newline); the launcher then had a bash syntax error."""
    from shipyard.launch.launcher import parse_env

    with pytest.raises(ShipyardError, match="--env"):
        parse_env(["FOO\n=1"])
    assert parse_env(["FOO=1\n"]) == (("FOO", "1\n"),)


def test_a_registry_file_name_with_a_newline_stays_in_the_header_comment(built):
    """Line 2 of a launcher named the registry file raw: a newline in its name ran the rest as a command."""
    odd = built.root / "reg\ntouch PWNED #.yaml"
    odd.write_text(built.path.read_text())
    (built.root / "train.py").touch()
    text = run_launch(["train.py"], registry_path=odd, environment="tiny", cluster="lab", dry_run=True)
    head = text[:text.index("#SBATCH")]
    assert all(ln.startswith("#") or not ln for ln in head.splitlines()), head


def _one_line(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def _indent4(text: str) -> str:
    return json.dumps(json.loads(text), indent=4, sort_keys=True) + "\n"


def _duplicate_sha(text: str) -> str:
    """A first sha256 line naming another image; json keeps the last (the real one), the job's sed the first."""
    return text.replace("{\n", '{\n  "sha256": "' + "0" * 64 + '",\n', 1)


@pytest.mark.parametrize("reformat", [_one_line, _crlf, _indent4, _duplicate_sha])
def test_a_record_the_job_refuses_is_never_already_staged_nor_a_doctor_pass(built, tmp_path, reformat):
    from shipyard.jobs import doctor
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    block = _check_block(_launch(built, environment="tiny", cluster="lab", dry_run=True))
    dest = storage(built) / "tiny.sif"
    rp = staged.record_path(dest)
    rp.write_text(reformat(rp.read_text()), newline="")
    res = _run(block, tmp_path / "home")
    assert res.returncode == 3, (res.stdout, res.stderr)  # the job refuses it
    rec, why = staged.job_check(dest)
    assert rec is None and why.count("\n") == 0 and "stage" in why
    finds = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), built.environment("tiny"))}
    assert finds["tiny"].status == doctor.FAIL, finds["tiny"]
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out)
    assert "already staged" not in out.getvalue() and "staged tiny" in out.getvalue()
    assert _run(block, tmp_path / "home").returncode == 0
    assert staged.job_check(dest)[0] is not None


def test_a_replaced_image_with_a_rewritten_record_is_never_already_staged_nor_a_doctor_pass(built, tmp_path):
    from shipyard.jobs import doctor
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    dest = versions.current(storage(built) / "tiny.sif")  # the staged version file the pointer names
    evil = dest.with_name("evil")
    evil.write_bytes(dest.read_bytes()[:-1] + b"!")
    os.chmod(evil, 0o640)
    os.replace(evil, dest)
    st = dest.stat()
    data = json.loads(staged.record_path(dest).read_text())
    data.update(size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino, ctime_ns=st.st_ctime_ns)
    staged.record_path(dest).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert staged.read_record(dest)[0] is not None  # typed and well-formed: only the content tells
    finds = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), built.environment("tiny"))}
    assert finds["tiny"].status == doctor.FAIL and "content sha256" in finds["tiny"].detail
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out)
    assert "already staged" not in out.getvalue() and sha256_file(dest) == rec.sha256
    # verified once per image file: the next stage reads the cache, not the image
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out)
    assert "already staged" in out.getvalue()


def test_the_python_field_reader_is_the_launchers_sed(built):
    """shell_field and the launcher's shipyard_field read the same value from every reformatted record."""
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    text = _launch(built, environment="tiny", cluster="lab", dry_run=True)
    assert staged.SHELL_FIELD_LINE.replace("KEY", "'\"$1\"'") in text
    good = staged.record_path(storage(built) / "tiny.sif").read_text()
    for body in (good, _one_line(good), _crlf(good), _indent4(good), _duplicate_sha(good), good.rstrip("\n")):
        for key in staged.SHELL_FIELDS:
            sed = subprocess.run(["sed", "-n", "s/" + staged.SHELL_FIELD_LINE.replace("KEY", key) + "/\\1/p"],
                                 input=body.encode(), capture_output=True).stdout.decode().split("\n")[0]
            assert staged.shell_field(body, key) == sed, (key, body)


def test_a_fifo_at_the_lock_path_is_one_line_not_a_hang(built, monkeypatch):
    """As a user who cannot write the FIFO (someone else's): the read-only open must not wait for a writer."""
    dest = storage(built) / "tiny.sif"
    os.mkfifo(stage_module.lock_path(dest), 0o644)
    real_open = os.open

    def not_writable(path, flags, *a):
        if str(path) == str(stage_module.lock_path(dest)) and flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a)
    monkeypatch.setattr(stage_module.os, "open", not_writable)
    got = {}

    def run():
        try:
            helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
        except ShipyardError as exc:
            got["error"] = str(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # release the hung open so the test process can end
        fd = real_open(stage_module.lock_path(dest), os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(10)
        pytest.fail("invoke stage hangs on a FIFO at its lock path")
    assert "not a regular file" in got["error"] and "\n" not in got["error"]


@pytest.mark.parametrize(("source", "key"), [("containers", "source"), ([1], "source"), ({"kind": 5}, "source"),
                                             ({"kind": "containers", "reference": ["x"]}, "source")])
def test_a_stage_record_source_of_another_type_is_one_line(built, source, key):
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    dest = storage(built) / "tiny.sif"
    rp = staged.record_path(dest)
    data = json.loads(rp.read_text())
    data["source"] = source
    rp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    rec, why = staged.read_record(dest)
    assert rec is None and key in why and "\n" not in why
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out)  # not a traceback: staged again
    assert "staged tiny" in out.getvalue() and staged.read_record(dest)[0].source_kind == "containers"


def test_stage_and_the_job_share_one_verification_per_image_file(built, tmp_path, monkeypatch):
    """The job's check caches "this stamp had this sha256" in the user's cache; content_differs reads and writes
    the same entries: what one verified the other does not hash again, and an entry for another stamp is no proof."""
    home = tmp_path / "home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    dest = storage(built) / "tiny.sif"
    block = _check_block(_launch(built, environment="tiny", cluster="lab", dry_run=True))
    assert _run(block, home).returncode == 0  # the job verified it and wrote its cache entry
    hashed = []
    real = staged.sha256_fd
    monkeypatch.setattr(staged, "sha256_fd", lambda fd: hashed.append(fd) or real(fd))
    assert staged.content_differs(dest, rec) is None and hashed == []
    entry = home / ".cache" / "shipyard" / "verified-images" / rec.sha256
    entry.write_text(entry.read_text().replace(f" {rec.ino} ", f" {rec.ino + 1} "))
    assert staged.content_differs(dest, rec) is None and len(hashed) == 1  # re-hashed, then cached again
    res = _run(block, home)
    assert res.returncode == 0 and "verifying the sha256" not in res.stdout  # the job accepts Python's entry


def test_a_fifo_at_the_record_path_stops_the_job_at_once(built, tmp_path):
    """A FIFO someone put where the stage record lies would hold the job's `sed` for ever: the check refuses any
    record that is not a regular file, in one line, before it reads it."""
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    block = _check_block(_launch(built, environment="tiny", cluster="lab", dry_run=True))
    record = staged.record_path(storage(built) / "tiny.sif")
    record.unlink()
    os.mkfifo(record)
    env = dict(os.environ, HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "home" / ".cache"))
    res = subprocess.run(["bash", "-c", block], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 3 and res.stderr.count("shipyard: error:") == 1, res.stderr
    assert f"stage record {record} is not a regular file" in res.stderr
