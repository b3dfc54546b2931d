"""Every path under a project root that shipyard's stages read or write, in one place.

Why: the layout (``definitions/``, ``containers/``, ``launch/``) is a contract between stages -- render writes what
build reads, build writes what sign, push and the launchers read, the launchers write the logs that status and usage
read. When each stage joined the names by hand, a rename in one stage silently broke another; here one function per
path is the only spelling. Pure functions of the root: nothing is created or checked.

Every function takes ``where``: the project root (a path) or anything with a ``.root`` (a
:class:`shipyard.registry.model.Registry`), so callers pass what they hold.

Layout::

    definitions/<env>.def  .Dockerfile  .test.sh  .lock      rendered by `invoke render`, `invoke lock`
    containers/<env>.sif  .sqsh                              built images (artifacts)
    containers/<env>.json                                    build manifest (provenance, signature)
    containers/<env>.lock                                    build lock (one builder per environment)
    containers/<artifact>.tmp-<pid>                          what a tool writes before the atomic rename
    containers/logs/                                         build logs, `build --slurm` scripts and job output
    launch/<name>.sbatch                                     launchers
    launch/logs/                                             job output and usage samples
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DEFINITIONS = "definitions"
CONTAINERS = "containers"
LAUNCH = "launch"
LOGS = "logs"
LAUNCHER_SUFFIX = ".sbatch"
TEMP_INFIX = ".tmp-"


def root_of(where) -> Path:
    """The project root of ``where``: a path as given, or a registry's ``root``."""
    if isinstance(where, (str, os.PathLike)):
        return Path(where)
    return Path(where.root)


# -------------------------------------------------------------------------------------------------- definitions/

def definitions_dir(where) -> Path:
    return root_of(where) / DEFINITIONS


def definition_path(where, env_name: str) -> Path:
    """``definitions/<env>.def``: the Apptainer definition."""
    return definitions_dir(where) / f"{env_name}.def"


def dockerfile_path(where, env_name: str) -> Path:
    """``definitions/<env>.Dockerfile``: the same recipe for the docker backend."""
    return definitions_dir(where) / f"{env_name}.Dockerfile"


def test_script_path(where, env_name: str) -> Path:
    """``definitions/<env>.test.sh``: the %test commands, run by the docker backend in the built image."""
    return definitions_dir(where) / f"{env_name}.test.sh"


def lock_path(where, env_name: str) -> Path:
    """``definitions/<env>.lock``: the pinned, hashed requirements, beside the definition that installs from it."""
    return definitions_dir(where) / f"{env_name}.lock"


# --------------------------------------------------------------------------------------------------- containers/

def containers_dir(where) -> Path:
    return root_of(where) / CONTAINERS


def artifact_path(where, env_name: str, fmt: str) -> Path:
    """``containers/<env>.sif`` or ``.sqsh``: where a finished image of this machine lives (not the copy on a
    cluster's storage, which the launchers name)."""
    return containers_dir(where) / f"{env_name}.{fmt}"


def manifest_path(where, env_name: str) -> Path:
    """``containers/<env>.json``: the build manifest."""
    return containers_dir(where) / f"{env_name}.json"


def build_lock_path(where, env_name: str) -> Path:
    """``containers/<env>.lock``: held (flock) by the one builder of ``env``."""
    return containers_dir(where) / f"{env_name}.lock"


def build_logs_dir(where) -> Path:
    """``containers/logs/``: build logs, the scripts and output of `build --slurm` jobs."""
    return containers_dir(where) / LOGS


def temp_path(target: Path, pid: int | None = None) -> Path:
    """The temp file beside ``target`` that a tool writes into (same filesystem, so the rename is atomic); the pid
    (default: this process) tells whose it is."""
    return target.with_name(f"{target.name}{TEMP_INFIX}{os.getpid() if pid is None else pid}")


def temp_glob(target: Path) -> str:
    """Glob pattern (relative to ``target``'s directory) of every :func:`temp_path` of ``target``, whoever wrote it."""
    return f"{target.name}{TEMP_INFIX}*"


# ------------------------------------------------------------------------------------------------------- launch/

def launchers_dir(where) -> Path:
    return root_of(where) / LAUNCH


def launcher_path(where, name: str) -> Path:
    """``launch/<name>.sbatch``: a launcher; the job is named ``name``."""
    return launchers_dir(where) / f"{name}{LAUNCHER_SUFFIX}"


_WRITTEN_FOR = re.compile(r"^# environment \S+, cluster (\S+), runtime ", re.M)


def launcher_cluster(path: Path) -> str | None:
    """The cluster a launcher was written for (its header's ``cluster NAME``), or None (no such file, no header)."""
    try:
        with open(path, errors="replace") as fh:
            m = _WRITTEN_FOR.search(fh.read(4096))
    except OSError:
        return None
    return m[1] if m else None


def launch_logs_dir(where) -> Path:
    """``launch/logs/``: job output (``<name>-<jobid>.out``) and usage samples."""
    return launchers_dir(where) / LOGS


def job_log_path(where, name: str, jobid: str) -> Path:
    """``launch/logs/<name>-<jobid>.out``: what the launcher's job writes."""
    return launch_logs_dir(where) / f"{name}-{jobid}.out"
