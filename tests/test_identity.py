"""The one "is this still the same file?" rule (shipyard/identity.py): size, mtime, inode and ctime."""

from __future__ import annotations

import os
import subprocess

from shipyard import identity


def test_stamp_is_size_mtime_inode_ctime_and_changed_says_why(tmp_path):
    f = tmp_path / "image.sif"
    f.write_bytes(b"x" * 10)
    st = f.stat()
    stamp = identity.stamp(f)
    assert stamp == identity.Stamp(10, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
    assert identity.changed(f, stamp) is None
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # same size, one nanosecond later
    assert "changed" in identity.changed(f, stamp)
    assert "No such file" in identity.changed(tmp_path / "gone", stamp)


def test_the_shell_form_prints_the_same_fields(tmp_path):
    """`stat -c SHELL_STAT | tr -d .` is SHELL_FIELDS' values joined by a space: what the launcher's check compares."""
    f = tmp_path / "image.sif"
    f.write_bytes(b"abc")
    os.utime(f, ns=(0, 1_700_000_000_000_000_007))
    out = subprocess.run(["stat", "-c", identity.SHELL_STAT, str(f)], capture_output=True, text=True, check=True)
    stamp = identity.stamp(f)
    assert out.stdout.strip().replace(".", "") == " ".join(str(getattr(stamp, k)) for k in identity.SHELL_FIELDS)


def test_same_size_other_content_with_mtime_set_back_is_changed(tmp_path):
    """What the file's owner can do (write, then `touch -d` the old mtime) moves the ctime, which nobody sets back;
    another file renamed to the name has another inode. Both failed when the rule was size + mtime_ns."""
    f = tmp_path / "image.sif"
    f.write_bytes(b"a" * 10)
    stamp = identity.stamp(f)
    st = f.stat()
    f.write_bytes(b"b" * 10)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "changed" in identity.changed(f, stamp)
    other = tmp_path / "other"
    other.write_bytes(b"a" * 10)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, f)
    assert "changed" in identity.changed(f, stamp)


def test_a_symlink_is_never_the_file_it_points_to(tmp_path):
    f = tmp_path / "image.sif"
    f.write_bytes(b"a")
    link = tmp_path / "link.sif"
    link.symlink_to(f)
    assert "not a regular file" in identity.changed(link, identity.stamp(f))
