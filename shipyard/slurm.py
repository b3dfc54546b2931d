"""The one Slurm client: every sbatch, srun, squeue, sacct, scontrol and sinfo that shipyard runs goes through here.

It owns three things that were once spread over five wrappers:

* **Routing.** A real cluster's clients run as they are, on its login node. A cluster whose profile says
  ``local_sandbox: true`` is the local Slurm sandbox (:mod:`shipyard.sandbox`), whatever its name: its addresses
  exist only inside the controller's network namespace, so a client enters that namespace (``nsenter --net``) with
  ``SLURM_CONF`` and ``PATH`` set for it. The route is read from the sandbox's ``state.json``; the controller is
  trusted only while its PID *and* start time match.
  A cluster with ``login`` and ``remote`` (docs/remote.md) is reached from a workstation over ssh: every client runs
  on its login node through the shared master connection (:mod:`shipyard.remote.transport`), stdin closed, after
  ``ssh -O check``; without the master it is one line naming `invoke remote.login CLUSTER`, exit 2.
* **Timeouts.** One policy from ``shipyard/data/slurm.yaml``: queries and submissions end within a bound (a dead
  controller blocks a client for minutes); interactive steps (``timeout=0``) do not.
* **States and errors.** One set of final and alive job states and the one success state, all from the data file;
  a missing client, a timeout or a refusal is one line naming the cluster.
* **Waiting for a job.** :class:`Job` is the one handle on a submitted job: its state, waiting for its end, and
  following its log. `build --slurm --wait`, stage's import job, `logs -f` and the demo each had their own loop,
  with two sources of state and the success state written as a literal; now they share this one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Sequence

from shipyard import facts, procs
from shipyard.errors import ShipyardError
from shipyard.remote import transport


@dataclass(frozen=True)
class Target:
    """A cluster as a launcher remembers it, or as the sandbox's own commands address the sandbox (sandbox.exec,
    the demo's job; no registry needed): its name, for messages, and whether it is this machine's sandbox. A
    registry's :class:`~shipyard.registry.model.Cluster` answers the same two; its profile's ``local_sandbox: true``
    makes it the sandbox, whatever its name."""
    name: str
    local_sandbox: bool = False


SANDBOX = Target("sandbox", local_sandbox=True)
DIR_ENV = "SHIPYARD_SANDBOX_DIR"


def policy() -> dict:
    """Timeouts and job states (shipyard/data/slurm.yaml)."""
    return facts.load("slurm")


def final_states() -> frozenset[str]:
    return frozenset(policy()["final_states"])


def alive_states() -> frozenset[str]:
    return frozenset(policy()["alive_states"])


def succeeded(state: str | None) -> bool:
    """The job ended in the success state (``success_state`` in shipyard/data/slurm.yaml)."""
    return state == policy()["success_state"]


def cluster_name(cluster) -> str:
    """A :class:`~shipyard.registry.model.Cluster` or its name -> the name."""
    return getattr(cluster, "name", cluster)


def is_sandbox(cluster) -> bool:
    """The sandbox runs on this machine: its clients need the namespace route, its paths can be checked here. Its
    profile says so (``local_sandbox: true``); a cluster's name alone is not enough."""
    return bool(getattr(cluster, "local_sandbox", False))


# ------------------------------------------------------------------------------------------------ the sandbox route


def sandbox_directory(directory=None) -> Path:
    """``directory``, else ``$SHIPYARD_SANDBOX_DIR``, else the machine's one sandbox (``default_directory`` in
    shipyard/data/sandbox.yaml). Why per machine and not per project: the sandbox *is* this machine's cluster; one
    directory per registry started a second cluster whenever `sandbox.up` ran beside another registry.yaml (a
    course folder), and `launch --cluster sandbox` there could not find the first."""
    if directory:
        return Path(directory).absolute()
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).absolute()
    return Path(facts.load("sandbox")["default_directory"])


