"""`invoke sandbox.runtimes` without services: the install record and its exact undo (under a temporary root, not
/), refusal to overwrite a foreign enroot, the generated enroot drop-in and plugstack line (goldens), the sources'
checks, and the one line `invoke test` prints when the sources are missing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fixtures_runtimes import missing_sources_line
from helpers_registry import GOLDEN, golden

from shipyard import sandbox
from shipyard.errors import ShipyardError
from shipyard.sandbox import runtimes

GOLD = GOLDEN / "sandbox"
SB = Path("/var/tmp/shipyard-sandbox")


def _fake_build(tmp_path: Path) -> Path:
    b = tmp_path / "build"
    stage = b / "enroot-root"
    (stage / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    (stage / "usr" / "lib" / "enroot").mkdir(parents=True, exist_ok=True)
    (stage / "etc" / "enroot").mkdir(parents=True, exist_ok=True)
    (stage / "usr" / "bin" / "enroot").write_text("#!/bin/bash\n")
    (stage / "usr" / "bin" / "enroot").chmod(0o755)
    (stage / "usr" / "lib" / "enroot" / "common.sh").write_text("# lib\n")
    (stage / "etc" / "enroot" / "enroot.conf").write_text("#conf\n")
    (b / "spank_pyxis.so").write_bytes(b"\x7fELF")
    return b


def test_install_then_uninstall_leaves_exactly_what_was_there(tmp_path):
    prefix, root = tmp_path / "prefix", tmp_path / "sb"
    (prefix / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    (prefix / "usr" / "bin" / "other").write_text("not ours\n")
    root.mkdir()
    before = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*"))
    rec = runtimes.install(_fake_build(tmp_path), root, ["node1", "node2"], prefix_root=prefix)
    assert (prefix / "usr/bin/enroot").stat().st_mode & 0o777 == 0o755
    dropin = prefix / "etc/enroot/enroot.conf.d/50-shipyard-sandbox.conf"
    assert "ENROOT_DATA_PATH /var/lib/shipyard/node-local/enroot/data" in dropin.read_text()
    assert {e["path"] for e in rec["files"]} == {str(prefix / p) for p in (
        "usr/bin/enroot", "usr/lib/enroot/common.sh", "etc/enroot/enroot.conf",
        "etc/enroot/enroot.conf.d/50-shipyard-sandbox.conf")}
    assert (root / "nodes" / "node2" / "enroot" / "cache").is_dir() and (root / "nodes" / "node1" / "pyxis").is_dir()
    # installing again (same build) is allowed: the files are ours
    runtimes.install(_fake_build(tmp_path), root, ["node1", "node2"], prefix_root=prefix)
    assert runtimes.installed_for(root, prefix) and not runtimes.installed_for(tmp_path / "other", prefix)
    assert runtimes.uninstall(root, prefix_root=prefix) == []
    assert sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*")) == before
    assert runtimes.read_record(prefix) is None


def test_a_file_changed_after_install_is_left_and_named(tmp_path):
    prefix, root = tmp_path / "prefix", tmp_path / "sb"
    root.mkdir()
    runtimes.install(_fake_build(tmp_path), root, [], prefix_root=prefix)
    (prefix / "etc/enroot/enroot.conf").write_text("edited by the admin\n")
    left = runtimes.uninstall(root, prefix_root=prefix)
    assert left == [f"{prefix}/etc/enroot/enroot.conf (changed since sandbox.runtimes wrote it)"]
    assert (prefix / "etc/enroot/enroot.conf").read_text() == "edited by the admin\n"
    assert not (prefix / "usr/bin/enroot").exists()


def test_a_foreign_enroot_is_never_overwritten(tmp_path):
    prefix, root = tmp_path / "prefix", tmp_path / "sb"
    (prefix / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    (prefix / "usr" / "bin" / "enroot").write_text("someone else's\n")
    root.mkdir()
    with pytest.raises(ShipyardError, match=r"usr/bin/enroot exists and was not installed by shipyard.*nothing"):
        runtimes.install(_fake_build(tmp_path), root, [], prefix_root=prefix)
    assert (prefix / "usr" / "bin" / "enroot").read_text() == "someone else's\n"
    assert not (prefix / "etc").exists() and runtimes.read_record(prefix) is None


def test_sandboxes_share_one_install_and_the_last_running_one_removes_it(tmp_path):
    # A test sandbox beside a developer's running sandbox with enroot installed: both hold the one install (the
    # drop-in names no sandbox); a sandbox that died or whose folder is gone no longer counts.
    prefix, first, second = tmp_path / "prefix", tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    build = _fake_build(tmp_path)
    runtimes.install(build, first, [], prefix_root=prefix)
    enroot = prefix / "usr/bin/enroot"
    inode = enroot.stat().st_ino
    runtimes.install(build, second, ["node1"], prefix_root=prefix, running=lambda d: d == first)
    assert runtimes.installed_for(first, prefix) and runtimes.installed_for(second, prefix)
    assert enroot.stat().st_ino == inode, "a running holder's files are not rewritten"
    # the first one's down leaves the files to the second, which still runs
    assert runtimes.uninstall(first, prefix_root=prefix, running=lambda d: d == second) == []
    assert enroot.exists() and not runtimes.installed_for(first, prefix)
    # a sandbox that is no holder changes nothing
    assert runtimes.uninstall(tmp_path / "third", prefix_root=prefix) == [] and enroot.exists()
    assert runtimes.uninstall(second, prefix_root=prefix) == []
    assert not (prefix / "usr").exists() and not (prefix / "etc").exists() and runtimes.read_record(prefix) is None


def test_another_build_held_by_a_running_sandbox_is_refused_and_a_dead_ones_replaced(tmp_path):
    prefix, first, second = tmp_path / "prefix", tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    runtimes.install(_fake_build(tmp_path), first, [], prefix_root=prefix)
    other = _fake_build(tmp_path / "other-slurm")
    (other / "enroot-root" / "usr" / "bin" / "enroot").write_text("#!/bin/bash\n# another build\n")
    with pytest.raises(ShipyardError, match=f"another enroot build .* for the running sandbox in {first}.*sandbox.down "
                                            f"--directory {first}\\); nothing was changed"):
        runtimes.install(other, second, [], prefix_root=prefix, running=lambda d: d == first)
    assert runtimes.installed_for(first, prefix) and not runtimes.installed_for(second, prefix)
    runtimes.install(other, second, [], prefix_root=prefix, running=lambda d: False)
    assert (prefix / "usr/bin/enroot").read_text().endswith("# another build\n")
    assert runtimes.read_record(prefix)["holders"] == [str(second)]
    assert runtimes.uninstall(second, prefix_root=prefix) == [] and not (prefix / "usr").exists()


def test_a_symlink_on_the_way_is_refused(tmp_path):
    prefix, root = tmp_path / "prefix", tmp_path / "sb"
    (prefix / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    (prefix / "usr" / "bin" / "enroot").symlink_to(tmp_path / "elsewhere")
    root.mkdir()
    with pytest.raises(ShipyardError, match="is a symlink; not following it"):
        runtimes.install(_fake_build(tmp_path), root, [], prefix_root=prefix)
    assert not (tmp_path / "elsewhere").exists()


def test_enroot_dropin_golden():
    golden(GOLD / "enroot-sandbox.conf", runtimes._dropin_text())


def test_plugstack_golden(tmp_path):
    (tmp_path / "etc").mkdir()
    lib, args = runtimes.plugstack_entry(Path("/var/tmp/shipyard-runtimes/KEY"), SB)
    sandbox.set_plugstack([(lib, args), "/opt/double.so"], tmp_path, required=True)
    golden(GOLD / "plugstack.conf", (tmp_path / "etc" / "plugstack.conf").read_text())


def test_unsafe_sandbox_path_and_plugstack_words_are_refused(tmp_path, monkeypatch):
    facts = {**runtimes.runtime_facts(), "node_local": "/tmp/$(reboot)"}
    monkeypatch.setattr(runtimes, "runtime_facts", lambda: facts)
    with pytest.raises(ShipyardError, match="letters, digits"):
        runtimes._dropin_text()
    (tmp_path / "etc").mkdir()
    with pytest.raises(ShipyardError, match="no spaces or #"):
        sandbox.set_plugstack([("/opt/p.so", ["runtime_path=/a b"])], tmp_path)


def test_sources_are_checked_by_sha256(tmp_path):
    with pytest.raises(ShipyardError, match=r"--sources .*: not a folder"):
        runtimes.find_sources(tmp_path / "none")
    with pytest.raises(ShipyardError, match=r"enroot-4\.1\.2\.tar\.gz is missing"):
        runtimes.find_sources(tmp_path)
    f = runtimes.runtime_facts()
    for name in ("enroot", "pyxis", "apptainer"):
        (tmp_path / f[name]["archive"]).write_bytes(b"not the archive")
    with pytest.raises(ShipyardError, match=f"has sha256 {hashlib.sha256(b'not the archive').hexdigest()}, "
                                            f"expected {f['enroot']['sha256']}"):
        runtimes.find_sources(tmp_path)


def test_missing_sources_give_one_line_naming_the_tests_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_RUNTIME_SOURCES", str(tmp_path / "nowhere"))
    line = missing_sources_line()
    assert "\n" not in line and "tests/sandbox/test_real_runtimes.py" in line
    assert "SHIPYARD_RUNTIME_SOURCES=DIR" in line and "../shared/vendor" in line


def test_build_key_changes_with_the_slurm_version():
    s = runtimes.Sources(Path("e"), Path("p"))
    assert runtimes.build_key(s, "22.05.8") != runtimes.build_key(s, "23.02.1")
    assert runtimes.build_key(s, "22.05.8") == runtimes.build_key(s, "22.05.8")
