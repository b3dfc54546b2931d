"""apptainer backend of `invoke build`, with the real Apptainer 1.4.5 (``apptainer_on_path``).

The `tiny` environment bootstraps from ``shipyard-test/base:1``, which registry.yaml's base_mirror names at the
tests' in-process OCI registry (tests/containers/fixtures_oci.py: busybox, Debian's python3.11 and a metadata-only
torch, about 17 MB): a real build (pull, %files, %post, %labels, %environment, %test, SIF) takes a few seconds.
Its apt-get is a stub that lets a test make %post fail with a chosen status or wait for the test
(fixtures_oci.APT_GET_STUB). Tested: temp file + atomic rename, the manifest, the cache, a failed section in one line
with nothing left behind, interrupts and SIGKILL, two builds in turn, a rebuild check, the preflight. Every real
build but the failing section's is marked slow (the quick loop keeps its minute).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from fixtures_invoke import invoke_cli

from shipyard import project as paths
from shipyard import registry
from shipyard.containers import apptainer, common
from shipyard.containers import engine as b
from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "apptainer-build"
real = pytest.mark.real_apptainer


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "containers").iterdir() if p.is_file())


def _builds(root: Path) -> int:
    """How many builds ran the tool: each writes its own log (a cache hit writes none)."""
    logs = paths.build_logs_dir(root)
    return len(list(logs.glob("tiny-*.log"))) if logs.is_dir() else 0


def _edit(reg, old: str, new: str):
    """Change registry.yaml (``old`` -> ``new`` once) and return the registry loaded again."""
    path = reg.root / "registry.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return registry.load(path)


def _with_apt(reg, package: str):
    return _edit(reg, "    stack: base\n", f"    stack: base\n    apt: [{package}]\n")


def _with_files(reg):
    """Give `tiny` a `files:` entry (data/config.txt -> /opt/config.txt); returns (registry, source file)."""
    src = reg.root / "data" / "config.txt"
    src.parent.mkdir()
    src.write_text("lr: 0.1\n")
    return _edit(reg, "    stack: base\n",
                 "    stack: base\n    files:\n      - {src: data/config.txt, dst: /opt/config.txt}\n"), src


def _in_image(sif: Path, action: str, *cmd: str, flags: tuple[str, ...] = ()) -> str:
    """``apptainer ACTION [FLAGS] SIF [CMD...]``'s output (fails on a non-zero exit)."""
    res = subprocess.run(["apptainer", action, *flags, str(sif), *cmd], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


# ----------------------------------------------------------------------------------------------- a real build


@real
@pytest.mark.slow  # a whole real build with %files, %post, %environment, %labels and %test: seconds of CPU
def test_real_build_renames_temp_into_place_and_records_manifest(real_project, base_registry, capsys, monkeypatch):
    secret = "pa55-w0rd-never-in-files"
    monkeypatch.setenv("SHIPYARD_REGISTRY_PASSWORD", secret)
    monkeypatch.setenv("SHIPYARD_REGISTRY_USERNAME", "alice")
    reg, _ = _with_files(real_project)
    root = reg.root
    m = b.build(reg, reg.environment("tiny"))
    sif = root / "containers" / "tiny.sif"
    assert sif.read_bytes()[32:41] == b"SIF_MAGIC"
    assert not list((root / "containers").glob("*.tmp*"))
    assert mf.read_manifest(root / "containers" / "tiny.json") == m
    version = subprocess.run(["apptainer", "--version"], capture_output=True, text=True).stdout.strip()
    assert m.status == "ok" and m.backend == "apptainer" and m.tools == {"apptainer": version}
    assert version.startswith("apptainer version 1.4.5")
    assert m.pins["torch"] == "2.3.1" and m.spec_hash == reg.environment("tiny").spec_hash
    assert m.artifacts["sif"].sha256 == common.sha256_file(sif) and m.artifacts["sif"].size == sif.stat().st_size
    assert m.started <= m.finished and m.host and m.pid is None
    # the base came through the mirror, and the manifest says both names
    assert m.base == {"reference": "shipyard-test/base:1",
                      "mirrored": f"{base_registry.address}/shipyard-test/base:1"}
    assert "GET /v2/shipyard-test/base/manifests/1" in base_registry.requests
    log = (root / m.log).read_text()
    # built into a temp file beside the target, from the rendered definition, plain HTTP because registry.yaml said so
    assert f"$ apptainer build --no-https containers/tiny.sif.tmp-{os.getpid()} definitions/tiny.def" in log
    assert f"From: {base_registry.address}/shipyard-test/base:1" in (root / "definitions" / "tiny.def").read_text()
    assert "INFO:    Running post scriptlet" in log and "shipyard: %test passed for tiny" in log
    assert "INFO:    Build complete" in log
    assert "[00:00] INFO:    Starting build..." in capsys.readouterr().out  # streamed with the elapsed-time prefix
    # what the sections put in the image: %files, %environment, %labels
    assert _in_image(sif, "exec", "sh", "-c", "cat /opt/config.txt; echo $SHIPYARD_ENV $OMP_NUM_THREADS") \
        == "lr: 0.1\ntiny 1\n"
    labels = json.loads(_in_image(sif, "inspect", flags=("--json", "--labels")))["data"]["attributes"]["labels"]
    assert labels["org.shipyard.environment"] == "tiny" and labels["org.shipyard.torch"] == "2.3.1"
    assert labels["org.shipyard.spec-sha256"] == reg.environment("tiny").spec_hash
    # nothing the build wrote holds the registry password
    for p in root.rglob("*"):
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), p
    # the second build is a cache hit: a stat, not a read of the SIF, and no tool run
    hashed, sha256 = [], common.sha256_file
    monkeypatch.setattr(common, "sha256_file", lambda p: hashed.append(p) or sha256(p))
    assert b.build(reg, reg.environment("tiny")).finished == m.finished
    assert "up to date" in capsys.readouterr().out and sif not in hashed and _builds(root) == 1


