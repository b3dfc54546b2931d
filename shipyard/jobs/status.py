"""`invoke status` and `invoke logs JOBID`: the user's shipyard jobs from squeue + sacct, and a job's output.

Which jobs are shipyard's: the launchers (shipyard/launch/launcher.py) name the job after ``launch/<name>.sbatch`` and write
its output to ``launch/logs/<name>-<jobid>.out``; `invoke shell` and `invoke doctor` name theirs ``shipyard-*``.
So a job counts when its name has the ``shipyard-`` prefix, its comment mentions shipyard, or its name is one of
the project's launchers (a ``launch/*.sbatch`` file).

squeue knows pending, running and recently finished jobs (for the controller's MinJobAge); sacct knows finished
ones. Both are asked with a field separator (ASCII unit separator) that cannot occur in job names or comments, so
a name with spaces or ``|`` cannot shift columns. Where the cluster keeps no accounting database (the sandbox),
sacct is asked for the job-completion log instead (``sacct -c``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from shipyard import project, slurm
from shipyard.errors import ShipyardError
from shipyard.files import table
from shipyard.registry.model import Cluster, Registry

SEP = "\x1f"
PREFIX = "shipyard-"
_JOBID = re.compile(r"^[0-9]+(_[0-9]+)?$")
_SQUEUE_FIELDS = ("%i", "%j", "%T", "%M", "%l", "%D", "%R", "%k")
_SACCT_FIELDS = ("JobID", "JobName", "State", "Elapsed", "NNodes", "NodeList", "ExitCode")


@dataclass(frozen=True)
class Job:
    jobid: str
    name: str
    state: str
    elapsed: str
    time_limit: str = ""
    nodes: str = ""
    where: str = ""  # node list, or the reason a pending job waits
    exit_code: str = ""
    comment: str = ""


# ------------------------------------------------------------------------------------------------ Slurm clients


def squeue_argv(user: str) -> list[str]:
    return ["squeue", f"--user={user}", "--states=all", "--noheader", "--format=" + SEP.join(_SQUEUE_FIELDS)]


def sacct_argv(user: str, since: str, completion_log: bool = False) -> list[str]:
    argv = ["sacct"] + (["-c"] if completion_log else ["-X"])
    return argv + [f"--user={user}", f"--starttime={since}", "--noheader", "--parsable2", f"--delimiter={SEP}",
                   "--format=" + ",".join(_SACCT_FIELDS)]


def _null(v: str) -> str:
    return "" if v == "(null)" else v


def parse_squeue(text: str) -> list[Job]:
    out = []
    for line in text.splitlines():
        f = line.split(SEP)
        if len(f) != len(_SQUEUE_FIELDS):
            continue
        out.append(Job(f[0], f[1], f[2], f[3], f[4], f[5], _null(f[6]), "", _null(f[7])))
    return out


def parse_sacct(text: str) -> list[Job]:
    out = []
    for line in text.splitlines():
        f = line.split(SEP)
        if len(f) != len(_SACCT_FIELDS) or "." in f[0]:  # job steps (123.batch) are not jobs
            continue
        out.append(Job(f[0], f[1], f[2].split()[0] if f[2] else "", f[3], "", f[4], _null(f[5]), f[6]))
    return out


def launcher_names(root: Path) -> set[str]:
    return {p.stem for p in project.launchers_dir(root).glob(f"*{project.LAUNCHER_SUFFIX}")}


def is_shipyard(job: Job, launchers: set[str]) -> bool:
    return job.name.startswith(PREFIX) or "shipyard" in job.comment.lower() or job.name in launchers


def merge(live: list[Job], done: list[Job]) -> list[Job]:
    """One row per job: squeue's view (current state, reason) completed by sacct's exit code; oldest first."""
    by_id = {j.jobid: j for j in done}
    for j in live:
        old = by_id.get(j.jobid)
        by_id[j.jobid] = replace(j, exit_code=old.exit_code) if old else j
    return sorted(by_id.values(), key=_jobid_key)


def _jobid_key(job: Job) -> tuple[int, int]:
    head, _, task = job.jobid.partition("_")
    return (int(head) if head.isdigit() else 0, int(task) if task.isdigit() else -1)


def render_status(cluster: str, jobs: list[Job], root: Path, note: str = "") -> str:
    if not jobs:
        body = f"no shipyard jobs on {cluster}"
    else:
        rows = []
        for j in jobs:
            log = _default_log(root, j)
            rows.append([j.jobid, j.name, j.state, j.elapsed, j.time_limit, j.nodes, j.where, j.exit_code,
                         os.path.relpath(log, root) if log else ""])
        body = table(["JOBID", "NAME", "STATE", "ELAPSED", "LIMIT", "NODES", "NODELIST(REASON)", "EXIT", "LOG"], rows)
    return body + (f"\n{note}" if note else "") + "\n"


def _default_log(root: Path, job: Job) -> Path | None:
    p = project.job_log_path(root, job.name, job.jobid)
    return p if p.exists() else None


def shipyard_jobs(reg: Registry, cluster: Cluster, user: str, since: str) -> tuple[list[Job], str]:
    """The user's shipyard jobs on ``cluster`` (squeue's, completed by sacct's since ``since``), oldest first, and a
    note when finished jobs could not be listed (no sacct)."""
    res = slurm.query(cluster, squeue_argv(user))
    if res.returncode != 0:
        raise ShipyardError(f"squeue on {cluster.name}: {slurm.last_error(res)}", exit_code=1)
    live = parse_squeue(res.stdout)
    note = ""
    acct = slurm.query(cluster, sacct_argv(user, since))
    if "accounting storage is disabled" in (acct.stdout + acct.stderr):
        acct = slurm.query(cluster, sacct_argv(user, since, completion_log=True))
    if acct.returncode == 0:
        done = parse_sacct(acct.stdout)
    else:
        done = []
        note = (f"(sacct unavailable: {slurm.last_error(acct)}; finished jobs the controller no longer keeps are not "
                "listed)")
    launchers = launcher_names(reg.root)
    return [j for j in merge(live, done) if is_shipyard(j, launchers)], note


# ------------------------------------------------------------------------------------------------ logs


_STDOUT = re.compile(r"(?:^|\s)StdOut=(.+?)(?=\s+[A-Za-z][A-Za-z:/_]*=|\s*$)")


def stdout_from_scontrol(text: str) -> str | None:
    m = _STDOUT.search(text)
    return m[1] if m and m[1] != "(null)" else None


def logs_for(reg: Registry, cluster: str, jobid: str) -> tuple[list[Path], list[tuple[Path, str]]]:
    """launch/logs/NAME-JOBID.out files of ``cluster``'s jobs, and (file, cluster) of those whose launcher
    launch/NAME.sbatch was written for another cluster: job ids repeat across clusters, so the number alone does
    not say whose log it is. A log whose launcher is gone counts as this cluster's (nothing says otherwise)."""
    mine, other = [], []
    for log in sorted(project.launch_logs_dir(reg).glob(f"*-{jobid}.out")):
        name = log.name[: -len(f"-{jobid}.out")]
        written_for = project.launcher_cluster(project.launcher_path(reg, name))
        if written_for is None or written_for == cluster:
            mine.append(log)
        else:
            other.append((log, written_for))
    return mine, other


