"""The pipeline's joints without a Slurm cluster: the checks enforced by render, build, stage, launch, modules and
shell (each refusal, and --force recorded), `invoke stage` into a real directory (atomic, record, permissions,
no-op, one-line storage errors on real read-only and full filesystems), the launcher's binding header, the chain
script, and doctor's image findings. The image is a real SIF made by the real Apptainer and recorded as `tiny`'s
build (the `built` fixture); a staged copy is run with it."""

from __future__ import annotations

import io
import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures_build import PROJECT_REGISTRY
from fixtures_launch import run_launch
from helpers_registry import shellcheck
import helpers_stage
from helpers_stage import storage

from shipyard import registry
from shipyard.commands import modules as modules_commands
from shipyard.commands import shell as shell_commands
from shipyard.containers import manifest as mf
from shipyard.commands import registry as registry_commands
from shipyard.commands.context import Context
from shipyard.commands.definitions import render as render_cmd
from shipyard.errors import ShipyardError
from shipyard.jobs import doctor
from shipyard.staging import record as staged
from shipyard.staging import versions
from shipyard.staging import stage as stage_module

pytestmark = pytest.mark.real_apptainer

# ------------------------------------------------------------------------------------------------ check and locks


def test_check_reports_a_missing_and_a_stale_lock_as_errors(proj):
    out = io.StringIO()
    assert registry_commands.check(Context(proj, out=out), "pytorch-2.3") == 1
    assert "definitions/pytorch-2.3.lock is missing" in out.getvalue() and "invoke lock pytorch-2.3" in out.getvalue()
    lock = proj.root / "definitions" / "pytorch-2.3.lock"
    lock.parent.mkdir()
    lock.write_text("# shipyard-lock\n# inputs-sha256: " + "0" * 64 + "\ntorch==2.3.1 --hash=sha256:" + "1" * 64 + "\n")
    out = io.StringIO()
    assert registry_commands.check(Context(proj, out=out), "pytorch-2.3") == 1
    assert "locked for other inputs" in out.getvalue()
    # stack: base with no extra pins has nothing to lock: no error
    assert registry_commands.check(Context(proj, out=io.StringIO()), "tiny", "lab") == 0


def test_render_refuses_what_check_refuses_and_force_writes_with_a_warning(proj, capsys):
    with pytest.raises(ShipyardError, match=r"render tiny-py313 refused: 1 error\(s\).*--force"):
        render_cmd(Context(proj, out=io.StringIO()), "tiny-py313")
    err = capsys.readouterr().err
    assert "severity" in err and "no wheel for Python 3.13" in err  # the same table as `invoke check`
    assert not (proj.root / "definitions" / "tiny-py313.def").exists()
    assert render_cmd(Context(proj, out=io.StringIO()), "tiny-py313", force=True) == 0
    assert "WARNING: --force: render tiny-py313 goes on" in capsys.readouterr().err
    assert (proj.root / "definitions" / "tiny-py313.def").exists()


def test_cli_build_refuses_before_building_and_exits_2(proj, invoke):
    res = invoke("build", "pytorch-2.3", cwd=proj.root)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("shipyard: error: build pytorch-2.3 refused")
    assert "pytorch-2.3.lock is missing" in res.stderr and "Traceback" not in res.stderr
    assert not (proj.root / "containers").exists()


def test_the_recorded_build_is_the_one_invoke_build_computes(built):
    """The `built` fixture records the busybox SIF as `tiny`'s build (tests/fixtures_sif.py); `invoke build tiny`
    with the same real Apptainer on PATH finds that record current and builds nothing."""
    out = io.StringIO()
    assert helpers_stage.build(built.path, "tiny", out=out) == 0
    assert out.getvalue().startswith("tiny: up to date (containers/tiny.sif; input hash"), out.getvalue()


# ------------------------------------------------------------------------------------------------ stage


