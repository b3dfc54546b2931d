"""`invoke course.handout`: the student launcher names no instructor path (golden per runtime, shellcheck), the
one-page STUDENTS.md (golden), and the refusals (an image under the instructor's project, a non-empty folder)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess

import pytest
from fixtures_launch import FAKE_ROOT, build_launcher, replace_staged_image, stage_record
from helpers_registry import GOLDEN, golden

from shipyard.errors import ShipyardError
from shipyard.commands import course
from shipyard.commands.context import Context
from shipyard.launch import handout, image_check
from shipyard.launch.options import Options

CLUSTERS = {"host": "lab-socket", "pyxis": "lab-efa", "apptainer": "lab-ib"}
CMD = ("train.py", "--steps", "200")


def student_text(reg, runtime: str, cluster: str | None = None) -> str:
    l = build_launcher(reg, cluster=cluster or CLUSTERS[runtime], runtime=runtime, nodes=2, command=CMD,
                       workdir=FAKE_ROOT)
    return handout.render(handout.student_launcher(l), str(FAKE_ROOT))


@pytest.mark.parametrize("runtime", sorted(CLUSTERS))
def test_student_launcher_has_no_instructor_path(launch_registry, runtime):
    text = student_text(launch_registry, runtime)
    golden(GOLDEN / "launch" / f"handout-{runtime}.sbatch", text)
    assert str(FAKE_ROOT) not in text and handout.SUBMIT_DIR not in text
    assert "#SBATCH --chdir" not in text and "#SBATCH --output=logs/train-" in text
    assert 'log_dir="$SLURM_SUBMIT_DIR/logs"' in text
    if runtime != "host":  # the container sees the student's folder at the same path and starts there
        assert '"$SLURM_SUBMIT_DIR":"$SLURM_SUBMIT_DIR"' in text
    res = subprocess.run(["shellcheck", "-S", "warning", "-s", "bash", "-"], input=text, text=True,
                         capture_output=True)
    assert res.returncode == 0, res.stdout


def test_students_md(launch_registry):
    l = handout.student_launcher(build_launcher(launch_registry, cluster="lab-ib", nodes=2, command=CMD,
                                                workdir=FAKE_ROOT))
    shell = handout.shell_line(l, "grete-interactive", "01:00:00", l.modules, "check-image.sh")
    text = handout.students_md(l, "pytorch-2.3", "train.py --steps 200", shell, "/scratch/course/handout",
                               checked="check-image.sh")
    golden(GOLDEN / "launch" / "handout-STUDENTS.md", text)
    line = next(ln.strip() for ln in text.splitlines() if "--pty apptainer shell" in ln)
    before, _, srun = line.partition(" && ")
    assert before.endswith("bash check-image.sh") and srun.startswith("srun ") and ";" not in srun
    assert str(FAKE_ROOT) not in text and len(text.splitlines()) <= 60


def test_students_md_on_a_host_cluster_says_whose_python_runs(launch_registry):
    """A host-runtime launcher names no Python (never the instructor's, whose environment may be private): the job
    runs the torchrun on the student's PATH, and the page says so, with the cluster's host_requirements."""
    l = handout.student_launcher(build_launcher(launch_registry, cluster="lab-socket", runtime="host", nodes=2,
                                                command=CMD, workdir=FAKE_ROOT))
    text = handout.students_md(l, "course", "train.py", "srun --pty bash", "/scratch/h", ["torch==2.13.0"])
    assert "it starts the `torchrun` on your `PATH` when you submit" in text
    assert "(torch==2.13.0)" in text and "command -v torchrun" in text
    rendered = handout.render(l, str(FAKE_ROOT))
    assert "python" not in rendered.lower() and "venv" not in rendered
    pyxis = handout.student_launcher(build_launcher(launch_registry, cluster="lab-ib", nodes=2, command=CMD,
                                                    workdir=FAKE_ROOT))
    assert "torchrun` on your `PATH`" not in handout.students_md(pyxis, "c", "train.py", "x", "/scratch/h")


def test_students_md_for_the_sandbox_says_how_to_reach_its_slurm(launch_registry):
    """On the local sandbox a student's own clients need its slurm.conf: the page gives the one line (quoted), and
    the stand-in for sacct, which the sandbox cannot answer; a cluster's page has neither."""
    l = handout.student_launcher(build_launcher(launch_registry, cluster="lab-socket", runtime="host", nodes=2,
                                                command=CMD, workdir=FAKE_ROOT))
    text = handout.students_md(l, "course", "train.py", "srun --pty bash", "/scratch/h",
                               slurm_conf="/var/tmp/my sandbox/etc/slurm.conf")
    assert "    export SLURM_CONF='/var/tmp/my sandbox/etc/slurm.conf'\n" in text
    assert "scontrol show job JOBID" in text and "sacct" not in text.replace("for sacct", "")
    plain = handout.students_md(l, "course", "train.py", "srun --pty bash", "/scratch/h")
    assert "SLURM_CONF" not in plain and "sacct -j JOBID" in plain


def test_students_md_copy_and_update_lines_work_as_printed(launch_registry, tmp_path):
    """The copy line of step 1 and the update of step 5, run by bash as printed: the second copy never nests inside
    the first, replaces the course's files and keeps the student's logs and checkpoints."""
    where = tmp_path / "hand out"  # a space: the line quotes the folder
    (where / "logs").mkdir(parents=True)
    (where / "train.py").write_text("v1\n")
    l = handout.student_launcher(build_launcher(launch_registry, cluster="lab-socket", runtime="host", nodes=2,
                                                command=CMD, workdir=FAKE_ROOT))
    text = handout.students_md(l, "course", "train.py", "srun --pty bash", str(where))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("mkdir -p ~/course")]
    assert len(lines) == 2 and lines[0] == lines[1]
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", "-c", lines[0]], env=env, check=True)
    mine = home / "course"
    (mine / "logs" / "train-1.out").write_text("my log\n")
    (mine / "checkpoints").mkdir()
    (mine / "checkpoints" / "train.pt").write_text("my weights\n")
    (where / "train.py").write_text("v2\n")  # the course is updated
    subprocess.run(["bash", "-c", lines[1]], env=env, check=True)
    assert (mine / "train.py").read_text() == "v2\n" and not (mine / "hand out").exists()
    assert (mine / "logs" / "train-1.out").read_text() == "my log\n"
    assert (mine / "checkpoints" / "train.pt").read_text() == "my weights\n"


