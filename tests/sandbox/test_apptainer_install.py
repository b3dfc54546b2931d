"""The real Apptainer's install without services: unpacked under a temporary root (not /) from a small archive of the
same shape, modes kept (the setuid starter), the configuration this machine needs and only then, holders and the
last one's removal, refusals, the build wrapper's argument rewriting (run for real with sh), the archive's sha256."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from helpers_registry import GOLDEN, golden

from shipyard.errors import ShipyardError
from shipyard.sandbox import apptainer

FULL = "CapBnd:\t000001ffffffffff\n"
NO_RESOURCE = "CapBnd:\t000001fffeffffff\n"  # this machine's root: bit 24, CAP_SYS_RESOURCE, is missing
CONF = "# apptainer.conf\nallow setuid = yes\n# allow setuid-mount squashfs = iflimited\nroot default capabilities = full\n"


def _archive(tmp_path: Path, top: str = "apptainer-1.4.5", evil: str | None = None) -> Path:
    """A tar.xz shaped like the vendored build: bin/apptainer, a setuid starter, etc/apptainer/apptainer.conf."""
    out = tmp_path / "apptainer.tar.xz"
    files = {f"{top}/bin/apptainer": (b"#!/bin/sh\necho real \"$@\"\n", 0o755),
             f"{top}/libexec/apptainer/bin/starter-suid": (b"\x7fELF", 0o4755),
             f"{top}/etc/apptainer/apptainer.conf": (CONF.encode(), 0o644)}
    if evil:
        files[evil] = (b"x", 0o644)
    with tarfile.open(out, "w:xz") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"{top}/bin/singularity")
        link.type, link.linkname = tarfile.SYMTYPE, "apptainer"
        tar.addfile(link)
    return out


class Calls:
    def __init__(self):
        self.argv = []

    def __call__(self, argv, **kw):
        self.argv.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")


def _prefix(root: Path) -> Path:
    return root / "opt/shipyard/apptainer-1.4.5"


@pytest.mark.skipif(os.geteuid() != 0, reason="a setuid bit is kept only when root unpacks")
def test_install_keeps_the_setuid_starter_and_configures_a_machine_without_all_capabilities(tmp_path):
    root, calls = tmp_path / "root", Calls()
    rec = apptainer.install(_archive(tmp_path), "process:1:2", root=root, status_text=NO_RESOURCE, run=calls)
    p = _prefix(root)
    assert (p / "libexec/apptainer/bin/starter-suid").stat().st_mode & 0o7777 == 0o4755
    assert (p / "bin/singularity").is_symlink()
    conf = (p / "etc/apptainer/apptainer.conf").read_text()
    assert "root default capabilities = file\n" in conf and "= full" not in conf
    assert "allow setuid-mount squashfs = yes\n" in conf and "# allow setuid-mount squashfs = iflimited" in conf
    # root is granted exactly the capabilities its bounding set has, by the real binary (before the wrapper exists)
    [argv] = calls.argv
    assert argv[:5] == [str(p / "bin/apptainer"), "capability", "add", "--user", "root"]
    granted = argv[5].split(",")
    assert "CAP_SYS_ADMIN" in granted and "CAP_SYS_RESOURCE" not in granted and len(granted) == 40
    assert (p / "bin/apptainer.real").read_bytes().startswith(b"#!/bin/sh\necho real")
    assert "--drop-caps 'CAP_SYS_RESOURCE'" in (p / "bin/apptainer").read_text()
    assert rec["holders"] == ["process:1:2"] and rec["missing_capabilities"] == ["CAP_SYS_RESOURCE"]
    assert json.loads((root / "var/lib/shipyard/apptainer.json").read_text()) == rec
    assert not [x for x in p.parent.iterdir() if x.name.startswith(".")], "the temporary folder is gone"


def test_a_machine_with_every_capability_gets_no_wrapper_and_keeps_full_capabilities(tmp_path):
    root, calls = tmp_path / "root", Calls()
    rec = apptainer.install(_archive(tmp_path), "process:1:2", root=root, status_text=FULL, run=calls)
    p = _prefix(root)
    assert calls.argv == [] and not (p / "bin/apptainer.real").exists()
    assert "root default capabilities = full\n" in (p / "etc/apptainer/apptainer.conf").read_text()
    assert rec["missing_capabilities"] == []


def test_holders_share_one_install_and_the_last_live_one_removes_it(tmp_path):
    root = tmp_path / "root"
    me = apptainer.process_holder()
    apptainer.install(_archive(tmp_path), me, root=root, status_text=FULL)
    running = {root / "sb"}
    apptainer.install(_archive(tmp_path), f"sandbox:{root / 'sb'}", root=root, status_text=FULL,
                      sandbox_running=lambda d: d in running)
    assert apptainer.holds(me, root) and apptainer.holds(f"sandbox:{root / 'sb'}", root)
    assert apptainer.release(me, root=root, sandbox_running=lambda d: d in running) is False
    assert _prefix(root).is_dir(), "the running sandbox still holds it"
    running.clear()  # the sandbox died without sandbox.down: it no longer counts
    assert apptainer.release("process:1:1", root=root, sandbox_running=lambda d: d in running) is True
    assert not _prefix(root).exists() and not (root / "opt/shipyard").exists()
    assert apptainer.read_record(root) is None
    assert apptainer.release(me, root=root) is False, "nothing left to release"


def test_a_dead_process_holder_does_not_keep_the_install(tmp_path):
    root = tmp_path / "root"
    apptainer.install(_archive(tmp_path), "process:999999999:1", root=root, status_text=FULL)
    me = apptainer.process_holder()
    rec = apptainer.install(_archive(tmp_path), me, root=root, status_text=FULL)
    assert rec["holders"] == [me], "the dead process was dropped when the next holder joined"
    assert apptainer.release(me, root=root) is True


def test_a_prefix_shipyard_did_not_unpack_is_refused_untouched(tmp_path):
    root = tmp_path / "root"
    _prefix(root).mkdir(parents=True)
    (_prefix(root) / "mine").write_text("site install\n")
    with pytest.raises(ShipyardError, match=r"exists and was not unpacked by shipyard .*nothing was changed"):
        apptainer.install(_archive(tmp_path), "process:1:2", root=root, status_text=FULL)
    assert (_prefix(root) / "mine").read_text() == "site install\n"


def test_a_symlinked_parent_and_paths_leaving_the_archive_are_refused(tmp_path):
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    (root / "opt/shipyard").symlink_to(tmp_path)
    with pytest.raises(ShipyardError, match="is a symlink; not following it"):
        apptainer.install(_archive(tmp_path), "process:1:2", root=root, status_text=FULL)
    root2 = tmp_path / "root2"
    with pytest.raises(tarfile.OutsideDestinationError):
        apptainer.install(_archive(tmp_path, evil="../../escaped"), "process:1:2", root=root2, status_text=FULL)
    assert not (tmp_path / "escaped").exists() and not _prefix(root2).exists()


def test_the_archive_is_checked_by_sha256(tmp_path):
    with pytest.raises(ShipyardError, match=r"--sources: .*apptainer-1.4.5-debian12-amd64.tar.xz is missing"):
        apptainer.archive_path(tmp_path)
    (tmp_path / "apptainer-1.4.5-debian12-amd64.tar.xz").write_bytes(b"not it")
    with pytest.raises(ShipyardError, match="has sha256 .*, expected 40c35dad"):
        apptainer.archive_path(tmp_path)


def test_bounding_set_reads_this_machines_status_line():
    have, missing = apptainer.bounding_set(NO_RESOURCE)
    assert missing == ["CAP_SYS_RESOURCE"] and have[0] == "CAP_CHOWN" and have[-1] == "CAP_CHECKPOINT_RESTORE"
    assert apptainer.bounding_set(FULL)[1] == []
    with pytest.raises(ShipyardError, match="no CapBnd line"):
        apptainer.bounding_set("Name: x\n")


def test_configured_conf_replaces_the_active_line_and_adds_a_missing_one():
    out = apptainer.configured_conf(CONF + "root default capabilities = no\n",
                                    {"root default capabilities": "file", "allow setuid-mount squashfs": "yes"})
    assert out.count("root default capabilities") == 1 and "root default capabilities = file" in out
    assert out.endswith("allow setuid-mount squashfs = yes\n")
    assert "# allow setuid-mount squashfs = iflimited" in out


def test_wrapper_golden():
    golden(GOLDEN / "sandbox" / "apptainer-wrapper.sh", apptainer.wrapper_text(["CAP_SYS_RESOURCE"]))


@pytest.mark.parametrize("argv, expect", [
    # the build's nested calls (apptainer's internal/pkg/build/stage.go runs <BINDIR>/apptainer this way)
    (["--build-config", "exec", "--pwd", "/", "/tmp/rootfs", "/bin/sh", "/.post.script"],
     ["--build-config", "exec", "--drop-caps", "CAP_A,CAP_B", "--pwd", "/", "/tmp/rootfs", "/bin/sh", "/.post.script"]),
    (["-s", "--build-config", "test", "/tmp/rootfs"],
     ["-s", "--build-config", "test", "--drop-caps", "CAP_A,CAP_B", "/tmp/rootfs"]),
    # everything else reaches the real binary unchanged, words with spaces and quotes included
    (["exec", "img.sif", "sh", "-c", "echo 'a b' \"$X\""], ["exec", "img.sif", "sh", "-c", "echo 'a b' \"$X\""]),
    (["build", "x.sif", "x.def"], ["build", "x.sif", "x.def"]),
    (["--build-config", "build", "x"], ["--build-config", "build", "x"]),
    ([], []),
])
def test_the_wrapper_adds_drop_caps_to_exactly_the_nested_build_calls(tmp_path, argv, expect):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").write_text(apptainer.wrapper_text(["CAP_A", "CAP_B"]))
    real = bindir / "apptainer.real"
    real.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    real.chmod(0o755)
    out = subprocess.run(["sh", str(bindir / "apptainer"), *argv], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == expect


def test_the_wrapper_refuses_a_capability_name_it_cannot_quote():
    with pytest.raises(ShipyardError, match="unexpected capability name"):
        apptainer.wrapper_text(["CAP_X'; rm -rf /"])


@pytest.mark.real_apptainer
@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_the_installed_apptainer_builds_with_post_and_test_and_runs_as_root_and_as_nobody(apptainer_on_path, tmp_path):
    """The configuration above is what this machine needs: a definition build runs %post and %test (the nested calls
    through the wrapper), root's container starts, and an unprivileged user runs the SIF in setuid mode."""
    work = tmp_path / "w"
    (work / "rootfs" / "bin").mkdir(parents=True)
    (work / "rootfs" / "bin" / "busybox").write_bytes(Path("/bin/busybox").read_bytes())
    (work / "rootfs" / "bin" / "busybox").chmod(0o755)
    for tool in ("sh", "cat", "id", "test"):
        (work / "rootfs" / "bin" / tool).symlink_to("busybox")
    (work / "t.def").write_text("Bootstrap: localimage\nFrom: base.sif\n\n%post\n    echo built > /marker\n\n"
                                "%environment\n    export FOO=bar\n\n%test\n    test \"$FOO\" = bar && cat /marker\n")
    run = lambda *a, **kw: subprocess.run(a, cwd=work, capture_output=True, text=True, timeout=120, **kw)  # noqa: E731
    assert run("apptainer", "build", "base.sif", "rootfs/").returncode == 0
    b = run("apptainer", "build", "t.sif", "t.def")
    assert b.returncode == 0, b.stderr
    assert "Running testscript" in b.stderr + b.stdout and "built" in b.stdout
    assert run("apptainer", "exec", "t.sif", "cat", "/marker").stdout == "built\n"
    shared = Path(tempfile.mkdtemp(prefix="shipyard-apptainer-", dir="/var/tmp"))  # pytest's tmp is root's only
    try:
        shared.chmod(0o755)
        shutil.copy(work / "t.sif", shared / "t.sif")
        (shared / "t.sif").chmod(0o644)
        as_nobody = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "env",
                                    "HOME=/", "apptainer", "exec", "t.sif", "sh", "-c", "id -u; cat /marker"],
                                   cwd=shared, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(shared)
    assert as_nobody.returncode == 0, as_nobody.stderr
    assert as_nobody.stdout == "65534\nbuilt\n"