@real
@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_failing_post_is_one_line_exit_1_and_leaves_nothing(real_project):
    reg = _with_apt(real_project, "shipyard-test-exit-3")
    res = invoke_cli("build", "tiny", cwd=reg.root, timeout=None)
    assert res.returncode == 1, res.stdout + res.stderr
    m = mf.read_manifest(reg.root / "containers" / "tiny.json")
    assert res.stderr == (f"shipyard: error: apptainer build of tiny: %post failed (exit status 3); no image was "
                          f"written; full output in {reg.root / m.log}\n")
    assert _files(reg.root) == ["tiny.json", "tiny.json.lock", "tiny.lock"]  # no SIF, no temp file
    assert m.status == "failed" and m.error.startswith("apptainer build of tiny: %post failed (exit status 3)")
    log = (reg.root / m.log).read_text()
    assert "apt-get stub: exit 3" in log
    assert "FATAL:   While performing build: while running engine: while running %post section: exit status 3" in log


@real
@pytest.mark.slow  # two whole real builds
def test_verify_rebuild_of_the_same_lock_finds_no_python_difference(real_project, base_registry):
    """`invoke build tiny --verify-rebuild` with the real Apptainer: built again from the same lock and the same
    base through the mirror, both SIFs probed, their contents compared: no Python difference, exit 0."""
    import io

    from shipyard.commands import containers as container_commands
    from shipyard.commands.context import Context

    ctx = Context(real_project, out=io.StringIO(), err=io.StringIO())
    rc = container_commands.build(ctx, "tiny", force=True, verify_rebuild=True)
    text = ctx.out.getvalue()
    assert rc == 0, text + ctx.err.getvalue()
    assert "Python packages: identical in both builds" in text and "ERROR" not in text
    assert _builds(real_project.root) == 2  # the tool ran twice: a rebuild, not the cache
    m = mf.read_manifest(real_project.root / "containers" / "tiny.json")
    assert m.backend == "apptainer" and m.contents_record is not None and m.previous_contents_record is not None
    # both read from their SIFs (the test base has no venv, so the Python sections are empty on both sides; the
    # verdict on a real closure is tested with recorded contents in test_contents_commands)
    def ours(rec):
        return {k: v for k, v in rec.labels.items() if k.startswith("org.shipyard.")}

    assert ours(m.contents_record) and ours(m.contents_record) == ours(m.previous_contents_record)