def test_stage_copies_verifies_and_writes_a_readable_record(built, capsys):
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    dest = storage(built) / "tiny.sif"
    m = mf.read_manifest(built.root / "containers" / "tiny.json")
    assert dest.read_bytes() == (built.root / "containers" / "tiny.sif").read_bytes()
    assert rec.sha256 == m.artifacts["sif"].sha256 and rec.input_hash == m.input_hash
    assert rec.spec_sha256 == m.spec_hash and rec.source["kind"] == "containers"
    on_disk, why = staged.read_record(dest)
    assert on_disk == rec, why
    assert dest.stat().st_mode & 0o777 == 0o640 and staged.record_path(dest).stat().st_mode & 0o777 == 0o640
    assert staged.image_changed(dest, rec) is None
    assert not list(storage(built).glob("*.tmp-*"))  # nothing left beside it
    assert os.stat(dest).st_ino != os.stat(built.root / "containers" / "tiny.sif").st_ino  # a copy, not a link
    # the staged copy is an image the real Apptainer runs: a command only the image holds
    ran = subprocess.run(["apptainer", "exec", str(dest), "/opt/image/bin/image-tool"], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0 and ran.stdout == "image-tool ran\n", (ran.stdout, ran.stderr)


def test_identical_restage_is_a_no_op_and_mode_world_restages(built):
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    dest = storage(built) / "tiny.sif"
    before = (dest.stat().st_ino, dest.stat().st_mtime_ns, staged.record_path(dest).stat().st_mtime_ns)
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out)
    assert "nothing to do" in out.getvalue()
    assert (dest.stat().st_ino, dest.stat().st_mtime_ns, staged.record_path(dest).stat().st_mtime_ns) == before
    helpers_stage.stage(built, "tiny", "lab", mode="world", out=io.StringIO())
    assert dest.stat().st_mode & 0o777 == 0o644


def test_restage_keeps_its_readers_and_narrows_only_when_told(built):
    """A world stage stays world without --mode (the default would lock every student outside the group out, and
    their jobs would fail on an image they could read yesterday); an explicit --mode narrows and says whom it drops."""
    helpers_stage.stage(built, "tiny", "lab", mode="world", out=io.StringIO())
    dest = storage(built) / "tiny.sif"
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out, force=True)
    assert "keeping its readers (mode 0644, was 0644)" in out.getvalue()
    assert dest.stat().st_mode & 0o777 == 0o644 and staged.record_path(dest).stat().st_mode & 0o777 == 0o644
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", mode="group", out=out)
    assert "narrowing mode 0644 to 0640 as --mode asks: everyone else can no longer read" in out.getvalue()
    assert dest.stat().st_mode & 0o777 == 0o640 and staged.record_path(dest).stat().st_mode & 0o777 == 0o640


def test_stage_link_hard_links_on_the_same_filesystem(built):
    helpers_stage.stage(built, "tiny", "lab", link=True, out=io.StringIO())
    assert os.stat(storage(built) / "tiny.sif").st_ino == os.stat(built.root / "containers" / "tiny.sif").st_ino


def test_tampered_source_is_refused(built):
    sif = built.root / "containers" / "tiny.sif"
    with open(sif, "ab") as fh:
        fh.write(b"x")
    with pytest.raises(ShipyardError, match="changed since it was built"):
        helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())


@pytest.mark.parametrize("mode", ["0666", "0755", "rw", "0600x"])
def test_bad_modes_are_refused(built, mode):
    with pytest.raises(ShipyardError, match="--mode"):
        helpers_stage.stage(built, "tiny", "lab", mode=mode, out=io.StringIO())


def test_stage_refuses_missing_storage_in_one_line(built):
    shutil.rmtree(storage(built))
    with pytest.raises(ShipyardError, match=r"does not exist \(clusters\.lab\.storage\); create it"):
        helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())


def _mount_tmpfs(path: Path, *opts: str) -> None:
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.decode().strip()}): needs root")


