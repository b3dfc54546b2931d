"""A course's student folder (`invoke course.handout`): the course launcher made portable, and a one-page
STUDENTS.md.

Why: a launcher written by `invoke launch` names the instructor's project directory (``#SBATCH --chdir``, the log
directory, the container's working directory and mounts), so every student who submits it writes logs and
checkpoints into the instructor's folder, and all of them share one checkpoint. A student launcher names none of
that: Slurm runs the job in the directory it was submitted from (``$SLURM_SUBMIT_DIR``, sbatch's default working
directory), its log goes to ``logs/`` there, a relative checkpoint path lands there, and a container sees that
directory at the same path. Each student copies the folder and submits from the copy; two students never share a
file. The image stays where the instructor staged it (read-only, readable as `invoke stage --mode` chose).

The student launcher is the instructor's :class:`~shipyard.launch.launcher.Launcher` with the project directory
replaced by a placeholder path, rendered by the same template (``handout=True``), and the placeholder then replaced
by ``"$SLURM_SUBMIT_DIR"``. Only words that need no quoting may hold it (a quoted word would keep ``$`` literal), and
a text that still names the instructor's project is refused: no instructor path in what students run.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Sequence

from shipyard import __version__, templating
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_join, shell_quote
from shipyard.files import SharedFolder
from shipyard.launch import launcher
from shipyard.launch.launcher import Launcher
from shipyard.runtimes.mounts import Mount, spec as mount_spec

SUBMIT_DIR = "/shipyard-handout-submit-dir"  # placeholder for the student's folder, replaced after rendering
SUBMIT_DIR_SHELL = '"$SLURM_SUBMIT_DIR"'


def student_launcher(l: Launcher) -> Launcher:
    """``l`` with no instructor path: the job's directory, the container's working directory and the project mount
    become the submit directory; no registry path, no regenerate line, one job (no chain script)."""
    root = l.root
    mounts = tuple(Mount(SUBMIT_DIR, SUBMIT_DIR, m.ro) if m.src == root else m for m in l.mounts)
    return l.replace(handout=True, root=SUBMIT_DIR, workdir=SUBMIT_DIR, container_workdir=SUBMIT_DIR,
                     mounts=mounts, registry="", regenerate=(), chain=1)


def render(l: Launcher, instructor_root: str, preview: bool = False) -> str:
    """The student launcher's text for ``l`` (already :func:`student_launcher`'d); ``preview`` shows it even while
    it still names the instructor's project (`course.handout --dry-run` before the image is staged)."""
    text = launcher.render(l)
    out = []
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        if SUBMIT_DIR in line:
            if "'" in line:
                raise ShipyardError(f"course.handout: line {n} of the launcher would need the student's folder inside "
                                    f"a quoted word ({line.strip()[:80]}...); use cluster binds and paths without "
                                    "spaces or shell characters")
            line = line.replace(SUBMIT_DIR, SUBMIT_DIR_SHELL)
        out.append(line)
    text = "".join(out)
    if not preview and re.search(re.escape(instructor_root.rstrip("/")) + r"(?=[/'\":,\s]|$)", text, re.M):
        raise ShipyardError(f"course.handout: the launcher would still name {instructor_root} (the instructor's "
                            "project), e.g. an image stored under it; stage the image to shared storage "
                            "(an absolute clusters.NAME.storage) first")
    return text


def shell_line(l: Launcher, partition: str, time: str | None, modules: Sequence[str],
               check: str | None = None) -> str:
    """The srun line STUDENTS.md gives for an interactive shell on one GPU (or CPU) node, in the course image;
    ``check``: the image check script in the handout (relative to the student's copy), run first: srun only when
    it passes."""
    words = ["srun", f"--partition={partition}", "--nodes=1"]
    if l.account:  # the batch launcher's account: a cluster that requires one refuses an srun without it
        words.append(f"--account={l.account}")
    if l.gpus_per_node:
        words.append("--gpus=1")
    if time:
        words.append(f"--time={time}")
    binds = [m for m in l.mounts if m.src != SUBMIT_DIR]
    if l.runtime == "apptainer":
        bind = ",".join(["$PWD", *(mount_spec(m) for m in binds)])
        tail = f"--pty apptainer shell --nv --bind \"{bind}\" {shell_quote(l.image)}"
    elif l.runtime == "pyxis":
        mounts = ",".join(["$PWD:$PWD", *(mount_spec(m) for m in binds)])
        tail = (f"--container-image={shell_quote(l.image)} --container-mounts=\"{mounts}\" "
                "--container-workdir=\"$PWD\" --pty bash")
    else:
        tail = "--pty bash"
    pre = "".join(f"module load {shell_quote(m)}; " for m in modules)
    if check:
        pre += f"bash {shell_quote(check)} && "
    return pre + shell_join(words) + " " + tail


