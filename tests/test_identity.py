"""The one "is this still the same file?" rule (shipyard/identity.py): size and mtime to the nanosecond."""

from __future__ import annotations

import os
import subprocess

from shipyard import identity


def test_stamp_is_size_and_mtime_ns_and_changed_says_why(tmp_path):
    f = tmp_path / "image.sif"
    f.write_bytes(b"x" * 10)
    st = f.stat()
    stamp = identity.stamp(f)
    assert stamp == identity.Stamp(10, st.st_mtime_ns)
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