@real
@pytest.mark.slow
def test_failing_test_section_keeps_the_previous_image(real_project):
    reg = real_project
    b.build(reg, reg.environment("tiny"))
    sif = reg.root / "containers" / "tiny.sif"
    before = (sif.read_bytes(), sif.stat().st_mtime_ns)
    reg = _edit(reg, 'torch: "2.3.1"', 'torch: "2.3.0"')  # the base carries 2.3.1: %test fails
    res = invoke_cli("build", "tiny", cwd=reg.root, timeout=None)
    assert res.returncode == 1
    assert res.stderr.startswith("shipyard: error: apptainer build of tiny: %test failed (exit status 1); no image "
                                 "was written; full output in ") and len(res.stderr.splitlines()) == 1
    assert (sif.read_bytes(), sif.stat().st_mtime_ns) == before
    assert not list((reg.root / "containers").glob("*.tmp*"))
    m = mf.read_manifest(reg.root / "containers" / "tiny.json")
    assert m.status == "failed" and "%test failed" in m.error
    assert "AssertionError: torch is 2.3.1, expected 2.3.0" in (reg.root / m.log).read_text()
    reg = _edit(reg, 'torch: "2.3.0"', 'torch: "2.3.1"')
    b.build(reg, reg.environment("tiny"))  # a failed last build is never a cache hit
    assert _builds(reg.root) == 3


@pytest.mark.parametrize("sample,want", [
    ("post-exit-3.txt", "%post failed (exit status 3); no image was written"),
    ("test-exit-3.txt", "%test failed (exit status 3); no image was written"),
    ("post-killed.txt", "%post failed (signal: killed); no image was written"),
])
def test_failed_section_is_read_from_real_output(sample, want):
    lines = (SAMPLES / sample).read_text().splitlines()
    assert apptainer.failed_section(lines) == want
    assert apptainer.failed_section(lines[:-1]) is None  # before the FATAL line: no section is named


@real
@pytest.mark.slow
def test_cache_misses_when_artifact_changed_or_tool_upgraded(real_project, apptainer_on_path, monkeypatch, tmp_path):
    """The tool's version is part of the key: a wrapper in front of the real binary reports another version."""
    tooldir = tmp_path / "tool"
    tooldir.mkdir()
    tool = tooldir / "apptainer"

    def wrapper(version: str) -> None:
        tool.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version}"; exit 0; fi\n'
                        f'exec {apptainer_on_path / "apptainer"} "$@"\n')
        tool.chmod(0o755)

    wrapper("apptainer version 1.4.5-test-a")
    monkeypatch.setenv("PATH", f"{tooldir}{os.pathsep}{os.environ['PATH']}")
    reg = real_project
    b.build(reg, reg.environment("tiny"))
    sif = reg.root / "containers" / "tiny.sif"
    with open(sif, "ab") as fh:  # same path, different size: not intact
        fh.write(b"x")
    b.build(reg, reg.environment("tiny"))
    assert _builds(reg.root) == 2
    b.build(reg, reg.environment("tiny"))  # same binary: its recorded version is reused, nothing rebuilt
    assert _builds(reg.root) == 2
    time.sleep(0.01)
    wrapper("apptainer version 1.4.5-test-b")  # upgraded in place: another size and mtime, another version
    b.build(reg, reg.environment("tiny"))
    assert _builds(reg.root) == 3
    m = mf.read_manifest(reg.root / "containers" / "tiny.json")
    assert m.tools["apptainer"] == "apptainer version 1.4.5-test-b"
    assert m.tool_ids["apptainer"].startswith(str(tool) + ":")


@real
@pytest.mark.slow
def test_copied_files_are_part_of_the_cache_key(real_project):
    reg, src = _with_files(real_project)
    b.build(reg, reg.environment("tiny"))
    b.build(reg, reg.environment("tiny"))
    assert _builds(reg.root) == 1
    src.write_text("lr: 0.2\n")  # same definition text, other content copied in: a rebuild
    b.build(reg, reg.environment("tiny"))
    assert _builds(reg.root) == 2
    out = subprocess.run(["apptainer", "exec", str(reg.root / "containers" / "tiny.sif"), "cat", "/opt/config.txt"],
                         capture_output=True, text=True).stdout
    assert out == "lr: 0.2\n"
    src.unlink()
    with pytest.raises(ShipyardError, match="data/config.txt: the definition copies it into the image, but it "
                                            "does not exist"):
        b.build(reg, reg.environment("tiny"))