@pytest.fixture
def mounted(built):
    path = storage(built)
    yield path
    subprocess.run(["umount", str(path)], capture_output=True)


def test_stage_refuses_read_only_storage_in_one_line(mounted, built):
    _mount_tmpfs(mounted, "size=64m", "ro")  # a real read-only filesystem: even root cannot write there
    with pytest.raises(ShipyardError, match="no permission to write there"):
        helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())


def test_stage_refuses_too_little_space_in_one_line(mounted, built):
    _mount_tmpfs(mounted, "size=1m")
    with pytest.raises(ShipyardError, match=r"too little space: .* free, the image needs"):
        helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    assert os.listdir(mounted) == [".tiny.sif.lock"]  # the per-image lock stays, like an installer's


def test_stage_runs_the_checks_and_force_records_them(built, capsys):
    with pytest.raises(ShipyardError, match="stage tiny refused: .* on cluster lab-old"):
        helpers_stage.stage(built, "tiny", "lab-old", out=io.StringIO())
    assert "driver 470.57.02 is too old" in capsys.readouterr().err
    rec = helpers_stage.stage(built, "tiny", "lab-old", force=True, out=io.StringIO())
    assert any("driver 470.57.02 is too old" in f for f in rec.forced_checks)


def test_stage_refuses_a_cluster_without_images_and_an_unbuilt_env(built):
    with pytest.raises(ShipyardError, match="runs no image: nothing to stage"):
        helpers_stage.stage(built, "tiny", "sandbox", out=io.StringIO())
    with pytest.raises(ShipyardError, match="it was never built; run `invoke build tiny-mismatch`"):
        helpers_stage.stage(built, "tiny-mismatch", "lab", out=io.StringIO())
    # pyxis clusters import a docker image: an oras:// (SIF) registry is refused, and so is a docker:// one for SIFs
    with pytest.raises(ShipyardError, match=r"registries.local: oras://.* pyxis clusters import a docker image"):
        helpers_stage.stage(built, "tiny", "lab-pyxis", source="registry", out=io.StringIO())
    with pytest.raises(ShipyardError, match=r"registries.local-docker: docker://.* apptainer clusters stage a SIF"):
        helpers_stage.stage(built, "tiny", "lab", source="registry", registry="local-docker", tag="t",
                            out=io.StringIO())
    with pytest.raises(ShipyardError, match="no push of tiny to registry 'local-docker' is recorded here; give --tag"):
        helpers_stage.stage(built, "tiny", "lab-pyxis", source="registry", registry="local-docker",
                            out=io.StringIO())


def test_import_job_script_runs_enroot_on_the_build_partition(built, tmp_path):
    text = stage_module.render_import_job(built, built.environment("tiny"), built.cluster("lab"), "dockerd://shipyard/tiny:abc",
                                tmp_path / "it's here" / "tiny.sqsh.tmp-1")
    assert "#SBATCH --partition=gpu" in text
    assert "exec enroot import -o '" in text and "dockerd://shipyard/tiny:abc" in text
    assert "ENROOT_ALLOW_HTTP" not in text
    res = shellcheck(text, "bash")
    assert res.returncode == 0, res.stdout


def test_import_job_from_a_plain_http_docker_registry_allows_http_in_the_job_only(built, tmp_path):
    target = built.registry_target("local-docker")
    uri = stage_module.enroot_uri(target, "tiny", "v1")
    assert uri == "docker://127.0.0.1:9#shipyard/tiny:v1"  # enroot's '#' between the registry and the image
    text = stage_module.render_import_job(built, built.environment("tiny"), built.cluster("lab"), uri,
                                          tmp_path / "tiny.sqsh.tmp-1", allow_http=True)
    assert "\nexport ENROOT_ALLOW_HTTP=yes\n" in text
    assert "exec enroot import -o " in text and "'docker://127.0.0.1:9#shipyard/tiny:v1'" in text
    res = shellcheck(text, "bash")
    assert res.returncode == 0, res.stdout


