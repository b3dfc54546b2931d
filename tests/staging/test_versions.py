"""Versioned staging: each stage keeps its build under a name with its hash and moves the current pointer; a
launcher written before the next stage still finds (and checks) its own version; --rollback, --list and --prune."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import helpers_stage
import pytest
from fixtures_sif import record_build
from helpers_stage import storage
from test_stage import _launch

from shipyard.errors import ShipyardError
from shipyard.staging import record as staged
from shipyard.staging import versions

pytestmark = pytest.mark.real_apptainer


def _check_block(text: str) -> str:
    """The launcher's pre-srun image check, as bash runs it."""
    start = text.index("\nimage=")
    return text[start:text.index("\n", text.index("matches its stage record", start))]


def _check(block: str, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    return subprocess.run(["bash", "-c", block], capture_output=True, text=True, env=env)


def _second_build(reg, staging_sif: Path, tmp_path: Path) -> None:
    """Another finished build of `tiny` in containers/ (other bytes, so another sha256)."""
    other = tmp_path / "v2.sif"
    shutil.copy(staging_sif, other)
    with open(other, "ab") as fh:
        fh.write(b"\0" * 64)
    record_build(reg, "tiny", other)


def _stage(reg, **flags) -> str:
    out = io.StringIO()
    helpers_stage.stage(reg, "tiny", "lab", out=out, **flags)
    return out.getvalue()


def _action(reg, **flags) -> str:
    from shipyard.commands import stage as stage_commands

    ctx = helpers_stage.context(reg)
    assert stage_commands.stage(ctx, "tiny", "lab", **flags) == 0
    return ctx.out.getvalue()


def test_a_new_stage_leaves_the_version_a_queued_job_was_written_for(built, staging_sif, tmp_path):
    dest = storage(built) / "tiny.sif"
    rec1 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    v1 = versions.version_path(dest, rec1.sha256)
    assert versions.current(dest) == v1 and dest.is_symlink() and os.readlink(dest) == v1.name
    queued = _check_block(_launch(built, environment="tiny", cluster="lab", dry_run=True))
    assert str(v1) in queued
    _second_build(built, staging_sif, tmp_path)
    said = _stage(built)
    rec2, _ = staged.read_record(dest)
    v2 = versions.version_path(dest, rec2.sha256)
    assert rec2.sha256 != rec1.sha256 and versions.current(dest) == v2 and "tiny.sif now names it" in said
    assert v1.is_file() and staged.read_record(v1)[0] == rec1  # the old version and its record stay
    ran = _check(queued, tmp_path / "home")  # the job queued before the update: its image is still there
    assert ran.returncode == 0 and "matches its stage record" in ran.stdout, ran.stderr
    fresh = _launch(built, environment="tiny", cluster="lab", dry_run=True)
    assert str(v2) in fresh and str(v1) not in fresh


def test_rollback_list_and_prune(built, staging_sif, tmp_path):
    dest = storage(built) / "tiny.sif"
    rec1 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    _second_build(built, staging_sif, tmp_path)
    rec2 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    v1, v2 = versions.version_path(dest, rec1.sha256), versions.version_path(dest, rec2.sha256)
    # a handout written for v2 (its launcher names v2)
    handout = tmp_path / "handout"
    handout.mkdir()
    (handout / "train-lab.sbatch").write_text(f"#!/bin/bash\nimage={v2}\n")
    versions.add_handout(dest, handout)
    listing = _action(built, list_=True)
    assert f"* {v2.name}: sha256 {rec2.sha256[:12]}" in listing and f"handouts: {handout}" in listing
    assert f"  {v1.name}: sha256 {rec1.sha256[:12]}" in listing
    said = _action(built, rollback=True)
    assert versions.current(dest) == v1 and f"tiny.sif names {v1.name} again" in said
    with pytest.raises(ShipyardError, match=f"{v1.name} is the oldest staged version"):
        _action(built, rollback=True)
    kept = _action(built, prune=True)  # v2 is not current, but a handout binds it
    assert v2.is_file() and f"kept {v2.name} (handouts {handout})" in kept
    gone = _action(built, prune=True, force=True)
    assert not v2.exists() and not Path(f"{v2}.json").exists() and f"removed {v2.name}" in gone
    assert versions.current(dest) == v1 and v1.is_file()


def test_restaging_a_version_staged_before_only_moves_the_pointer(built, staging_sif, tmp_path):
    dest = storage(built) / "tiny.sif"
    first = tmp_path / "v1.sif"
    shutil.copy(staging_sif, first)
    rec1 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    _second_build(built, staging_sif, tmp_path)
    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    v1 = versions.version_path(dest, rec1.sha256)
    before = v1.stat().st_ino
    record_build(built, "tiny", first)  # the first build again
    said = _stage(built)
    assert versions.current(dest) == v1 and v1.stat().st_ino == before and "points at" in said


def test_an_image_staged_by_an_older_shipyard_becomes_a_version(built):
    """A regular file at ENV.sif (and its record) is what stage wrote before versions: the next stage replaces it by
    the pointer and removes the record that described it."""
    dest = storage(built) / "tiny.sif"
    dest.write_bytes(b"old image")
    Path(f"{dest}.json").write_text("{}\n")
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    assert versions.current(dest) == versions.version_path(dest, rec.sha256)
    assert not Path(f"{dest}.json").exists()


@pytest.mark.parametrize("target", ["/etc/passwd", "../elsewhere/tiny.0123456789ab.sif", "tiny.sif.json",
                                    "other.0123456789ab.sif"])
def test_a_foreign_symlink_is_no_pointer(tmp_path, target):
    """Only a bare name of this image's version form that is a regular file beside it counts."""
    dest = tmp_path / "tiny.sif"
    dest.symlink_to(target)
    assert versions.current(dest) == dest and not versions.is_pointer(dest)
    (tmp_path / "tiny.0123456789ab.sif").write_bytes(b"x")
    dest.unlink()
    dest.symlink_to("tiny.0123456789ab.sif")
    assert versions.current(dest) == tmp_path / "tiny.0123456789ab.sif"


def _handout(reg, out: Path, **flags) -> tuple[int, str]:
    from shipyard.commands import course
    from shipyard.launch.options import Options

    (reg.root / "train.py").write_text("print('train')\n")
    ctx = helpers_stage.context(reg)
    code = course.handout_folder(ctx, Options(environment="tiny", cluster="lab"), str(out), ["train.py"],
                                 workdir=reg.root, **flags)
    return code, ctx.out.getvalue()


def test_a_handout_previews_before_staging_and_binds_its_version_after(built, tmp_path):
    out = tmp_path / "handout"
    with pytest.raises(ShipyardError, match=r"^course.handout: .*no staged image to bind the handout to; run `stage "
                                            r"tiny --cluster lab` first \(--dry-run shows"):
        _handout(built, out)
    code, said = _handout(built, out, dry_run=True)
    assert code == 0 and not out.exists()
    assert "#SBATCH --job-name=train-lab" in said and "## 5. When the course is updated" in said
    last = said.rstrip().splitlines()[-1]
    assert last.startswith("dry run: nothing written; NOT READY: ") and "no staged image to bind" in last
    rec = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    v1 = versions.version_path(storage(built) / "tiny.sif", rec.sha256)
    code, said = _handout(built, out)
    assert code == 0 and str(v1) in (out / "train-lab.sbatch").read_text()
    assert versions.binders(storage(built) / "tiny.sif") == {v1.name: [out]}
    assert f"handouts: {out}" in _action(built, list_=True)


def test_an_image_of_another_spec_than_the_registry_is_refused_then_forced(built, tmp_path, capsys):
    """The registry changed after the image was built and staged: launch and course.handout refuse it in one line
    that names the pins that differ; --force goes on and says so."""
    from shipyard import registry

    helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    text = built.path.read_text()
    built.path.write_text(text.replace('    OMP_NUM_THREADS: "1"\n', '    OMP_NUM_THREADS: "2"\n', 1))
    changed = registry.load(built.path)
    assert changed.environment("tiny").spec_hash != built.environment("tiny").spec_hash
    with pytest.raises(ShipyardError, match=r"tiny\.[0-9a-f]{12}\.sif was built from another spec of environments\."
                                            r"tiny than registry.yaml's today \(.*\); rebuild and stage it"):
        _launch(changed, environment="tiny", cluster="lab", dry_run=True)
    with pytest.raises(ShipyardError, match="was built from another spec"):
        _handout(changed, tmp_path / "handout")
    forced = _launch(changed, environment="tiny", cluster="lab", dry_run=True, force=True)
    assert "#SBATCH --job-name" in forced
    assert "was built from another spec" in capsys.readouterr().err


def test_stage_refuses_a_build_of_another_spec_then_forced(built, capsys):
    """containers/ holds a build of yesterday's registry: stage says so in one line instead of publishing it."""
    from shipyard import registry

    text = built.path.read_text()
    built.path.write_text(text.replace('    OMP_NUM_THREADS: "1"\n', '    OMP_NUM_THREADS: "2"\n', 1))
    changed = registry.load(built.path)
    with pytest.raises(ShipyardError, match=r"^containers/tiny.sif was built from another spec of environments.tiny "
                                            r"than registry.yaml's today \(spec sha256 [0-9a-f]{12}, registry.yaml's"):
        helpers_stage.stage(changed, "tiny", "lab", out=io.StringIO())
    assert not (storage(built) / "tiny.sif").exists()
    helpers_stage.stage(changed, "tiny", "lab", out=io.StringIO(), force=True)
    assert "staging it anyway (--force)" in capsys.readouterr().err


def test_module_wrappers_and_the_shell_check_and_run_the_staged_version(built, staging_sif, tmp_path):
    """What runs an image outside a launcher (module wrappers, `invoke shell`) names the version stage's pointer names
    when it is written, and its image check verifies that very file: the check passes on a versioned stage (the
    pointer, a symlink, is never what it checks), and after the next stage the module written before still runs and
    checks its own version until `invoke modules` is run again."""
    from shipyard.commands import shell as shell_commands
    from shipyard.launch import modules

    dest = storage(built) / "tiny.sif"
    rec1 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    v1 = versions.version_path(dest, rec1.sha256)
    prefix = tmp_path / "site"
    modules.write_modules(built, [built.environment("tiny")], built.cluster("lab"), prefix)
    env = dict(os.environ, HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "home" / ".cache"))
    check = modules.check_path(prefix, "tiny")
    ok = subprocess.run(["bash", str(check)], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    wrapper = (modules.wrapper_dir(prefix, "tiny") / "python").read_text()
    assert str(v1) in wrapper and f"{dest} " not in wrapper
    _second_build(built, staging_sif, tmp_path)
    _stage(built)
    again = subprocess.run(["bash", str(check)], capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr  # the module written for v1 still checks (and runs) v1
    ctx = helpers_stage.context(built)
    script = shell_commands.shell_check(ctx, built.environment("tiny"), built.cluster("lab"), None)
    shell_ok = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert shell_ok.returncode == 0 and f"image={versions.current(dest)}" in script.read_text(), shell_ok.stderr


def _record_contents(reg, numpy: str) -> None:
    """The contents record of `tiny`'s last build in containers/ENV.json, as a build reads it from its image (the
    probe itself is tested in tests/containers/test_contents*.py): one Python package's version is ``numpy``."""
    from shipyard import project as paths
    from shipyard.containers import manifest as mf
    from shipyard.containers.contents import Contents

    rec = Contents(python={"numpy": numpy, "torch": "2.3.1"}, apt={"libc6": "2.36-9+deb12u10"},
                   labels={"org.shipyard.environment": "tiny"}, probed="apptainer exec")
    mf.update_manifest(paths.manifest_path(reg, "tiny"), contents=rec.to_dict())


def _diff(reg, *staged: str) -> str:
    from shipyard.commands import containers as container_commands

    ctx = helpers_stage.context(reg)
    assert container_commands.diff(ctx, "tiny", staged=list(staged), cluster="lab") == 0
    return ctx.out.getvalue()


def test_diff_between_two_staged_versions_lists_the_package_changed_between_them(built, staging_sif, tmp_path):
    dest = storage(built) / "tiny.sif"
    _record_contents(built, "1.26.4")
    rec1 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    _second_build(built, staging_sif, tmp_path)
    _record_contents(built, "2.0.2")
    rec2 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    v1, v2 = versions.version_path(dest, rec1.sha256), versions.version_path(dest, rec2.sha256)
    assert Path(f"{v1}.contents.json").is_file() and Path(f"{v2}.contents.json").is_file()
    said = _diff(built, rec1.sha256[:8], v2.name)
    assert said.splitlines()[:2] == [
        f"from tiny: staged version {v1.name} on lab (staged {rec1.staged}, input hash {rec1.input_hash[:12]})",
        f"to   tiny: staged version {v2.name} on lab (staged {rec2.staged}, input hash {rec2.input_hash[:12]})"]
    assert "Python packages: 1 changed, 0 added, 0 removed" in said and "~ numpy" in said
    assert "1.26.4 -> 2.0.2" in said and "apt packages: no change" in said
    # the current staged version against the last build: the same bytes, no change
    same = _diff(built, "current")
    assert f"from tiny: staged version {v2.name}" in same and "Python packages: no change" in same
    # prune takes the contents record with the version
    _action(built, prune=True)
    assert not v1.exists() and not Path(f"{v1}.contents.json").exists() and Path(f"{v2}.contents.json").is_file()
    with pytest.raises(ShipyardError, match=rf"--staged {rec1.sha256[:8]}: no staged version of tiny.sif"):
        _diff(built, rec1.sha256[:8])


def test_a_rehandout_says_what_changed_since_the_version_its_folder_held(built, staging_sif, tmp_path):
    """STUDENTS.md's update step names what changed in the course image, from the contents kept with the version the
    folder's previous handout ran and the one the new handout runs; a first handout has no such part."""
    out = tmp_path / "handout"
    _record_contents(built, "1.26.4")
    rec1 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    assert _handout(built, out)[0] == 0
    first = (out / "STUDENTS.md").read_text()
    assert "What changed in the course image" not in first
    _second_build(built, staging_sif, tmp_path)
    _record_contents(built, "2.0.2")
    rec2 = helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    assert _handout(built, out, replace=True)[0] == 0
    page = (out / "STUDENTS.md").read_text()
    dest = storage(built) / "tiny.sif"
    v1, v2 = versions.version_path(dest, rec1.sha256), versions.version_path(dest, rec2.sha256)
    part = page[page.index("What changed in the course image since the version this folder held before:"):]
    assert f"    from tiny: {v1.name}\n    to   tiny: {v2.name}\n" in part
    assert "    Python packages: 1 changed, 0 added, 0 removed\n      ~ numpy" in part and "1.26.4 -> 2.0.2" in part
    assert "    apt packages: no change" in part
    # handing out the same version again says nothing new
    assert _handout(built, out, replace=True)[0] == 0
    assert "What changed in the course image" not in (out / "STUDENTS.md").read_text()