def test_an_image_inside_the_instructors_project_is_refused(launch_registry):
    """lab-socket's storage is relative (under the project): a container launcher there would name it."""
    with pytest.raises(ShipyardError, match="would still name /srv/shipyard-project"):
        student_text(launch_registry, "pyxis", cluster="lab-socket")


def test_write_refuses_a_non_empty_folder_and_copies_the_script(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('hi')\n")
    src = handout.copy_source(tmp_path / "proj", tmp_path / "proj", ["train.py", "--steps", "2"])
    out = tmp_path / "handout"
    written = handout.write(out, "train-x", "#!/bin/bash\n", "# s\n", src)
    assert sorted(p.name for p in written) == ["STUDENTS.md", "logs", "train-x.sbatch", "train.py"]
    assert (out / "train-x.sbatch").stat().st_mode & 0o777 == 0o755
    assert (out / "train.py").stat().st_mode & 0o777 == 0o644 and (out / "logs").is_dir()
    with pytest.raises(ShipyardError, match="is not empty; pass --replace"):
        handout.write(out, "train-x", "#!/bin/bash\n", "# s\n", src)
    handout.write(out, "train-x", "#!/bin/bash\n", "# s\n", src, force=True)
    with pytest.raises(ShipyardError, match="relative to where you run"):
        handout.copy_source(tmp_path / "proj", tmp_path / "proj", ["/abs/train.py"])


def _planted(tmp_path):
    (tmp_path / "proj" / "src").mkdir(parents=True)
    (tmp_path / "proj" / "src" / "train.py").write_text("print('hi')\n")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    out = tmp_path / "handout"
    out.mkdir()
    return handout.copy_source(tmp_path / "proj", tmp_path / "proj", ["src/train.py"]), private, out


def test_a_logs_link_planted_in_the_handout_is_refused_not_chmoded_or_shipped(tmp_path):
    src, private, out = _planted(tmp_path)
    (out / "logs").symlink_to(private)
    with pytest.raises(ShipyardError, match=r"--out .*handout: logs: is a symbolic link"):
        handout.write(out, "train-x", "#!/bin/bash\n", "# s\n", src, force=True)
    assert private.stat().st_mode & 0o777 == 0o700


def test_a_directory_link_on_the_scripts_path_is_refused_and_nothing_lands_outside(tmp_path):
    src, private, out = _planted(tmp_path)
    (out / "src").symlink_to(private)
    with pytest.raises(ShipyardError, match=r"src: is a symbolic link"):
        handout.write(out, "train-x", "#!/bin/bash\n", "# s\n", src, force=True)
    assert list(private.iterdir()) == []


def test_links_planted_at_the_handouts_file_names_are_replaced(tmp_path):
    src, private, out = _planted(tmp_path)
    (private / "keep").write_text("k\n")
    (out / "src").mkdir()
    for name in ("train-x.sbatch", "STUDENTS.md", "src/train.py", image_check.SCRIPT):
        (out / name).symlink_to(private / "keep")
    handout.write(out, "train-x", "#!/bin/bash\n", "# s\n", src, force=True,
                  extra={image_check.SCRIPT: ("#!/bin/bash\n", 0o755)})
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert (private / "keep").read_text() == "k\n" and (out / "src" / "train.py").read_text() == "print('hi')\n"


def test_the_handout_ships_the_image_check_its_interactive_line_runs(make_project, tmp_path):
    """course.handout on an Apptainer cluster writes check-image.sh for the staged image; STUDENTS.md's interactive
    line runs it before srun. Run from a student's copy, it passes for the staged image and, after the image is
    replaced and its record rewritten, stops with one line and exit 3 (the srun after `&&` never starts)."""
    reg = make_project("repo", name="course")
    storage = tmp_path / "storage"
    storage.mkdir()
    text = (reg.root / "registry.yaml").read_text()
    text = text.replace("    runtime: host\n    fabric: socket\n", "    runtime: apptainer\n    fabric: socket\n", 1)
    (reg.root / "registry.yaml").write_text(text.replace("    storage: .sandbox/images\n",
                                                         f"    storage: {storage}\n", 1))
    (reg.root / "train.py").write_text("print('train')\n")
    image = storage / "pytorch-2.3.sif"
    image.write_bytes(b"the course image\n" * 500)
    stage_record(image)
    ctx = Context.load(reg.root / "registry.yaml", out=io.StringIO())
    out = tmp_path / "handout"
    assert course.handout_folder(ctx, Options(environment="pytorch-2.3", cluster="sandbox", force=True), str(out),
                                 ["train.py"], reg.root) == 0
    check = out / image_check.SCRIPT
    assert os.access(check, os.X_OK) and f"image={image}" in check.read_text()
    line = next(ln.strip() for ln in (out / "STUDENTS.md").read_text().splitlines() if "--pty apptainer" in ln)
    before, _, srun = line.partition(" && ")
    assert before.endswith(f"bash {image_check.SCRIPT}") and srun.startswith("srun ")
    student = tmp_path / "student"
    shutil.copytree(out, student)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    ok = subprocess.run(["bash", "-c", before], cwd=student, capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    replace_staged_image(image)
    bad = subprocess.run(["bash", "-c", before], cwd=student, capture_output=True, text=True, env=env)
    assert bad.returncode == 3 and bad.stderr.count("shipyard: error:") == 1, bad.stderr
    assert f"staged image {image} has content sha256" in bad.stderr
