"""The apptainer backend: ``apptainer build`` from the rendered definition, with a preflight that finds every
reason such a build would fail late (no apptainer, no fakeroot mapping, too little space for its temp and cache
directories) before it starts."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from shipyard import facts as data
from shipyard import project
from shipyard.containers import buildnet, contents
from shipyard.containers.common import (
    Job,
    check_sif,
    copy_sources,
    run_streaming,
    tool_version,
)
from shipyard.definitions import render as definitions
from shipyard.errors import ShipyardError


def build_facts() -> dict:
    return data.load("build")


# How `apptainer build` 1.4 reports a failed section, as its one FATAL line (internal/pkg/build/build.go and
# stage.go; real samples in tests/data/apptainer-build/): "while running %post section: exit status 3",
# "failed to execute %test script: exit status 3". The cause is Go's exec error text: "exit status N" or
# "signal: NAME".
_FAILED_SECTION = re.compile(r"FATAL:.*?(?:while running (%post) section|failed to execute (%test) script): "
                             r"(exit status \d+|signal: [\w ]+)")


def failed_section(lines: list[str]) -> str | None:
    """``%post failed (exit status 3)`` from `apptainer build`'s output, or None when no section failed (the
    failure was elsewhere: a pull, the definition, the disk)."""
    for line in reversed(lines):
        m = _FAILED_SECTION.search(line)
        if m:
            return f"{m.group(1) or m.group(2)} failed ({m.group(3)}); no image was written"
    return None




# ----------------------------------------------------------------------------------------------- preflight


def _free_bytes(path: Path) -> tuple[Path, int]:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return p, st.f_bavail * st.f_frsize


def _has_mapping(path: str, user: str, uid: int) -> bool:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return False
    return any(line.split(":", 1)[0] in (user, str(uid)) for line in lines if line.strip() and ":" in line)


def preflight_apptainer(*, fakeroot: bool, environ: dict | None = None, uid: int | None = None,
                        user: str | None = None, which: Callable[[str], str | None] = shutil.which,
                        subuid: str = "/etc/subuid", subgid: str = "/etc/subgid",
                        min_free_gib: dict | None = None) -> list[str]:
    """Every reason an ``apptainer build`` would fail late, found before it starts (empty list: go)."""
    environ = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    if user is None:
        user = pwd.getpwuid(uid).pw_name
    problems = []
    if not which("apptainer"):
        # inside a Slurm job (a `build --slurm` job among them) --slurm would only send the build here again
        elsewhere = "" if environ.get("SLURM_JOB_ID") else ", or --slurm to build on a cluster node that has it"
        problems.append("apptainer is not on PATH: install it (or `module load apptainer`), "
                        f"or use --backend docker{elsewhere}")
    if fakeroot and uid != 0:
        mapped = _has_mapping(subuid, user, uid) and _has_mapping(subgid, user, uid)
        if not mapped and not which("fakeroot"):
            problems.append(f"--fakeroot needs a subuid/subgid mapping for {user} in {subuid} and {subgid} "
                            f"(admin: `apptainer config fakeroot --add {user}`) or the fakeroot command on PATH")
    facts = build_facts()
    need = min_free_gib or facts["min_free_gib"]
    for key, var in (("tmpdir", "APPTAINER_TMPDIR"), ("cachedir", "APPTAINER_CACHEDIR")):
        d = Path(os.path.expanduser(environ.get(var) or facts["default_dirs"][key]))
        where, free = _free_bytes(d)
        if free < need[key] * 2**30:
            problems.append(f"{var} ({d}) has {free / 2**30:.1f} GiB free on {where}; a build needs at least "
                            f"{need[key]} GiB: set {var} to a directory on a larger disk")
    return problems


def _explain(env_name: str, lines: list[str]) -> str | None:
    what = failed_section(lines)
    return f"apptainer build of {env_name}: {what}" if what else None


class ApptainerBackend:
    """``apptainer build [--fakeroot] containers/ENV.sif.tmp-PID definitions/ENV.def`` (run in the project root)."""

    name = "apptainer"

    def __init__(self, fakeroot: bool = False):
        self.fakeroot = fakeroot

    def preflight(self) -> None:
        problems = preflight_apptainer(fakeroot=self.fakeroot)
        if problems:
            raise ShipyardError("preflight: " + "; ".join(problems))

    def inputs(self, reg, env) -> dict[Path, str]:
        return {project.definition_path(reg, env.name): definitions.render_definition(env, reg)}

    def sources(self, inputs: dict[Path, str]) -> list[str]:
        return [src for p, t in inputs.items() if p.suffix == ".def" for src in copy_sources(t, "def")]

    def tools(self, formats) -> dict[str, str]:
        return {"apptainer": tool_version("apptainer")}

    def still_there(self, m) -> bool:
        return True

    def run(self, job: Job) -> tuple[dict[str, Path], dict]:
        target = project.artifact_path(job.reg, job.env.name, "sif")
        tmp = project.temp_path(target)
        argv = ["apptainer", "build"] + (["--fakeroot"] if job.fakeroot else [])
        mirror = job.reg.base_mirror
        if mirror and mirror.insecure_http:  # plain HTTP for docker:// only when registry.yaml says so
            argv.append("--no-https")
        net = buildnet.from_environ()
        try:
            with buildnet.staged(net) as net_dir:
                if net:  # %post sources the env file when it is there; a bind mount is not packed into the SIF
                    job.log.write(net.describe())
                    argv += ["--bind", f"{net_dir}:{buildnet.MOUNT}"]
                argv += [str(tmp.relative_to(job.root)), str(project.definition_path(job.reg, job.env.name)
                                                              .relative_to(job.root))]
                run_streaming(argv, job.log, cwd=job.root, explain=lambda lines: _explain(job.env.name, lines))
            check_sif(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return {"sif": tmp}, {}

    def probe(self, reg, env, extra: dict) -> contents.Contents:
        """The contents record, read inside the SIF just built."""
        return probe_sif(project.artifact_path(reg, env.name, "sif"), Path(reg.root))


def probe_sif(sif: Path, cwd: Path) -> contents.Contents:
    """``apptainer exec --cleanenv IMAGE /bin/sh -c PROBE``: the contents record of a SIF, read inside it."""
    argv = ["apptainer", "exec", "--cleanenv", str(sif), "/bin/sh", "-c", contents.probe_script()]
    limit = contents.settings()["probe_timeout_s"]
    try:
        res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, errors="replace", timeout=limit,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ShipyardError(f"contents probe: apptainer exec {sif.name} did not finish in {limit} s") from None
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or [""])[-1][:200]
        raise ShipyardError(f"contents probe: apptainer exec {sif.name} exited {res.returncode}: {why}")
    return contents.parse_probe(res.stdout, "apptainer exec")