def test_cli_stage_errors_are_one_line_exit_2(built, invoke):
    res = invoke("stage", "tiny", "--cluster", "lab", "--mode", "0777", cwd=built.root)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


# ------------------------------------------------------------------------------------------------ launch binding


def _launch(reg, **flags) -> str:
    """`invoke launch ... -- train.py` run from the project directory, where the script is (launch checks it)."""
    (reg.root / "train.py").touch()
    cwd = os.getcwd()
    os.chdir(reg.root)
    try:
        return run_launch(["train.py"], registry_path=reg.path, **flags)
    finally:
        os.chdir(cwd)


def test_launcher_names_the_staged_image_and_checks_it_before_srun(built):
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    text = _launch(built, environment="tiny", cluster="lab", dry_run=True)
    assert f"# image sha256 {rec.sha256}, input hash {rec.input_hash}" in text
    assert f"stage record {versions.version_path(storage(built) / 'tiny.sif', rec.sha256)}.json" in text
    check = text.index("matches its stage record")
    assert check < text.index("\nsrun ")
    res = shellcheck(text.split("\n# --chain")[0], "bash")
    assert res.returncode == 0, res.stdout


def test_the_jobs_shell_check_and_python_apply_one_unchanged_rule(built):
    """The pre-srun block, run by bash on the staged image, agrees with :mod:`shipyard.identity`: it passes on the
    staged image, and refuses it once its mtime moved by a nanosecond with the size unchanged (as Python does)."""
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    text = _launch(built, environment="tiny", cluster="lab", dry_run=True)
    start = text.index("\nimage=")
    block = text[start:text.index("\n", text.index("matches its stage record", start))]
    dest = storage(built) / "tiny.sif"
    ok = subprocess.run(["bash", "-c", block], capture_output=True, text=True)
    assert ok.returncode == 0 and "matches its stage record" in ok.stdout, ok.stderr
    st = dest.stat()
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert staged.image_changed(dest, rec) is not None
    moved = subprocess.run(["bash", "-c", block], capture_output=True, text=True)
    assert moved.returncode == 3 and "changed after it was staged" in moved.stderr, (moved.stdout, moved.stderr)


def test_launcher_binds_to_the_build_manifest_before_staging(built):
    m = mf.read_manifest(built.root / "containers" / "tiny.json")
    text = _launch(built, environment="tiny", cluster="lab", dry_run=True)
    assert f"# image sha256 {m.artifacts['sif'].sha256}" in text and "build manifest" in text


def test_unbound_launcher_is_refused_and_image_opts_out(proj):
    with pytest.raises(ShipyardError, match=r"no image to bind the launcher to .* give --image"):
        _launch(proj, environment="tiny", cluster="lab", dry_run=True)
    text = _launch(proj, environment="tiny", cluster="lab", image="/elsewhere/x.sif", dry_run=True)
    assert "# image given with --image: not bound to a build" in text
    assert "not checked against a stage record" in text and "want_sha=" not in text


def test_launch_refuses_what_check_refuses_and_force_is_in_the_header(built, capsys):
    with pytest.raises(ShipyardError, match="launch refused: .* on cluster lab-old"):
        _launch(built, environment="tiny", cluster="lab-old", image="/x.sif", dry_run=True)
    assert "driver 470.57.02 is too old" in capsys.readouterr().err
    text = _launch(built, environment="tiny", cluster="lab-old", image="/x.sif", force=True, dry_run=True)
    assert "# WARNING: written with --force despite the `invoke check` ERROR clusters.lab-old.driver" in text
    assert " --force " in text.splitlines()[2]  # the regenerate line repeats it