DEBIAN_ENV = """\
  deb:
    description: os debian12 on a Debian 12 base from the mirror; %post installs Debian's Python with apt
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: debian12
    stack: base
    base: {base}
    torchvision: false
    torchaudio: false
    apt: [python3, python3-pip]
"""


@real
@pytest.mark.slow
@pytest.mark.pypi  # the network: Debian's packages, through the host's build-network settings
def test_debian12_environment_builds_for_real(real_project, debian_base, base_registry, monkeypatch):
    """An `os: debian12` environment on a debootstrapped Debian 12 (fixtures_debian.py) that the mirror serves:
    %post sources the build network (this machine's CA bundle), apt-get installs Debian's python3 and pip from
    Debian's packages, pip check passes, and %test finds Python 3.11 and the torch pins (the metadata-only torch
    of the tiny base, in a layer of its own: PyPI's torch would be 1.8 GB here, which the real-image test pays)."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")  # the host's bundle, which the project fixture unset
    if bundle.is_file():
        monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    reg = _edit(real_project, "  tiny-mismatch:\n", DEBIAN_ENV.format(base=debian_base) + "  tiny-mismatch:\n")
    started = time.monotonic()
    m = b.build(reg, reg.environment("deb"))
    took = time.monotonic() - started
    assert m.status == "ok" and m.base == {"reference": debian_base,
                                            "mirrored": f"{base_registry.address}/{debian_base}"}
    log = (reg.root / m.log).read_text()
    assert "+ apt-get install -y --no-install-recommends python3 python3-pip" in log
    assert "shipyard: %test passed for deb" in log and "INFO:    Build complete" in log
    sif = reg.root / "containers" / "deb.sif"
    assert _in_image(sif, "exec", "sh", "-c", ". /etc/os-release; echo $VERSION_ID; python3 -c 'import torch, sys; "
                     "print(sys.version_info[:2], torch.__version__)'") == "12\n(3, 11) 2.3.1+cu121\n"
    print(f"debian12 real build: {took:.0f} s")
    # --verify-rebuild: the same lock and base built once more, both images' contents compared
    import io

    from shipyard.commands import containers as container_commands
    from shipyard.commands.context import Context

    ctx = Context(reg, out=io.StringIO(), err=io.StringIO())
    rc = container_commands.build(ctx, "deb", verify_rebuild=True)
    text = ctx.out.getvalue()
    assert rc == 0, text + ctx.err.getvalue()
    assert "Python packages: identical in both builds" in text and "ERROR" not in text
    m = mf.read_manifest(reg.root / "containers" / "deb.json")
    assert m.contents_record.apt and m.contents_record.apt == m.previous_contents_record.apt, text  # no apt drift
    assert m.contents_record.python == m.previous_contents_record.python


def test_tool_that_exits_0_without_a_sif_is_a_failure(project, tmp_path, monkeypatch):
    """Our own guard (check_sif), whatever the tool: a fake `apptainer` that says it built and wrote nothing."""
    fake = tmp_path / "bin" / "apptainer"
    fake.parent.mkdir()
    # `apptainer build ... TARGET DEF`: writes a file that is no SIF at TARGET and says it succeeded
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "apptainer version 0-fake"; exit 0; }\n'
                    'for a; do target=$def; def=$a; done\necho "not a SIF" > "$target"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path))
    with pytest.raises(ShipyardError, match="no SIF magic"):
        b.build(project, project.environment("tiny"))
    assert not list((project.root / "containers").glob("tiny.sif*"))  # the temp file is removed


@real
@pytest.mark.slow
def test_forced_build_records_the_overridden_errors_in_the_manifest(real_project, capsys):
    """`build --force` of an environment that fails `check` (Python 3.13 has no torch 2.3.1 wheel) goes on, warns,
    and the manifest names the overridden errors. The real build then fails where it should: the base's Python is
    3.11, and %test compares it with the pin (a double that ran no %test had called this build ok)."""
    import io

    import helpers_stage

    reg = _edit(real_project, "environments:\n", "environments:\n  tiny-py313:\n    extends: tiny\n"
                                                  "    python: \"3.13\"\n")
    with pytest.raises(ShipyardError, match="%test failed"):
        helpers_stage.build(reg.path, "tiny-py313", force=True, out=io.StringIO())
    m = mf.read_manifest(reg.root / "containers" / "tiny-py313.json")
    assert m.status == "failed" and not (reg.root / "containers" / "tiny-py313.sif").exists()
    assert any("Python 3.13" in f for f in m.forced_checks), m.forced_checks
    assert "WARNING: --force: build tiny-py313" in capsys.readouterr().err


@real
def test_fakeroot_is_passed(real_project):
    """`--fakeroot` reaches `apptainer build`. Whether the build then works is the site's (subuid mapping, or
    root): here it runs as root, with no /etc/subuid ranges."""
    reg = real_project
    try:
        b.build(reg, reg.environment("tiny"), fakeroot=True)
    except ShipyardError as exc:
        assert "full output in" in str(exc) and len(str(exc).splitlines()) == 1
    m = mf.read_manifest(reg.root / "containers" / "tiny.json")
    assert f"$ apptainer build --fakeroot --no-https containers/tiny.sif.tmp-{os.getpid()}" \
        in (reg.root / m.log).read_text()


# ----------------------------------------------------------------------------------------------- interrupts and locks

# A held build waits in %post until the test releases it, far longer than a test waits for the build to react, so
# "ignored the signal" (still holding at the deadline) cannot be mistaken for "slow to clean up".
REACT_S = 30
START_S = 240  # until a held build reaches %post: pull, unpack and start, slow on a busy 2-core machine


def _default_signals() -> None:
    """In the child: SIGINT/SIGTERM as a user's terminal gives them. A shell running pytest in the background
    (`cmd &`) hands its children SIGINT *ignored*, exec keeps that, and the build would never see the interrupt."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _start_build(reg, *extra) -> subprocess.Popen:
    return invoke_cli.popen("build", "tiny", *extra, cwd=reg.root, env=os.environ.copy(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_default_signals)


class Hold:
    """``apt: [shipyard-test-hold-TOKEN]``: the build's %post waits until :meth:`release` (fixtures_oci.py)."""

    def __init__(self):
        self.token = uuid.uuid4().hex
        self.file = Path(f"/tmp/shipyard-test-release-{self.token}")

    @property
    def package(self) -> str:
        return f"shipyard-test-hold-{self.token}"

    def release(self) -> None:
        self.file.touch()

    def close(self) -> None:
        self.file.unlink(missing_ok=True)


@pytest.fixture
def hold():
    h = Hold()
    yield h
    h.release()  # a %post still holding (a test that failed half-way) ends
    time.sleep(0.5)
    h.close()


def _read_until(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """``proc``'s output up to the line holding ``text`` (fails after ``timeout`` seconds)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            seen.append(line)
            if text in line or not line:
                break
    assert any(text in line for line in seen), "".join(seen)
    return "".join(seen)


def _start_held(real_project, hold, *extra) -> tuple:
    """(registry, process) of a build started with ``hold``'s package, once its %post holds."""
    reg = _with_apt(real_project, hold.package)
    proc = _start_build(reg, *extra)
    _read_until(proc, "apt-get stub: holding", START_S)
    return reg, proc


def _apptainer_builds_in(root: Path) -> list[int]:
    """PIDs of `apptainer build` processes writing a temp file of this project."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                cwd = str((d / "cwd").resolve())
            except OSError:
                continue
            if b".sif.tmp-" in cmd and b"build" in cmd and cwd == str(root):
                pids.append(int(d.name))
    return pids


def _wait_for(pred, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


@real
@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
def test_interrupt_leaves_no_partial_and_manifest_failed(real_project, hold, sig, code):
    reg, proc = _start_held(real_project, hold)
    os.kill(proc.pid, sig)
    try:
        out, _ = proc.communicate(timeout=REACT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the build did not react to {sig.name} within {REACT_S} s (its %post holds until released)")
    assert proc.returncode == code, out
    assert "interrupted" in out
    containers = reg.root / "containers"
    assert not list(containers.glob("*.tmp*")) and not (containers / "tiny.sif").exists()
    m = mf.read_manifest(containers / "tiny.json")
    assert m.status == "failed" and "interrupted" in m.error
    assert _wait_for(lambda: not _apptainer_builds_in(reg.root), 10), "apptainer build outlived the interrupt"


@real
@pytest.mark.slow
def test_sigkill_of_builder_is_detected_and_cleaned_by_next_build(real_project, hold):
    reg, proc = _start_held(real_project, hold)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=REACT_S)
    containers = reg.root / "containers"
    assert not (containers / "tiny.sif").exists()  # never a partial file at the target path
    assert mf.read_manifest(containers / "tiny.json").status == "building"  # nobody could write "failed"
    # the orphaned tool got SIGTERM through PR_SET_PDEATHSIG instead of building on
    assert _wait_for(lambda: not _apptainer_builds_in(reg.root), REACT_S), "apptainer build outlived its builder"
    hold.release()
    res = invoke_cli("build", "tiny", cwd=reg.root, timeout=None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "was killed before it finished" in res.stdout
    assert not list(containers.glob("*.tmp*"))
    assert mf.read_manifest(containers / "tiny.json").status == "ok"


def _log_started(log: Path) -> datetime:
    """When a build began, from its log's name (stamped once the build holds the lock)."""
    stamp = log.stem.rsplit("-", 1)[1]
    return datetime.strptime(stamp, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=timezone.utc)


@real
@pytest.mark.slow
def test_second_build_waits_for_the_first_and_they_serialize(real_project, hold):
    # the first build holds in %post until the second says it waits: no race with a fixed sleep
    reg, first = _start_held(real_project, hold, "--force")
    second = _start_build(reg, "--force")
    head = _read_until(second, "waiting for the running build (pid", REACT_S)
    hold.release()
    out2, _ = second.communicate(timeout=120)
    out1, _ = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, (out1, head + out2)
    logs = sorted(paths.build_logs_dir(reg.root).glob("tiny-*.log"))
    assert len(logs) == 2
    # never two writers at once: the second began after the first wrote its last line
    first_done = datetime.fromtimestamp(logs[0].stat().st_mtime, timezone.utc)
    assert "built containers/tiny.sif" in logs[0].read_text()
    assert _log_started(logs[1]) >= first_done


@real
@pytest.mark.slow
def test_no_block_exits_clearly_while_another_build_runs(real_project, hold):
    reg, first = _start_held(real_project, hold)
    res = invoke_cli("build", "tiny", "--no-block", cwd=reg.root, timeout=None)
    assert first.poll() is None, "the first build ended before --no-block was tried"
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=REACT_S)
    assert res.returncode == 2
    assert res.stderr.startswith("shipyard: error: ") and "another build of this environment is running (pid" \
        in res.stderr and "Traceback" not in res.stderr


# ----------------------------------------------------------------------------------------------- preflight


def test_preflight_names_missing_apptainer(tmp_path):
    problems = apptainer.preflight_apptainer(fakeroot=False, which=lambda name: None,
                                             environ={"APPTAINER_TMPDIR": str(tmp_path),
                                                      "APPTAINER_CACHEDIR": str(tmp_path)},
                                             min_free_gib={"tmpdir": 0, "cachedir": 0})
    assert len(problems) == 1 and problems[0].startswith("apptainer is not on PATH")
    assert problems[0].endswith(", or --slurm to build on a cluster node that has it")


def test_preflight_inside_a_slurm_job_does_not_advise_slurm(tmp_path):
    """A `build --slurm` job on a node without apptainer: --slurm would only send the build there again."""
    problems = apptainer.preflight_apptainer(fakeroot=False, which=lambda name: None,
                                             environ={"APPTAINER_TMPDIR": str(tmp_path),
                                                      "APPTAINER_CACHEDIR": str(tmp_path), "SLURM_JOB_ID": "7"},
                                             min_free_gib={"tmpdir": 0, "cachedir": 0})
    assert len(problems) == 1 and problems[0].endswith("or use --backend docker") and "--slurm" not in problems[0]


def test_preflight_names_missing_fakeroot_mapping(tmp_path):
    subuid = tmp_path / "subuid"
    subuid.write_text("bob:100000:65536\n")
    env = {"APPTAINER_TMPDIR": str(tmp_path), "APPTAINER_CACHEDIR": str(tmp_path)}
    common = dict(environ=env, uid=1234, user="alice", subuid=str(subuid), subgid=str(subuid),
                  min_free_gib={"tmpdir": 0, "cachedir": 0})
    problems = apptainer.preflight_apptainer(fakeroot=True,
                                             which=lambda n: "/x/apptainer" if n == "apptainer" else None, **common)
    assert len(problems) == 1 and "--fakeroot needs a subuid/subgid mapping for alice" in problems[0]
    # a mapping, or the fakeroot command, is enough
    subuid.write_text("alice:100000:65536\n")
    assert apptainer.preflight_apptainer(fakeroot=True, which=lambda n: "/x/" + n if n == "apptainer" else None,
                                         **common) == []
    subuid.write_text("")
    assert apptainer.preflight_apptainer(fakeroot=True, which=lambda n: "/x/" + n, **common) == []


def test_preflight_names_too_little_free_space(tmp_path):
    env = {"APPTAINER_TMPDIR": str(tmp_path / "not" / "yet"), "APPTAINER_CACHEDIR": str(tmp_path)}
    free_gib = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize / 2**30
    problems = apptainer.preflight_apptainer(fakeroot=False, which=lambda n: "/x/" + n, environ=env,
                                             min_free_gib={"tmpdir": free_gib + 100, "cachedir": 0})
    assert len(problems) == 1
    assert problems[0].startswith(f"APPTAINER_TMPDIR ({tmp_path / 'not' / 'yet'}) has ")
    assert "set APPTAINER_TMPDIR to a directory on a larger disk" in problems[0]


def test_build_without_apptainer_fails_in_preflight_with_one_line(project):
    res = invoke_cli("build", "tiny", cwd=project.root, env={**os.environ, "PATH": "/usr/bin:/bin"}, timeout=None)
    assert res.returncode == 2
    assert res.stderr.startswith("shipyard: error: preflight: apptainer is not on PATH")
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (project.root / "containers" / "tiny.json").exists()


def test_bad_flags_are_one_line_errors(project):
    with pytest.raises(ShipyardError, match="the apptainer backend makes only sif"):
        b.build(project, project.environment("tiny"), formats="sif,sqsh")
    with pytest.raises(ShipyardError, match="unknown format tar"):
        b.build(project, project.environment("tiny"), backend="docker", formats="tar")
    with pytest.raises(ShipyardError, match="--fakeroot applies to `apptainer build` only"):
        b.build(project, project.environment("tiny"), backend="docker", fakeroot=True)
    with pytest.raises(ShipyardError, match="--backend podman: unknown backend"):
        b.build(project, project.environment("tiny"), backend="podman")


def test_record_artifact_rerecords_after_in_place_change(project):
    """`invoke sign` appends to the SIF in place; the manifest follows (our own bookkeeping, on any file)."""
    sif = project.root / "containers" / "tiny.sif"
    sif.parent.mkdir()
    sif.write_bytes(b"\0" * 32 + b"SIF_MAGIC" + b"\0" * 64)
    with open(sif, "ab") as fh:
        fh.write(b"signature block")
    m = common.record_artifact(project, "tiny", "sif")
    assert m.artifacts["sif"].sha256 == common.sha256_file(sif)
    assert m.artifacts["sif"].intact(project.root)


@real
def test_a_symlink_to_a_directory_inside_a_copied_directory_is_refused(real_project, tmp_path):
    """At load and at build, one line naming the link; the build refuses before the tool runs."""
    reg_file = real_project.root / "registry.yaml"
    root = real_project.root
    reg_file.write_text(reg_file.read_text().replace(
        "    stack: base\n", "    stack: base\n    files:\n      - {src: data, dst: /opt/data}\n", 1))
    (root / "data").mkdir()
    (root / "data" / "a.txt").write_text("a\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x\n")
    (root / "data" / "link").symlink_to(outside)
    with pytest.raises(ShipyardError, match=r"files\[0\]\.src: data/link leads outside the project"):
        registry.load(reg_file)
    (root / "data" / "link").unlink()
    reg = registry.load(reg_file)
    (root / "inside").mkdir()
    (root / "data" / "link").symlink_to(root / "inside")  # planted after load: the build refuses
    with pytest.raises(ShipyardError, match="copies data into the image, but data/link is a symlink to a directory"):
        b.build(reg, reg.environment("tiny"))
    assert _builds(root) == 0
    (root / "data" / "link").unlink()
    (root / "data" / "link").symlink_to(root / "data" / "a.txt")  # to a file inside: hashed
    one = common.copied_files(root, ["data/a.txt"])["data/a.txt"]
    assert common.copied_files(root, ["data"]) == {"data/a.txt": one, "data/link": one}
