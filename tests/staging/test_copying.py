"""shipyard/staging/copying.py: the staged copy is hashed from what reached the destination, in one pass, by the
kernel's copy with a hashing thread or by the loop through the process; every written range goes to writeback; a
failure on either side stops the copy and is raised, never hangs."""

from __future__ import annotations

import errno
import hashlib
import os
import threading

import pytest

from shipyard.staging import copying

DATA = os.urandom(5 * 4096 + 123)


@pytest.fixture
def small(monkeypatch):
    """4 KiB steps, so five and a bit of them make the test's file."""
    monkeypatch.setattr(copying, "CHUNK", 4096)
    monkeypatch.setattr(copying, "BUFFER", 4096)
    monkeypatch.setattr(copying, "WRITEBACK_EVERY", 2 * 4096)


@pytest.fixture
def advised(monkeypatch):
    calls = []
    real = os.posix_fadvise

    def spy(fd, offset, length, advice):
        calls.append((offset, length, advice))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    return calls


def _copy(tmp_path, data=DATA):
    (tmp_path / "src").write_bytes(data)
    fd = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    with open(tmp_path / "src", "rb") as fin, os.fdopen(fd, "wb") as fout:
        dev, ino, digest = copying.copy_hashing(fin, fout)
    st = os.stat(tmp_path / "dst")
    assert (dev, ino) == (st.st_dev, st.st_ino)
    return digest


def _no_kernel_copy(monkeypatch, why=errno.EXDEV):
    def refuse(*a):
        raise OSError(why, os.strerror(why))
    monkeypatch.setattr(os, "copy_file_range", refuse)


def test_the_kernel_copies_and_every_copied_chunk_is_hashed_then_written_back(tmp_path, small, advised,
                                                                               monkeypatch):
    reads = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: reads.append(off) or real(fd, bufs, off))
    digest = _copy(tmp_path)
    assert (tmp_path / "dst").read_bytes() == DATA and digest == hashlib.sha256(DATA).hexdigest()
    # each copied chunk handed to writeback as it is copied, and read back from the copy, in order
    assert reads == [0, 4096, 8192, 12288, 16384, 20480]
    assert advised == [(0, 0, os.POSIX_FADV_SEQUENTIAL)] + [
        (off, min(4096, len(DATA) - off), os.POSIX_FADV_DONTNEED) for off in reads]


def test_what_is_hashed_is_what_reached_the_copy(tmp_path, small, monkeypatch):
    """A byte that changes between the source and the destination (a bad disk, a filesystem bug) changes the hash:
    the hashes come from the destination, not from the source."""
    real = os.copy_file_range

    def corrupting(src, dst, count, offset_src, offset_dst):
        n = real(src, dst, count, offset_src, offset_dst)
        if offset_dst == 8192 and n:
            os.pwrite(dst, b"\x00" if DATA[8192] else b"\x01", 8192)
        return n

    monkeypatch.setattr(os, "copy_file_range", corrupting)
    digest = _copy(tmp_path)
    assert digest != hashlib.sha256(DATA).hexdigest()
    assert digest == hashlib.sha256((tmp_path / "dst").read_bytes()).hexdigest()


@pytest.mark.parametrize("why", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL])
def test_no_kernel_copy_between_the_files_falls_back_to_the_loop(tmp_path, small, advised, monkeypatch, why):
    _no_kernel_copy(monkeypatch, why)
    digest = _copy(tmp_path)
    assert (tmp_path / "dst").read_bytes() == DATA and digest == hashlib.sha256(DATA).hexdigest()
    assert advised == [(0, 0, os.POSIX_FADV_SEQUENTIAL), (0, 8192, os.POSIX_FADV_DONTNEED),
                       (8192, 8192, os.POSIX_FADV_DONTNEED)]  # whole written ranges, in order; the rest at fsync


def test_a_platform_without_the_call_copies_through_the_loop(tmp_path, small, monkeypatch):
    monkeypatch.delattr(os, "copy_file_range")
    assert _copy(tmp_path) == hashlib.sha256(DATA).hexdigest()


def test_an_empty_image_copies_to_an_empty_file(tmp_path):
    assert _copy(tmp_path, b"") == hashlib.sha256(b"").hexdigest() and (tmp_path / "dst").stat().st_size == 0


def _no_hashing_thread_left():
    return not [t for t in threading.enumerate() if t.name == "shipyard-stage-hash"]


def test_a_read_error_of_the_hashing_thread_is_raised_and_never_blocks_the_copy(tmp_path, small, monkeypatch):
    def broken(fd, bufs, off):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", broken)
    monkeypatch.setattr(copying, "QUEUED_CHUNKS", 1)  # a full queue would block a copier nobody drains
    with pytest.raises(OSError, match="Input/output error"):
        _copy(tmp_path)
    assert _no_hashing_thread_left()


def test_a_copy_error_after_the_first_chunk_is_raised_and_the_thread_ends(tmp_path, small, monkeypatch):
    real = os.copy_file_range

    def fails_later(src, dst, count, offset_src, offset_dst):
        if offset_src >= 8192:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", fails_later)
    with pytest.raises(OSError, match="No space left"):
        _copy(tmp_path)
    assert _no_hashing_thread_left()
