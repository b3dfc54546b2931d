"""The staged copy: an image copied into the storage and hashed in one pass, then fsync'ed.

Where the kernel can copy between the two files (``copy_file_range``: one filesystem, or NFS 4.2's server-side
copy), it does, in chunks; each copied chunk is handed to writeback at once (``POSIX_FADV_DONTNEED``, which on
Linux starts writing dirty pages and keeps them cached), so the disk writes while the copy goes on, and a second
thread hashes the chunk as the copy's own page cache holds it (read back from the destination: what is hashed is
what was written, not what was meant to be). Where it cannot (another
filesystem, an old kernel, no such call), the bytes pass through this process: read, hashed, written, with the same
early writeback. Either way each byte of the source is read from the disk once, and nothing is read again after
the fsync.

Measured on this project's VM (bench/stage_fresh.py, 2 GiB, source not cached): the kernel copy with the hashing
thread took about 0.65x the time of ``cp`` + ``sync`` + ``openssl dgst -sha256`` of the copy, the loop through
this process 0.7-1.4x (the disk's speed moves with other I/O; the ratios come from the same rounds).
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import threading
from contextlib import suppress
from typing import BinaryIO

CHUNK = 16 << 20  # the kernel copy's step, and what the hashing thread reads back at once
QUEUED_CHUNKS = 4  # copied but not yet hashed: bounds the dirty pages the copy runs ahead by
BUFFER = 1 << 20  # the loop through this process
WRITEBACK_EVERY = 32 << 20
# copy_file_range's answers for "not between these two files": then the loop copies
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.ETXTBSY}


def copy_hashing(fin: BinaryIO, fout: BinaryIO) -> tuple[int, int, str]:
    """Copy ``fin`` (at its start) to the empty ``fout``, hashing the bytes that reach ``fout``, then fsync.
    ``fout``'s descriptor must be open for reading too (the kernel copy's hashes are read back from it). Returns the
    copy's (device, inode, sha256)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with suppress(OSError):  # a hint: a filesystem without it copies all the same
            advise(fin.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    digest = _kernel_copy(fin.fileno(), fout.fileno(), advise)
    if digest is None:
        digest = _loop_copy(fin, fout, advise)
    fout.flush()
    os.fsync(fout.fileno())
    st = os.fstat(fout.fileno())
    return st.st_dev, st.st_ino, digest


def _kernel_copy(src: int, dst: int, advise) -> str | None:
    """The kernel copies, a thread hashes what arrived; the sha256, or None when the kernel cannot copy between
    these files (nothing was written then)."""
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is None:
        return None
    try:
        n = copy_range(src, dst, CHUNK, 0, 0)
    except OSError as exc:
        if exc.errno in _NO_KERNEL_COPY:
            return None
        raise
    h = hashlib.sha256()
    ranges: queue.Queue = queue.Queue(maxsize=QUEUED_CHUNKS)
    failed: list[BaseException] = []

    def hash_ranges() -> None:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        try:
            while (item := ranges.get()) is not None:
                offset, length = item
                got = 0
                while got < length:
                    k = os.preadv(dst, [view[got:length]], offset + got)
                    if k == 0:
                        raise OSError(errno.EIO, f"the copy ends at {offset + got} bytes, {offset + length} were "
                                                 "copied")
                    got += k
                h.update(view[:length])
        except BaseException as exc:  # said by the copying thread; the queue is drained so it never blocks
            failed.append(exc)
            while ranges.get() is not None:
                pass

    hasher = threading.Thread(target=hash_ranges, name="shipyard-stage-hash", daemon=True)
    hasher.start()
    offset = 0
    try:
        while n:
            if advise is not None:  # writeback starts now; the pages stay cached, dirty then clean, to be read back
                with suppress(OSError):
                    advise(dst, offset, n, os.POSIX_FADV_DONTNEED)
            ranges.put((offset, n))
            offset += n
            if failed:
                break
            n = copy_range(src, dst, CHUNK, offset, offset)
    finally:
        ranges.put(None)
        hasher.join()
    if failed:
        raise failed[0]
    return h.hexdigest()


def _loop_copy(fin: BinaryIO, fout: BinaryIO, advise) -> str:
    """Read, hash and write through this process, starting writeback of every ``WRITEBACK_EVERY`` bytes written."""
    h = hashlib.sha256()
    buf = bytearray(BUFFER)
    view = memoryview(buf)
    written = handed = 0
    while n := fin.readinto(buf):
        h.update(view[:n])
        fout.write(view[:n])
        written += n
        if advise is not None and written - handed >= WRITEBACK_EVERY:
            fout.flush()
            with suppress(OSError):
                advise(fout.fileno(), handed, written - handed, os.POSIX_FADV_DONTNEED)
            handed = written
    return h.hexdigest()