def test_chain_without_submit_writes_a_submit_script_and_dry_run_shows_the_chain(proj, tmp_path):
    # the default launcher name is train-<cluster> (launchers for two clusters do not overwrite each other)
    out = _launch(proj, environment="tiny", cluster="sandbox", chain=3)
    script = proj.root / "launch" / "train-sandbox.chain.sh"
    assert "wrote launch/train-sandbox.chain.sh" in out and f"invoke sandbox.exec -- bash {script}" in out
    text = script.read_text()
    assert "for segment in $(seq 1 3)" in text and '--dependency="afterany:$prev"' in text
    assert shellcheck(text, "bash").returncode == 0
    dry = _launch(proj, environment="tiny", cluster="sandbox", chain=3, dry_run=True)
    assert "#   job 1: sbatch --parsable train-sandbox.sbatch" in dry
    assert "#   job 3: sbatch --parsable --dependency=afterany:<job 2> train-sandbox.sbatch" in dry
    # the script really submits the chain: run it with a recording sbatch on PATH
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text('#!/bin/sh\necho "$*" >> "$CALLS"\necho $(( $(wc -l < "$CALLS") + 100 ))\n')
    (fake / "sbatch").chmod(0o755)
    calls = tmp_path / "calls"
    res = subprocess.run(["bash", str(script)], env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
                                                     "CALLS": str(calls)}, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = calls.read_text().splitlines()
    launcher = str(proj.root / "launch" / "train-sandbox.sbatch")
    assert lines == [f"--parsable {launcher}", f"--parsable --dependency=afterany:101 {launcher}",
                     f"--parsable --dependency=afterany:102 {launcher}"]


# ------------------------------------------------------------------------------------------------ modules, shell


def test_modules_and_shell_refuse_what_check_refuses(built, tmp_path):
    ctx = Context(built, out=io.StringIO(), err=io.StringIO())
    with pytest.raises(ShipyardError, match="modules for tiny refused"):
        modules_commands.modules(ctx, "tiny", "lab-old", tmp_path / "m")
    assert modules_commands.modules(ctx, "tiny", "lab-old", tmp_path / "m", force=True) == 0
    assert (tmp_path / "m" / "modulefiles" / "shipyard" / "tiny.lua").exists()
    with pytest.raises(ShipyardError, match="shell refused"):
        shell_commands.shell(ctx, "tiny", "lab-old", dry_run=True)
    assert shell_commands.shell(ctx, "tiny", "lab-old", dry_run=True, force=True) == 0


# ------------------------------------------------------------------------------------------------ doctor


def test_doctor_reports_each_environment_image(built):
    env = built.environment("tiny")
    finds = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}
    assert finds["tiny"].status == doctor.FAIL and "is not there" in finds["tiny"].detail
    assert finds["tiny-mismatch"].status == doctor.WARN  # not the environment being checked
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    finds = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}
    assert finds["tiny"].status == doctor.PASS and "matches its stage record" in finds["tiny"].detail
    with open(storage(built) / "tiny.sif", "ab") as fh:
        fh.write(b"tampered")
    finds = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}
    assert finds["tiny"].status == doctor.FAIL and "changed after it was staged" in finds["tiny"].detail


def test_doctor_reads_the_image_as_a_student_would_not_as_root(built):
    """Root reads every file: doctor run as root tries the staged version as another uid, the reader its recorded
    mode was meant for, so an image a student's job cannot open is a FAIL naming the file and the uid tried."""
    if os.geteuid() != 0:
        pytest.fail("reading as another uid needs root (as a user, doctor reads as that user)")
    env = built.environment("tiny")
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO(), mode="world")
    version = versions.current(storage(built) / "tiny.sif")
    finds = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}
    assert finds["tiny"].status == doctor.PASS, finds["tiny"]
    nobody = pwd.getpwnam(doctor.facts()["student_probe_user"]).pw_uid
    version.chmod(0o640)  # root:root 0640: root still reads it, no student does
    assert os.access(version, os.R_OK)
    finds = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}
    tiny = finds["tiny"]
    assert tiny.status == doctor.FAIL, tiny
    assert f"{version} is not readable by other users (tried uid {nobody} " in tiny.detail, tiny.detail
    assert "Permission denied" in tiny.detail and "mode 0644" in tiny.detail and "--mode 0644" in tiny.fix
    version.chmod(0o644)  # the record too: the job reads it before the image
    staged.record_path(version).chmod(0o600)
    tiny = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}["tiny"]
    assert tiny.status == doctor.FAIL and str(staged.record_path(version)) in tiny.detail, tiny.detail
    staged.record_path(version).chmod(0o644)
    storage(built).chmod(0o750)  # a folder above that the world cannot search fails the same way
    tiny = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}["tiny"]
    assert tiny.status == doctor.FAIL and "Permission denied" in tiny.detail, tiny.detail
    storage(built).chmod(0o755)  # readable again (the chmods moved its ctime, which the record's own check tells)
    tiny = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}["tiny"]
    assert "is not readable" not in tiny.detail, tiny.detail