def students_md(l: Launcher, course: str, script: str, interactive: str, where: str,
                host_requirements: Sequence[str] = (), checked: str | None = None,
                slurm_conf: str | None = None, changes: str | None = None) -> str:
    """STUDENTS.md: one page, for this course's cluster; ``where``: the handout folder students copy.

    On a ``host`` cluster the job runs the ``torchrun`` on the student's own PATH (the launcher names no Python, so
    it never depends on the instructor's environment, which may be private); the page says so, with the cluster's
    ``host_requirements``. ``checked``: the image check script the interactive line runs first (said on the page).
    ``slurm_conf``: the configuration file students point their Slurm clients at, where the cluster has no login
    node whose clients already find theirs (the local sandbox). ``changes``: what changed in the course image since
    the version this folder's previous handout ran (`invoke diff`'s text), shown in the update step as a code block,
    so no name or version in it is read as Markdown."""
    return templating.render("shipyard.launch", "STUDENTS.md.j2", trim_blocks=True, l=l, course=course,
                             script=script, interactive=interactive, where=where, version=__version__,
                             host_requirements=tuple(host_requirements), checked=checked, slurm_conf=slurm_conf,
                             changes=changes)


def copy_source(project: Path, workdir: Path, command: Sequence[str]) -> tuple[Path, PurePosixPath] | None:
    """(file, relative path in the handout) of the training script the command runs, when it is a relative path to
    a file under the project; None for a module (``-m x``) or a program on the PATH."""
    if not command or command[0].startswith("-"):
        return None
    rel = PurePosixPath(command[0])
    if rel.is_absolute() or ".." in rel.parts:
        raise ShipyardError(f"course.handout: {command[0]}: give the training script as a path relative to where "
                            "you run the command (it is copied into the handout at that path)")
    src = workdir / rel
    if not src.is_file():
        return None
    if project.resolve() not in src.resolve().parents:
        raise ShipyardError(f"course.handout: {command[0]} is not under the course folder {project}")
    return src, rel


def write(out: Path, name: str, text: str, students: str, script: tuple[Path, PurePosixPath] | None,
          force: bool = False, extra: dict[str, tuple[str, int]] | None = None) -> list[Path]:
    """Write the handout folder: NAME.sbatch (0755), STUDENTS.md, the training script and an empty logs/ (Slurm
    does not create --output's directory); ``extra``: more files (relative path -> (text, mode)). Everything
    world-readable, so students can copy it. A folder that holds other files is refused unless ``force`` (then only
    these files are replaced).

    The folder may be writable by others (a course's shared handout folder): it is written by
    :class:`~shipyard.files.SharedFolder`, so a link planted at ``logs`` or on the script's path is refused, never
    followed, chmod'ed or shipped, and a link at a file's name is replaced by the file."""
    if out.is_symlink():
        raise ShipyardError(f"--out {out}: is a symbolic link; name the real directory")
    if out.exists() and not out.is_dir():
        raise ShipyardError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ShipyardError(f"--out {out}: is not empty; pass --replace to replace the handout's files in it")
    with SharedFolder(out, f"--out {out}") as folder:
        logs = folder.mkdir("logs", 0o755)
        written = [folder.write(f"{name}.sbatch", text, 0o755), folder.write("STUDENTS.md", students, 0o644)]
        for rel, (body, mode) in (extra or {}).items():
            written.append(folder.write(rel, body, mode))
        if script:
            src, rel = script
            written.append(folder.write(rel, src.read_bytes(), 0o644))
    return written + [logs]