def find_log(reg: Registry, cluster: Cluster, jobid: str, wait: bool = False) -> Path:
    """The job's output file: scontrol's StdOut while ``cluster``'s controller knows the job, else
    launch/logs/*-JOBID.out of a launcher written for ``cluster`` (:func:`logs_for`).

    With ``wait`` (following), a job that has not started yet is waited for until Slurm creates its file."""
    if not _JOBID.match(str(jobid)):
        raise ShipyardError(f"JOBID {jobid!r}: expected a Slurm job id such as 1234 (or 1234_5 for an array task)")
    res = slurm.query(cluster, ["scontrol", "show", "job", "--oneliner", str(jobid)])
    if res.returncode == 0:
        path = stdout_from_scontrol(res.stdout)
        if path:
            p = Path(path)
            if wait and not p.exists():  # a pending job: Slurm creates the file when it starts
                job = slurm.Job(cluster, jobid)
                job.wait(poll=slurm.policy()["poll"]["log_s"], until=p.exists)
                stuck = job.stuck()
                if stuck:
                    raise ShipyardError(f"job {jobid} cannot start ({stuck}): it stays PENDING until that changes; "
                                        "nothing to follow", exit_code=1)
            if p.exists():
                return p
    found, elsewhere = logs_for(reg, cluster.name, jobid)
    if found:
        return found[0]
    if elsewhere:
        raise ShipyardError(f"job {jobid}: not known to cluster {cluster.name}'s Slurm, and {elsewhere[0][0]} is the "
                            f"log of a job {jobid} on cluster {elsewhere[0][1]} (same number, another cluster); "
                            f"pass --cluster {elsewhere[0][1]} for that one")
    if res.returncode == 0 and not stdout_from_scontrol(res.stdout):
        raise ShipyardError(f"job {jobid} has no output file (an interactive srun/salloc job: its output went to "
                            "the terminal)")
    if res.returncode == 0:
        raise ShipyardError(f"job {jobid}: its output file {stdout_from_scontrol(res.stdout)} does not exist here "
                            "(not written yet, or on a filesystem this host does not see)")
    raise ShipyardError(f"job {jobid}: no output file (Slurm no longer knows the job, and "
                        f"{project.launch_logs_dir(reg)}/*-{jobid}.out does not exist)")


def tail(path: Path, lines: int, block: int = 65536) -> tuple[list[str], int]:
    """The last ``lines`` lines of ``path`` and the file size at that moment (where following continues)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = pos = fh.tell()
        data = b""
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    text = data.decode("utf-8", errors="replace")
    out = text.splitlines(keepends=True)
    return (out[-lines:] if lines > 0 else []), size