def test_doctor_reads_a_group_stage_as_a_member_of_the_files_group(built):
    """A group stage (0640) is meant for the file's group: doctor reads it as another uid in that group only."""
    if os.geteuid() != 0:
        pytest.fail("reading as another uid needs root (as a user, doctor reads as that user)")
    env = built.environment("tiny")
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO(), mode="group")
    version = versions.current(storage(built) / "tiny.sif")
    assert {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}["tiny"].status \
        == doctor.PASS
    version.chmod(0o600)
    tiny = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}["tiny"]
    assert tiny.status == doctor.FAIL and "is not readable by its group" in tiny.detail, tiny.detail
    assert f"with gid {version.stat().st_gid})" in tiny.detail


def test_doctor_as_a_user_judges_the_read_bits_against_the_staged_mode(built, monkeypatch):
    """Someone who cannot become another uid (the instructor's own account) reads the image as its owner; doctor
    then compares the files' read bits with the mode they were staged with."""
    env = built.environment("tiny")
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO(), mode="world")
    version = versions.current(storage(built) / "tiny.sif")
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 1000)
    assert {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}["tiny"].status \
        == doctor.PASS
    version.chmod(0o640)
    tiny = {f.detail.split(":")[0]: f for f in doctor.images(built, built.cluster("lab"), env)}["tiny"]
    assert tiny.status == doctor.FAIL, tiny
    assert f"{version} is not readable by other users: mode 0640 (staged for them with mode 0644)" in tiny.detail


def test_doctor_read_only_storage_is_not_a_failure():
    cl = registry.load_text(PROJECT_REGISTRY.format(registry="x"), "r.yaml").cluster("sandbox")
    probe = {"storage": ["present"], "storage_writable": ["no"], "user": ["student"]}
    finds = doctor._storage(cl, "login", probe, "/course/images")
    assert [f.status for f in finds] == [doctor.WARN] and "read-only for student" in finds[0].detail


def test_a_record_without_or_with_another_schema_means_stage_again(built):
    """An unversioned record (older shipyard, whole-second mtime), schema 1 (no inode and ctime) or one of another
    schema is one line saying to
    stage again; `invoke stage` then replaces it instead of calling the image up to date."""
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    dest = storage(built) / "tiny.sif"
    path = staged.record_path(dest)
    data = json.loads(path.read_text())
    assert data["schema"] == staged.SCHEMA == 2 and "mtime_ns" in data and "mtime" not in data
    assert "ino" in data and "ctime_ns" in data
    for schema, why in ((None, "has no schema field"), (1, "stage record schema 1, this shipyard reads schema 2"),
                        (3, "stage record schema 3, this shipyard reads schema 2")):
        old = {k: v for k, v in data.items() if k != "schema"} | ({"schema": schema} if schema else {})
        path.write_text(json.dumps(old))
        rec, msg = staged.read_record(dest)
        assert rec is None and why in msg and msg.endswith("stage the image again")
    out = io.StringIO()
    helpers_stage.stage(built, "tiny", "lab", out=out)
    assert out.getvalue().startswith("staged tiny") and json.loads(path.read_text())["schema"] == 2