def read_sandbox_state(root: Path) -> dict | None:
    """The sandbox's ``state.json`` (written by :mod:`shipyard.sandbox`), or None when there is none."""
    try:
        return json.loads((root / "state.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ShipyardError(f"{root / 'state.json'}: unreadable sandbox state ({exc}); remove the file after "
                            "checking that no sandbox daemon runs") from None


def sandbox_running(state: dict | None) -> bool:
    """Every process the sandbox recorded is still exactly that process."""
    return bool(state) and state.get("status") == "up" and all(procs.alive(p) for p in state["processes"])


def controller_pid(state: dict) -> int:
    """The PID holding the controller's namespaces."""
    return next(p["pid"] for p in state["processes"] if p["role"] == "ns:" + state["info"]["controller"]["name"])


def python_bin() -> str:
    """This Python's bin directory: first on the PATH that Slurm copies into sandbox jobs."""
    return str(Path(sys.executable).parent)


def client_env(directory=None) -> dict[str, str]:
    """Environment for a Slurm client against the sandbox (use with :func:`client_argv`'s argv).

    PATH starts with this Python's bin directory: Slurm copies the submitter's environment into jobs, so a job's
    ``python`` is the one shipyard (and torch) runs with.
    """
    root = sandbox_directory(directory)
    env = dict(os.environ)
    env["SLURM_CONF"] = str(root / "etc" / "slurm.conf")
    env["PATH"] = python_bin() + os.pathsep + env.get("PATH", os.defpath)
    env[DIR_ENV] = str(root)
    return env


def client_argv(argv: Sequence[str], directory=None, timeout: float | None = None) -> list[str]:
    """Wrap a Slurm client command so that, run from the host, it talks to the sandbox.

    The command enters the controller's network namespace, gets SLURM_CONF and PATH (see :func:`client_env`) and
    runs under ``timeout`` (default: the query timeout; 0 means none, for a long ``srun``).
    """
    root = sandbox_directory(directory)
    state = read_sandbox_state(root)
    if not sandbox_running(state):
        raise ShipyardError(f"the Slurm sandbox in {root} is not running (start it with: invoke sandbox.up)")
    if not argv:
        raise ShipyardError("sandbox.exec: no command given (usage: invoke sandbox.exec -- sinfo -N)")
    t = policy()["timeouts"]["query_s"] if timeout is None else timeout
    env = client_env(root)
    return namespace_argv(argv, controller_pid(state), env["SLURM_CONF"], t,
                          {"PATH": env["PATH"], DIR_ENV: str(root)})


def namespace_argv(argv: Sequence[str], net_pid: int, slurm_conf: str | os.PathLike, timeout: float,
                   extra_env: dict[str, str] | None = None) -> list[str]:
    """``argv`` run inside the network namespace of ``net_pid`` with ``SLURM_CONF`` (and ``extra_env``) set and
    under ``timeout`` seconds (0: none). Also used while the sandbox starts, before its state says "up"."""
    env = {"SLURM_CONF": str(slurm_conf), **(extra_env or {})}
    wrap = ["nsenter", f"--net=/proc/{net_pid}/ns/net", "--", "env", *(f"{k}={v}" for k, v in env.items())]
    if timeout:
        wrap += ["timeout", "--kill-after=5", str(timeout)]
    return wrap + [str(a) for a in argv]


# ------------------------------------------------------------------------------------------------ running clients


def route(cluster, argv: Sequence[str], timeout: float = 0, directory=None) -> tuple[list[str], dict | None]:
    """(argv, env) that run ``argv`` against ``cluster``'s Slurm: over ssh to a remote cluster's login node, through
    the sandbox's namespace, else as is."""
    if transport.is_remote(cluster):
        return transport.command_argv(cluster, argv), None
    if is_sandbox(cluster):
        return client_argv(argv, directory, timeout=timeout), client_env(directory)
    return [str(a) for a in argv], None


def run(cluster, argv: Sequence[str], *, timeout: float | None = None, directory=None,
        capture: bool = True) -> subprocess.CompletedProcess:
    """Run a Slurm client against ``cluster`` (a Cluster or its name).

    ``timeout`` defaults to the query timeout; 0 means none (interactive ``srun``, ``sandbox.exec``). A client that
    does not finish in time comes back with exit code 124 and says so on stderr. ``capture=False`` leaves the
    terminal attached (output not captured).
    """
    t = policy()["timeouts"]["query_s"] if timeout is None else timeout
    full, env = route(cluster, argv, t, directory)
    kwargs = {"capture_output": True, "text": True} if capture else {}
    if transport.is_remote(cluster):
        kwargs["stdin"] = subprocess.DEVNULL  # never a prompt, never the user's terminal
    try:
        return subprocess.run(full, env=env, timeout=(t + 10) if t else None, **kwargs)
    except FileNotFoundError:
        if transport.is_remote(cluster):
            raise ShipyardError(f"ssh is not on PATH: install the OpenSSH client to reach cluster "
                                f"{cluster_name(cluster)}") from None
        raise ShipyardError(f"{full[0]} is not on PATH: run this on a login node of cluster "
                            f"{cluster_name(cluster)}") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(full, 124, "", f"{argv[0]}: no answer within {t:.0f} s")


def last_error(res: subprocess.CompletedProcess) -> str:
    """The last line a failed client printed (stderr first), for one-line errors."""
    return ((res.stderr or "").strip().splitlines() or (res.stdout or "").strip().splitlines()
            or [f"exit {res.returncode}"])[-1]


def query(cluster, argv: Sequence[str], timeout: float | None = None, directory=None) -> subprocess.CompletedProcess:
    """:func:`run` for the quick clients (squeue, sacct, scontrol, sinfo): a timeout is a one-line error."""
    t = policy()["timeouts"]["query_s"] if timeout is None else timeout
    res = run(cluster, argv, timeout=t, directory=directory)
    if res.returncode == 124 and not res.stdout:
        raise ShipyardError(f"{argv[0]} did not answer within {t:.0f} s (is slurmctld of {cluster_name(cluster)} "
                            "up?)")
    return res


def submit(cluster, script: str | os.PathLike, *, after: str | None = None, directory=None,
           extra: Sequence[str] = ()) -> str:
    """``sbatch --parsable [--dependency=afterany:AFTER] SCRIPT``; the job id. A refusal is one line, exit code 1.

    *afterany*, not afterok: a chained segment that reaches its time limit ends TIMEOUT even after checkpointing.
    """
    argv = (["sbatch", "--parsable"] + ([f"--dependency=afterany:{after}"] if after else []) + list(extra)
            + [str(script)])  # extra: a sweep's --array and offset
    res = run(cluster, argv, timeout=policy()["timeouts"]["submit_s"], directory=directory)
    if res.returncode != 0:
        elsewhere = not_a_login_node(cluster, res)
        if elsewhere:
            raise ShipyardError(elsewhere)
        raise ShipyardError(f"sbatch {Path(script).name} on cluster {cluster_name(cluster)}: {last_error(res)}",
                            exit_code=1)
    return res.stdout.strip().split(";")[0]


# What Slurm's clients say when this machine has no configuration of the cluster (slurm.conf or configless): the
# command ran where no Slurm cluster is, not a job that Slurm refused.
_NO_CLUSTER_HERE = ("Could not establish a configuration source", "Unable to contact slurm controller",
                    "s_p_parse_file: unable to read")


def not_a_login_node(cluster, res: subprocess.CompletedProcess) -> str | None:
    """One line (bad input: exit 2) when a client failed because this machine is no login node of ``cluster``."""
    text = (res.stderr or "") + (res.stdout or "")
    if not any(s in text for s in _NO_CLUSTER_HERE) or is_sandbox(cluster):
        return None
    name = cluster_name(cluster)
    return (f"cluster {name}: this machine is not one of its login nodes ({last_error(res)}); run the command on "
            f"one, or set clusters.{name}.login and remote to reach it over ssh (docs/remote.md)")


def test_only(cluster, script: str | os.PathLike, *, directory=None) -> str:
    """``sbatch --test-only SCRIPT``: Slurm's verdict without queueing anything. Returns its answer (the
    "Job N to start at TIME using ... on nodes ... in partition P" line); a rejection is one ShipyardError line with
    Slurm's message, exit code 2 (the script, as written, would not be accepted)."""
    res = run(cluster, ["sbatch", "--test-only", str(script)], timeout=policy()["timeouts"]["submit_s"],
              directory=directory)
    text = " ".join(((res.stderr or "") + "\n" + (res.stdout or "")).split())
    if res.returncode != 0:
        raise ShipyardError(f"sbatch --test-only {Path(script).name} on cluster {cluster_name(cluster)}: "
                            f"{last_error(res).removeprefix('sbatch: ').strip()}")
    found = re.search(r"Job \S+ to start at .*", text)
    return (found.group(0) if found else text or "accepted").removeprefix("sbatch: ")


def max_array_size(cluster, directory=None) -> int:
    """The cluster's ``MaxArraySize`` from ``scontrol show config`` (array task ids must be below it)."""
    res = query(cluster, ["scontrol", "show", "config"], directory=directory)
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", res.stdout or "", re.M)
    if res.returncode != 0 or not found:
        raise ShipyardError(f"scontrol show config on cluster {cluster_name(cluster)}: no MaxArraySize "
                            f"({last_error(res) if res.returncode else 'not in its answer'})")
    return int(found.group(1))


def job_fields(cluster, jobid: str, directory=None) -> dict[str, str]:
    """``scontrol show job -o JOBID`` as a dict (empty when the controller no longer knows the job)."""
    res = run(cluster, ["scontrol", "show", "job", "-o", str(jobid)], directory=directory)
    return dict(re.findall(r"(\S+?)=(\S*)", res.stdout)) if res.returncode == 0 else {}


class Job:
    """A submitted job on ``cluster`` (a Cluster or its name): its state, its end, its log.

    Why one handle: four commands wait for a job (`build --slurm --wait`, stage's enroot import, `logs -f`, the
    demo). Each had its own loop with its own idea of "ended" (scontrol's final states in one, squeue's alive states
    in another, the success state written as a literal in three). Here the state comes from scontrol while the
    controller keeps the job and from squeue's memory of it after that; "ended" is a final state of shipyard/data/slurm.yaml, or a
    job the scheduler no longer knows (:meth:`state` is then None: nothing more will happen to it).
    """

    def __init__(self, cluster, job_id: str, directory=None):
        self.cluster = cluster
        self.id = str(job_id)
        self.directory = directory  # the sandbox's directory, when the cluster is the sandbox
        self.fields: dict[str, str] = {}  # the last `scontrol show job` answer (ExitCode, StdOut, ...)

    def __repr__(self) -> str:
        return f"Job({cluster_name(self.cluster)!r}, {self.id!r})"

    def state(self) -> str | None:
        """The job's state now: scontrol's JobState, else the first state squeue remembers, else None."""
        self.fields = job_fields(self.cluster, self.id, self.directory)
        if self.fields.get("JobState"):
            return self.fields["JobState"]
        res = query(self.cluster, ["squeue", "--noheader", "--states=all", f"--jobs={self.id}", "--format=%T"],
                    directory=self.directory)
        return (res.stdout.split() or [None])[0] if res.returncode == 0 else None

    def stuck(self) -> str | None:
        """Why this PENDING job cannot start (``never_start_reasons`` of shipyard/data/slurm.yaml), from the last
        :meth:`state` answer: "PartitionTimeLimit: the job's time limit exceeds the partition's"; None otherwise."""
        if self.fields.get("JobState") != "PENDING":
            return None
        reason = self.fields.get("Reason", "")
        meaning = policy().get("never_start_reasons", {}).get(reason)
        return f"{reason}: {meaning}" if meaning else None

    @staticmethod
    def ended(state: str | None) -> bool:
        """A final state, or a job the scheduler no longer knows (None)."""
        return state is None or state in final_states()

    def wait(self, timeout: float | None = None, poll: float | None = None,
             until: Callable[[], bool] | None = None) -> str | None:
        """Ask for the state every ``poll`` seconds (default ``poll.wait_s``) until the job ended, ``until()`` holds,
        it cannot start (:meth:`stuck`), or ``timeout`` seconds passed (None: no limit); the last state seen. The
        caller tells a timeout by a state that has not :meth:`ended`, and a job that cannot start by :meth:`stuck`."""
        poll = policy()["poll"]["wait_s"] if poll is None else poll
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.state()
            if self.ended(state) or self.stuck() or (until is not None and until()):
                return state
            if deadline is not None and time.monotonic() >= deadline:
                return state
            time.sleep(poll)

    def cancel(self) -> None:
        """``scancel`` the job (its answer is not checked: a job that just ended cannot be cancelled)."""
        run(self.cluster, ["scancel", self.id], directory=self.directory)

    def follow(self, log: str | os.PathLike, out: IO[str], offset: int = 0, poll: float | None = None,
               check_every: float | None = None) -> str | None:
        """Print what is appended to ``log`` from byte ``offset`` on, whole lines at a time, until the job ended and
        nothing more arrives, or it is PENDING for a reason it cannot start with (:meth:`stuck`, the caller decides);
        the job's last state (None: the scheduler no longer knows it).

        The file is read every ``poll`` seconds (default ``poll.log_s``), the scheduler asked every ``check_every``
        (default ``poll.state_s``); a log that does not exist yet (a pending job) is waited for."""
        p = policy()["poll"]
        poll = p["log_s"] if poll is None else poll
        check_every = p["state_s"] if check_every is None else check_every
        path = Path(log)
        last_check = None
        pending = b""
        while True:
            chunk = _read_from(path, offset)
            if chunk:
                offset += len(chunk)
                pending += chunk
                cut = pending.rfind(b"\n") + 1
                if cut:
                    out.write(pending[:cut].decode("utf-8", errors="replace"))
                    out.flush()
                    pending = pending[cut:]
                continue
            now = time.monotonic()
            if last_check is None or now - last_check >= check_every:
                last_check = now
                state = self.state()
                if self.stuck():
                    return state
                if self.ended(state):
                    pending += _read_from(path, offset)  # whatever arrived between the last read and the ask
                    if pending:
                        out.write(pending.decode("utf-8", errors="replace"))
                        out.flush()
                    return state
            time.sleep(poll)


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read()
    except FileNotFoundError:
        return b""
