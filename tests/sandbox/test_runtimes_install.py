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
    assert f"ENROOT_DATA_PATH {root}/node-local/enroot/data" in dropin.read_text()
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


def test_a_leftover_of_a_dead_sandbox_is_taken_over_and_a_running_ones_is_refused(tmp_path):
    # The CI failure this covers: a sandbox killed with its enroot installed, its folder gone; the next sandbox
    # refused the files as "not installed by shipyard" because the record lived in the dead sandbox's folder.
    prefix, first, second = tmp_path / "prefix", tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    runtimes.install(_fake_build(tmp_path), first, [], prefix_root=prefix)
    with pytest.raises(ShipyardError, match=f"installed for the running sandbox in {first}.*sandbox.down "
                                            f"--directory {first}\\); nothing was changed"):
        runtimes.install(_fake_build(tmp_path), second, [], prefix_root=prefix, running=lambda d: d == first)
    assert runtimes.installed_for(first, prefix)
    # another sandbox's down leaves it alone
    assert runtimes.uninstall(second, prefix_root=prefix) == [] and (prefix / "usr/bin/enroot").exists()
    runtimes.install(_fake_build(tmp_path), second, ["node1"], prefix_root=prefix, running=lambda d: False)
    assert runtimes.installed_for(second, prefix)
    dropin = prefix / "etc/enroot/enroot.conf.d/50-shipyard-sandbox.conf"
    assert f"ENROOT_DATA_PATH {second}/node-local/enroot/data" in dropin.read_text()
    assert runtimes.uninstall(second, prefix_root=prefix) == []
    assert not (prefix / "usr").exists() and not (prefix / "etc").exists() and runtimes.read_record(prefix) is None


def test_a_symlink_on_the_way_is_refused(tmp_path):
    prefix, root = tmp_path / "prefix", tmp_path / "sb"
    (prefix / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    (prefix / "usr" / "bin" / "enroot").symlink_to(tmp_path / "elsewhere")
    root.mkdir()
    with pytest.raises(ShipyardError, match="is a symlink; not following it"):
        runtimes.install(_fake_build(tmp_path), root, [], prefix_root=prefix)
    assert not (tmp_path / "elsewhere").exists()


def test_enroot_dropin_golden():
    golden(GOLD / "enroot-sandbox.conf", runtimes._dropin_text(SB))


def test_plugstack_golden(tmp_path):
    (tmp_path / "etc").mkdir()
    lib, args = runtimes.plugstack_entry(Path("/var/tmp/shipyard-runtimes/KEY"), SB)
    sandbox.set_plugstack([(lib, args), "/opt/double.so"], tmp_path, required=True)
    golden(GOLD / "plugstack.conf", (tmp_path / "etc" / "plugstack.conf").read_text())


def test_unsafe_sandbox_path_and_plugstack_words_are_refused(tmp_path):
    with pytest.raises(ShipyardError, match="letters, digits"):
        runtimes._dropin_text(Path("/tmp/$(reboot)"))
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
