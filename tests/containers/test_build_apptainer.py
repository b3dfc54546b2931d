"""apptainer backend of `invoke build`, against the strict apptainer build double (tests/doubles/apptainer).

The double is not apptainer: it checks the arguments and files shipyard hands it and writes a SIF file made with
siftool. What is tested here is shipyard's side: temp file + atomic rename, no artifact after failure or interrupt,
the lock, the log, the cache fast path, the manifest and the preflight messages.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import fixtures_build as fb
import pytest
from fixtures_build import read_calls
from fixtures_invoke import invoke_cli

from shipyard.containers import apptainer, common
from shipyard.containers import engine as b
from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError

pytestmark = pytest.mark.double


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "containers").iterdir() if p.is_file())


def test_build_renames_temp_into_place_and_records_manifest(project, apptainer_double, capsys):
    m = b.build(project, project.environment("tiny"))
    root = project.root
    sif = root / "containers" / "tiny.sif"
    calls = read_calls(apptainer_double)
    builds = [c for c in calls if c["argv"][0] == "build"]
    assert len(builds) == 1
    # built into a temp file beside the target, from the rendered definition, in the project root
    assert builds[0]["argv"] == ["build", f"containers/tiny.sif.tmp-{os.getpid()}", "definitions/tiny.def"]
    assert builds[0]["cwd"] == str(root)
    assert sif.read_bytes()[32:41] == b"SIF_MAGIC"
    assert not list((root / "containers").glob("*.tmp*"))
    assert (root / "definitions" / "tiny.def").read_text().startswith("Bootstrap:") or \
        "Bootstrap:" in (root / "definitions" / "tiny.def").read_text()
    on_disk = mf.read_manifest(root / "containers" / "tiny.json")
    assert on_disk == m
    assert m.status == "ok" and m.backend == "apptainer"
    assert m.tools == {"apptainer": "apptainer version 1.3.6"}
    assert m.pins["torch"] == "2.3.1" and m.spec_hash == project.environment("tiny").spec_hash
    assert m.artifacts["sif"].sha256 == common.sha256_file(sif)
    assert m.artifacts["sif"].size == sif.stat().st_size
    assert m.started <= m.finished and m.host and m.pid is None
    log = root / m.log
    assert "INFO:    Build complete" in log.read_text()
    out = capsys.readouterr().out
    assert "[00:00] INFO:    Starting build..." in out  # streamed with the elapsed-time progress prefix


def test_second_build_is_cache_hit_without_rehash_and_force_rebuilds(project, apptainer_double, capsys, monkeypatch):
    b.build(project, project.environment("tiny"))
    hashed = []
    real = common.sha256_file
    monkeypatch.setattr(common, "sha256_file", lambda p: hashed.append(p) or real(p))
    m = b.build(project, project.environment("tiny"))
    assert "up to date" in capsys.readouterr().out
    assert hashed == []  # fast path: stat only, the SIF is not read
    assert len([c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]) == 1
    b.build(project, project.environment("tiny"), force=True)
    assert len([c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]) == 2
    assert mf.read_manifest(project.root / "containers" / "tiny.json").finished >= m.finished


def test_cache_misses_when_artifact_changed_or_tool_upgraded(project, apptainer_double, monkeypatch, tmp_path):
    tooldir = tmp_path / "tool"
    tooldir.mkdir()
    tool = tooldir / "apptainer"
    shutil.copy2(fb.APPTAINER_DOUBLE / "apptainer", tool)
    monkeypatch.setenv("PATH", f"{tooldir}{os.pathsep}{os.environ['PATH']}")
    b.build(project, project.environment("tiny"))
    sif = project.root / "containers" / "tiny.sif"
    with open(sif, "ab") as fh:  # same path, different size: not intact
        fh.write(b"x")
    b.build(project, project.environment("tiny"))
    assert len([c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]) == 2
    b.build(project, project.environment("tiny"))  # same binary: its recorded version is reused, nothing rebuilt
    assert len([c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]) == 2
    # the tool is upgraded in place (new binary: other size and mtime) and reports another version
    tool.write_text(tool.read_text().replace('"SHIPYARD_DOUBLE_APPTAINER_VERSION", "1.3.6"',
                                             '"SHIPYARD_DOUBLE_APPTAINER_VERSION", "1.4.0"'))
    b.build(project, project.environment("tiny"))
    assert len([c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]) == 3
    m = mf.read_manifest(project.root / "containers" / "tiny.json")
    assert m.tools["apptainer"] == "apptainer version 1.4.0"
    assert m.tool_ids["apptainer"].startswith(str(tool) + ":")


def test_fakeroot_is_passed(project, apptainer_double):
    b.build(project, project.environment("tiny"), fakeroot=True)
    build = [c for c in read_calls(apptainer_double) if c["argv"][0] == "build"][0]
    assert build["argv"][:2] == ["build", "--fakeroot"]


def test_failed_build_leaves_no_artifact_and_manifest_says_failed(project, apptainer_double, monkeypatch):
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_FAIL", "255")
    with pytest.raises(ShipyardError, match=r"`apptainer build` exited with 255"):
        b.build(project, project.environment("tiny"))
    assert _files(project.root) == ["tiny.json", "tiny.json.lock", "tiny.lock"]
    m = mf.read_manifest(project.root / "containers" / "tiny.json")
    assert m.status == "failed" and "exited with 255" in m.error
    assert "test double told to fail" in (project.root / m.log).read_text()


def test_failed_rebuild_keeps_previous_good_image(project, apptainer_double, monkeypatch):
    b.build(project, project.environment("tiny"))
    before = (project.root / "containers" / "tiny.sif").read_bytes()
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_FAIL", "1")
    with pytest.raises(ShipyardError):
        b.build(project, project.environment("tiny"), force=True)
    assert (project.root / "containers" / "tiny.sif").read_bytes() == before
    assert not list((project.root / "containers").glob("*.tmp*"))
    assert mf.read_manifest(project.root / "containers" / "tiny.json").status == "failed"
    monkeypatch.delenv("SHIPYARD_DOUBLE_APPTAINER_FAIL")
    b.build(project, project.environment("tiny"))  # a failed last build is never a cache hit
    assert len([c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]) == 2


def test_tool_that_writes_no_sif_is_a_failure(project, apptainer_double, monkeypatch):
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_NOSIF", "1")
    with pytest.raises(ShipyardError, match="no SIF magic"):
        b.build(project, project.environment("tiny"))
    assert not (project.root / "containers" / "tiny.sif").exists()


def test_double_rejects_an_existing_target(project, apptainer_double, tmp_path):
    """The double is strict: it refuses what shipyard must never do (overwrite in place)."""
    target = tmp_path / "x.sif"
    target.write_text("old")
    res = subprocess.run(["apptainer", "build", str(target), str(tmp_path / "none.def")], capture_output=True,
                         text=True)
    assert res.returncode == 64 and "already exists" in res.stderr


# The double sleeps far longer than a test waits for the build to react, so "ignored the signal" (still sleeping
# at the deadline) cannot be mistaken for "slow to clean up".
DOUBLE_SLEEP_S = "300"
REACT_S = 30


def _default_signals() -> None:
    """In the child: SIGINT/SIGTERM as a user's terminal gives them. A shell running pytest in the background
    (`cmd &`) hands its children SIGINT *ignored*, exec keeps that, and the build would never see the interrupt."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _start_build(project, *extra, env=None) -> subprocess.Popen:
    return invoke_cli.popen("build", "tiny", *extra, cwd=project.root, env=env or os.environ.copy(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_default_signals)


def _processes_writing(containers: Path) -> list[int]:
    """PIDs whose command line names a temp file in ``containers`` (the build tool of a build we started)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b".sif.tmp-" in cmd and str(containers).encode() in (d / "cwd").resolve().as_posix().encode() + cmd:
                pids.append(int(d.name))
    return pids


def _wait_for(pred, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
def test_interrupt_leaves_no_partial_and_manifest_failed(project, apptainer_double, monkeypatch, sig, code):
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_SLEEP", DOUBLE_SLEEP_S)
    proc = _start_build(project)
    containers = project.root / "containers"
    assert _wait_for(lambda: list(containers.glob("tiny.sif.tmp-*"))), "the double never started writing"
    os.kill(proc.pid, sig)
    try:
        out, _ = proc.communicate(timeout=REACT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the build did not react to {sig.name} within {REACT_S} s (the double sleeps {DOUBLE_SLEEP_S} s)")
    assert proc.returncode == code, out
    assert "interrupted" in out
    assert not list(containers.glob("*.tmp*")) and not (containers / "tiny.sif").exists()
    m = mf.read_manifest(containers / "tiny.json")
    assert m.status == "failed" and "interrupted" in m.error


def test_sigkill_of_builder_is_detected_and_cleaned_by_next_build(project, apptainer_double, monkeypatch):
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_SLEEP", DOUBLE_SLEEP_S)
    proc = _start_build(project)
    containers = project.root / "containers"
    assert _wait_for(lambda: list(containers.glob("tiny.sif.tmp-*")))
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=REACT_S)
    assert not (containers / "tiny.sif").exists()  # never a partial file at the target path
    assert mf.read_manifest(containers / "tiny.json").status == "building"  # nobody could write "failed"
    # the orphaned tool got SIGTERM through PR_SET_PDEATHSIG instead of writing on
    assert _wait_for(lambda: not _processes_writing(containers), 10)
    monkeypatch.delenv("SHIPYARD_DOUBLE_APPTAINER_SLEEP")
    res = invoke_cli("build", "tiny", cwd=project.root, timeout=None)
    assert res.returncode == 0, res.stderr
    assert "was killed before it finished" in res.stdout
    assert not list(containers.glob("*.tmp*"))
    assert mf.read_manifest(containers / "tiny.json").status == "ok"


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


def test_second_build_waits_for_the_first_and_they_serialize(project, apptainer_double, monkeypatch, tmp_path):
    # the first build holds at the double's gate until the second says it waits: no race with a fixed sleep
    gate = tmp_path / "gate"
    first = _start_build(project, "--force", env={**os.environ, "SHIPYARD_DOUBLE_APPTAINER_GATE": str(gate)})
    containers = project.root / "containers"
    assert _wait_for(lambda: list(containers.glob("tiny.sif.tmp-*")))
    second = _start_build(project, "--force")
    head = _read_until(second, "waiting for the running build (pid", REACT_S)
    gate.touch()
    out2, _ = second.communicate(timeout=60)
    out1, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, (out1, head + out2)
    builds = sorted((c for c in read_calls(apptainer_double) if c["argv"][0] == "build"), key=lambda c: c["start"])
    assert len(builds) == 2
    assert builds[0]["end"] <= builds[1]["start"]  # never two writers at once


def test_no_block_exits_clearly_while_another_build_runs(project, apptainer_double, monkeypatch):
    # the first build sleeps until it is stopped below: a fixed short sleep lost the race on a busy CI machine
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_SLEEP", DOUBLE_SLEEP_S)
    first = _start_build(project)
    containers = project.root / "containers"
    assert _wait_for(lambda: list(containers.glob("tiny.sif.tmp-*")))
    res = invoke_cli("build", "tiny", "--no-block", cwd=project.root, timeout=None)
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


def test_preflight_names_missing_fakeroot_mapping(tmp_path):
    subuid = tmp_path / "subuid"
    subuid.write_text("bob:100000:65536\n")
    env = {"APPTAINER_TMPDIR": str(tmp_path), "APPTAINER_CACHEDIR": str(tmp_path)}
    common = dict(environ=env, uid=1234, user="alice", subuid=str(subuid), subgid=str(subuid),
                  min_free_gib={"tmpdir": 0, "cachedir": 0})
    problems = apptainer.preflight_apptainer(fakeroot=True, which=lambda n: "/x/apptainer" if n == "apptainer" else None,
                                     **common)
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


def test_build_without_apptainer_fails_in_preflight_with_one_line(project, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH but an empty dir
    res = invoke_cli("build", "tiny", cwd=project.root, env={**os.environ, "PATH": "/usr/bin:/bin"}, timeout=None)
    assert res.returncode == 2
    assert res.stderr.startswith("shipyard: error: preflight: apptainer is not on PATH")
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (project.root / "containers" / "tiny.json").exists()


def test_bad_flags_are_one_line_errors(project, apptainer_double):
    with pytest.raises(ShipyardError, match="the apptainer backend makes only sif"):
        b.build(project, project.environment("tiny"), formats="sif,sqsh")
    with pytest.raises(ShipyardError, match="unknown format tar"):
        b.build(project, project.environment("tiny"), backend="docker", formats="tar")
    with pytest.raises(ShipyardError, match="--fakeroot applies to `apptainer build` only"):
        b.build(project, project.environment("tiny"), backend="docker", fakeroot=True)
    with pytest.raises(ShipyardError, match="--backend podman: unknown backend"):
        b.build(project, project.environment("tiny"), backend="podman")


def test_record_artifact_rerecords_after_in_place_change(project, apptainer_double):
    b.build(project, project.environment("tiny"))
    sif = project.root / "containers" / "tiny.sif"
    with open(sif, "ab") as fh:
        fh.write(b"signature block")
    m = common.record_artifact(project, "tiny", "sif")
    assert m.artifacts["sif"].sha256 == common.sha256_file(sif)
    assert m.artifacts["sif"].intact(project.root)


def test_manifest_json_is_valid_and_has_no_credentials(project, apptainer_double, monkeypatch, capsys):
    secret = "pa55-w0rd-never-in-files"
    monkeypatch.setenv("SHIPYARD_REGISTRY_PASSWORD", secret)
    monkeypatch.setenv("SHIPYARD_REGISTRY_USERNAME", "alice")
    b.build(project, project.environment("tiny"))
    json.loads((project.root / "containers" / "tiny.json").read_text())
    for p in project.root.rglob("*"):
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), p
    assert secret not in capsys.readouterr().out


def _with_files(project) -> Path:
    """Give `tiny` a `files:` entry (data/config.txt -> /opt/config.txt) and return the source file."""
    reg_file = project.root / "registry.yaml"
    reg_file.write_text(reg_file.read_text().replace(
        "    stack: base\n", "    stack: base\n    files:\n      - {src: data/config.txt, dst: /opt/config.txt}\n", 1))
    src = project.root / "data" / "config.txt"
    src.parent.mkdir()
    src.write_text("lr: 0.1\n")
    return src


def test_copied_files_are_part_of_the_cache_key(project, apptainer_double):
    from shipyard import registry

    src = _with_files(project)
    reg = registry.load(project.root / "registry.yaml")
    b.build(reg, reg.environment("tiny"))
    b.build(reg, reg.environment("tiny"))
    assert len([c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]) == 1
    src.write_text("lr: 0.2\n")  # same definition text, other content copied in: a rebuild
    b.build(reg, reg.environment("tiny"))
    assert len([c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]) == 2
    src.unlink()
    with pytest.raises(ShipyardError, match="data/config.txt: the definition copies it into the image, but it "
                                            "does not exist"):
        b.build(reg, reg.environment("tiny"))


def test_a_symlink_to_a_directory_inside_a_copied_directory_is_refused(project, apptainer_double, tmp_path):
    """Issue 19, security 6 (failed on e0c4781: the link was neither checked nor hashed, and Apptainer's copy
    brought the outside directory into the image). At load and at build, one line naming the link."""
    from shipyard import registry

    reg_file = project.root / "registry.yaml"
    reg_file.write_text(reg_file.read_text().replace(
        "    stack: base\n", "    stack: base\n    files:\n      - {src: data, dst: /opt/data}\n", 1))
    (project.root / "data").mkdir()
    (project.root / "data" / "a.txt").write_text("a\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x\n")
    (project.root / "data" / "link").symlink_to(outside)
    with pytest.raises(ShipyardError, match=r"files\[0\]\.src: data/link leads outside the project"):
        registry.load(reg_file)
    (project.root / "data" / "link").unlink()
    reg = registry.load(reg_file)
    (project.root / "inside").mkdir()
    (project.root / "data" / "link").symlink_to(project.root / "inside")  # planted after load: the build refuses
    with pytest.raises(ShipyardError, match="copies data into the image, but data/link is a symlink to a directory"):
        b.build(reg, reg.environment("tiny"))
    assert not [c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]
    (project.root / "data" / "link").unlink()
    (project.root / "data" / "link").symlink_to(project.root / "data" / "a.txt")  # to a file inside: hashed
    from shipyard.containers.common import copied_files
    assert copied_files(project.root, ["data"]) == {"data/a.txt": copied_files(project.root, ["data/a.txt"])[
        "data/a.txt"], "data/link": copied_files(project.root, ["data/a.txt"])["data/a.txt"]}
