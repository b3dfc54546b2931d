"""A real local Slurm cluster (slurmctld + one slurmd per node + munged) on this one machine.

Why real Slurm and not an imitation: a launcher that never ran under the scheduler it targets is a guess. Debian's
slurm-wlm 22.05 runs unmodified; only its surroundings are arranged:

* Each node (and the controller) lives in its own network, UTS and mount namespaces, so it has its own hostname and IP
  and a private /etc/hosts. The namespaces are held by one ``sleep`` process each ("holder"): no ``ip netns`` mount
  points are created in the host, and a namespace disappears when the last process in it ends. Addresses exist only
  inside these namespaces (a bridge in the controller's, one veth pair per node), so the host's network is untouched.
* Every file (config, state, logs, the munge socket, fake GPU device files) lives under one directory
  (:func:`default_directory`); /etc/slurm is never written.
* Every process :func:`up` starts is recorded in ``state.json`` with its PID *and* kernel start time, so :func:`down`
  stops exactly those processes (and the job processes inside the sandbox's namespaces), never a look-alike that
  reused a PID.

The cluster's shape comes from registry.yaml's ``clusters.sandbox``; the sandbox's own facts (packages, addresses,
ports, timeouts) from ``shipyard/data/sandbox.yaml``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator, Sequence

import yaml

from shipyard.cli import atomic_write
from shipyard.errors import ShipyardError
from shipyard.templating import template_environment

DIR_ENV = "SHIPYARD_SANDBOX_DIR"
CLUSTER = "sandbox"  # the registry's cluster entry that gives the shape
CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "srun", "sinfo", "scancel", "salloc")
# What down() removes without --keep; anything else in the directory (e.g. the cluster's image storage) stays.
_OWNED = ("etc", "log", "run", "state", "dev", "jobs", "env.sh", "state.json", ".lock")


# ------------------------------------------------------------------------------------------------ facts and plan


@functools.lru_cache(maxsize=1)
def facts() -> dict:
    """The sandbox's site facts (shipyard/data/sandbox.yaml)."""
    return yaml.safe_load(resources.files("shipyard").joinpath("data/sandbox.yaml").read_text())


def default_directory() -> Path:
    """``$SHIPYARD_SANDBOX_DIR``, else ``<project>/.sandbox`` (the project is where registry.yaml lives)."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).absolute()
    from shipyard import registry

    return registry.load().root / ".sandbox"


def _directory(directory) -> Path:
    return Path(directory).absolute() if directory else default_directory()


def _count(value, flag: str, most: int) -> int:
    """A flag's value (invoke passes strings) as an integer from 1 to ``most``."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= most or str(value).strip() != str(n):
        raise ShipyardError(f"{flag} {value!r}: must be an integer from 1 to {most}")
    return n


@dataclass(frozen=True)
class Host:
    name: str
    ip: str


@dataclass(frozen=True)
class Plan:
    """Everything the config files are rendered from: pure data, so the renderers are pure functions."""

    root: Path
    controller: Host
    nodes: tuple[Host, ...]
    gpus_per_node: int
    cpus_per_node: int
    partition: str
    max_time: str
    slurmctld_port: int
    slurmd_port: int
    real_memory_mb: int
    def_mem_per_cpu_mb: int
    prefix_len: int
    bridge: str

    conf = property(lambda self: self.root / "etc" / "slurm.conf")
    gres = property(lambda self: self.root / "etc" / "gres.conf")
    hosts = property(lambda self: self.root / "etc" / "hosts")
    resolv = property(lambda self: self.root / "etc" / "resolv.conf")
    env_sh = property(lambda self: self.root / "env.sh")
    state_file = property(lambda self: self.root / "state.json")
    munge_dir = property(lambda self: self.root / "run" / "munge")
    munge_socket = property(lambda self: self.root / "run" / "munge" / "munge.socket")
    log_dir = property(lambda self: self.root / "log")

    def log(self, daemon: str) -> Path:
        return self.log_dir / f"{daemon}.log"


def make_plan(directory, nodes: int | None = None, gpus_per_node: int | None = None, cluster=None) -> Plan:
    """Combine the registry's sandbox cluster (or explicit overrides) with the site facts."""
    if cluster is None:
        from shipyard import registry

        cluster = registry.load().cluster(CLUSTER)
    f = facts()
    net = f["network"]
    nodes = (cluster.nodes or 1) if nodes is None else nodes
    gpus = cluster.gpus_per_node if gpus_per_node is None else gpus_per_node
    nodes = _count(nodes, "--nodes", 64)
    gpus = _count(gpus, "--gpus-per-node", 16)
    first = ipaddress.ip_address(net["node_ip_start"])
    hosts = tuple(Host(f"{net['node_name_prefix']}{i + 1}", str(first + i)) for i in range(nodes))
    return Plan(
        root=Path(directory).absolute(),
        controller=Host(net["controller"]["name"], net["controller"]["ip"]),
        nodes=hosts,
        gpus_per_node=gpus,
        cpus_per_node=cluster.cpus_per_node or 1,
        partition=cluster.partition,
        max_time=cluster.time or "INFINITE",
        slurmctld_port=int(net["slurmctld_port"]),
        slurmd_port=int(net["slurmd_port"]),
        real_memory_mb=int(f["node_real_memory_mb"]),
        def_mem_per_cpu_mb=int(f["def_mem_per_cpu_mb"]),
        prefix_len=int(net["prefix_len"]),
        bridge=net["bridge"],
    )


# ------------------------------------------------------------------------------------------------ rendering (pure)


@functools.lru_cache(maxsize=1)
def _jinja():
    return template_environment("sandbox", {"q": lambda v: shlex.quote(str(v))}, trim_blocks=True)


def render(template: str, **context) -> str:
    """Render ``shipyard/templates/sandbox/<template>`` with StrictUndefined (a missing fact is an error)."""
    return _jinja().get_template(template).render(**context)


def render_configs(plan: Plan) -> dict[str, str]:
    """slurm.conf, gres.conf and the namespaces' hosts and resolv.conf, keyed by file name."""
    return {
        "slurm.conf": render("slurm.conf.j2", p=plan),
        "gres.conf": render("gres.conf.j2", p=plan),
        "hosts": render("hosts.j2", p=plan),
        "resolv.conf": render("resolv.conf.j2", p=plan),
    }


def render_env_sh(plan: Plan, netns: str, python_bin: str) -> str:
    """The env file to source: one shell function per Slurm client that enters the controller's namespace."""
    return render("env.sh.j2", p=plan, netns=netns, python_bin=python_bin, clients=CLIENTS)


# ------------------------------------------------------------------------------------------------ preflight


def cannot_run_reason() -> str | None:
    """Why the sandbox cannot run on this machine (one line), or None: it needs root on Debian or Ubuntu."""
    if os.geteuid() != 0:
        return "the Slurm sandbox needs root (it starts daemons and creates network namespaces)"
    ids = set()
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            key, _, val = line.partition("=")
            if key in ("ID", "ID_LIKE"):
                ids.update(val.strip().strip('"').split())
    if not ids & {"debian", "ubuntu"}:
        return f"the Slurm sandbox needs Debian or Ubuntu (this is {', '.join(sorted(ids)) or 'unknown'})"
    return None


def missing_packages(path: str | None = None) -> dict[str, str]:
    """Binaries the sandbox needs that are not on PATH -> the Debian package that provides each."""
    return {b: pkg for b, pkg in facts()["packages"].items() if shutil.which(b, path=path) is None}


def ensure_packages(install: bool = True) -> list[str]:
    """Install missing packages with apt-get (or, with ``install=False``, refuse naming them). Returns installed."""
    missing = missing_packages()
    if not missing:
        return []
    pkgs = sorted(set(missing.values()))
    if not install:
        raise ShipyardError(f"sandbox.up: missing {', '.join(sorted(missing))} (install with: apt-get install -y "
                            f"{' '.join(pkgs)}; or run sandbox.up without --no-install)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *pkgs]
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise ShipyardError(f"sandbox.up: apt-get install {' '.join(pkgs)} failed: {last}")
    still = missing_packages()
    if still:
        raise ShipyardError(f"sandbox.up: still missing after apt-get: {', '.join(sorted(still))}")
    return pkgs


# ------------------------------------------------------------------------------------------------ processes


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def _alive(proc: dict) -> bool:
    """Is this exactly the recorded process (same PID and start time) and not a zombie?"""
    st = _proc_stat(proc["pid"])
    return st is not None and st[0] not in ("Z", "X") and st[1] == proc["start"]


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _reap(pid: int) -> None:
    """Collect a child we started (the test fixture's process) so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_gone(pids: Sequence[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    left = list(pids)
    while left and time.monotonic() < deadline:
        for p in left:
            _reap(p)
        left = [p for p in left if (st := _proc_stat(p)) is not None and st[0] not in ("Z", "X")]
        if left:
            time.sleep(0.05)
    return left


def _kill(pids: Sequence[int], stop_s: float) -> None:
    """SIGTERM, then SIGKILL whatever is left after ``stop_s``."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    left = _wait_gone(pids, stop_s)
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    _wait_gone(left, stop_s)


# ------------------------------------------------------------------------------------------------ state


def _read_state(root: Path) -> dict | None:
    try:
        return json.loads((root / "state.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ShipyardError(f"{root / 'state.json'}: unreadable sandbox state ({exc}); remove the file after "
                            "checking that no sandbox daemon runs") from None


def _write_state(root: Path, state: dict) -> None:
    atomic_write(root / "state.json", json.dumps(state, indent=2) + "\n")


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Serialise up/down on one directory (two test sessions or two shells)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _running(state: dict | None) -> bool:
    return bool(state) and state.get("status") == "up" and all(_alive(p) for p in state["processes"])


def _controller_pid(state: dict) -> int:
    return next(p["pid"] for p in state["processes"] if p["role"] == "ns:" + state["info"]["controller"]["name"])


# ------------------------------------------------------------------------------------------------ public API


def is_up(directory=None) -> bool:
    """True when every process the sandbox in ``directory`` started is still running."""
    return _running(_read_state(_directory(directory)))


def _python_bin() -> str:
    return str(Path(sys.executable).parent)


def client_env(directory=None) -> dict[str, str]:
    """Environment for running a Slurm client against the sandbox (use with :func:`client_argv`'s argv).

    PATH starts with this Python's bin directory: Slurm copies the submitter's environment into jobs, so a job's
    ``python`` is the one shipyard (and torch) runs with.
    """
    root = _directory(directory)
    env = dict(os.environ)
    env["SLURM_CONF"] = str(root / "etc" / "slurm.conf")
    env["PATH"] = _python_bin() + os.pathsep + env.get("PATH", os.defpath)
    env[DIR_ENV] = str(root)
    return env


def client_argv(argv: Sequence[str], directory=None, timeout: float | None = None) -> list[str]:
    """Wrap a Slurm client command (sbatch, srun, squeue, ...) so that, run from the host, it talks to the sandbox.

    The command enters the controller's network namespace (where the sandbox's addresses exist), gets SLURM_CONF
    and PATH (see :func:`client_env`) and runs under ``timeout``, because a client against a dead controller blocks
    for minutes. ``timeout`` defaults to ``timeouts.client_s`` from the site facts; 0 means none (long ``srun``).
    """
    root = _directory(directory)
    state = _read_state(root)
    if not _running(state):
        raise ShipyardError(f"the Slurm sandbox in {root} is not running (start it with: invoke sandbox.up)")
    if not argv:
        raise ShipyardError("sandbox.exec: no command given (usage: invoke sandbox.exec -- sinfo -N)")
    t = facts()["timeouts"]["client_s"] if timeout is None else timeout
    env = client_env(root)
    wrap = ["nsenter", f"--net=/proc/{_controller_pid(state)}/ns/net", "--",
            "env", f"SLURM_CONF={env['SLURM_CONF']}", f"PATH={env['PATH']}", f"{DIR_ENV}={root}"]
    if t:
        wrap += ["timeout", "--kill-after=5", str(t)]
    return wrap + [str(a) for a in argv]


def run_client(argv: Sequence[str], directory=None, timeout: float | None = None,
               **kwargs) -> subprocess.CompletedProcess:
    """Run a Slurm client against the sandbox (``subprocess.run`` keyword arguments pass through)."""
    kwargs.setdefault("env", client_env(directory))
    return subprocess.run(client_argv(argv, directory, timeout), **kwargs)


def exec_command(argv: Sequence[str], directory=None) -> int:
    """``invoke sandbox.exec -- CMD ...``: run CMD against the sandbox with the terminal attached; its exit code.

    ``argv`` is ``sys.argv``: invoke joins its ``--`` remainder into one string and loses quoting, so the words
    after ``--`` are read from it (with launch's reader, which ``invoke launch`` uses for the same reason).
    """
    from shipyard.launch import argv_after_dashdash

    return subprocess.run(client_argv(list(argv_after_dashdash(argv)), directory, timeout=0),
                          env=client_env(directory)).returncode


def status(directory=None) -> str:
    """A human summary: where the sandbox is, its nodes and partitions (sinfo) and its jobs (squeue)."""
    root = _directory(directory)
    state = _read_state(root)
    if not _running(state):
        dead = [p["role"] for p in (state or {}).get("processes", []) if not _alive(p)]
        crashed = bool(dead) and state.get("status") == "up"
        why = f" (stopped: {', '.join(dead)}; invoke sandbox.up restarts it)" if crashed else ""
        return f"sandbox {root}: down{why}"
    info = state["info"]
    lines = [f"sandbox {root}: up since {time.strftime('%H:%M:%S', time.localtime(state['started']))}, "
             f"controller {info['controller']['name']} ({info['controller']['ip']}), "
             f"env file {root / 'env.sh'}"]
    for argv in (["sinfo", "-N", "-o", "%N %P %T %c %m %G"], ["squeue", "-o", "%i %P %j %T %M %D %R"]):
        res = run_client(argv, root, capture_output=True, text=True)
        lines.append(f"$ {shlex.join(argv)}")
        lines.append((res.stdout + res.stderr).rstrip())
    return "\n".join(lines)


def up(nodes: int | None = None, gpus_per_node: int | None = None, directory=None, install: bool = True, *,
       cluster=None) -> dict:
    """Start the sandbox (or report the one already running there) and wait until every node is idle.

    ``cluster`` (a :class:`shipyard.model.Cluster`) gives the shape; by default the loaded registry's
    ``clusters.sandbox``. Returns ``{"directory", "controller": {name, ip}, "nodes": [{name, hostname, ip}],
    "partition", "gpus_per_node", "env_file", "conf", "logs", "already_running", "seconds"}``; ``seconds`` is
    packages-installed to every-node-idle.
    """
    reason = cannot_run_reason()
    if reason:
        raise ShipyardError(f"sandbox.up: {reason}")
    root = _directory(directory)
    plan = make_plan(root, nodes, gpus_per_node, cluster)
    with _locked(root):
        state = _read_state(root)
        if _running(state):
            info = dict(state["info"], already_running=True)
            want = (len(plan.nodes), plan.gpus_per_node)
            have = (len(info["nodes"]), info["gpus_per_node"])
            if (nodes is not None or gpus_per_node is not None) and want != have:
                raise ShipyardError(f"sandbox.up: the sandbox in {root} already runs with {have[0]} nodes x "
                                    f"{have[1]} GPUs; run invoke sandbox.down first to start {want[0]} x {want[1]}")
            return info
        if state:  # a crashed or half-started sandbox: stop what is left of it, keep its logs for now
            _stop(state, root)
        ensure_packages(install)
        from shipyard import sandbox_start

        return sandbox_start.start(plan)


def _stop(state: dict, root: Path) -> None:
    """Stop the sandbox's processes: first everything inside its namespaces (daemons and job steps), then munged,
    then the namespace holders. Only processes whose PID *and* start time match the record are signalled."""
    stop_s = facts()["timeouts"]["stop_s"]
    procs = [p for p in state.get("processes", []) if _alive(p)]
    holders = [p for p in procs if p["role"].startswith("ns:")]
    # The sandbox's namespaces, found through any live process that ran in one (a holder may have died while its
    # slurmd lives on). Never this process's own namespace: munged, for one, runs in the host's.
    inodes = {_netns_inode(p["pid"]) for p in procs if p["role"] != "munged"} - {None, _netns_inode(os.getpid())}
    holder_pids = {p["pid"] for p in holders}
    inside = []
    if inodes:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in holder_pids and _netns_inode(int(entry.name)) in inodes:
                inside.append(int(entry.name))
    _kill(inside, stop_s)
    _kill([p["pid"] for p in procs if not p["role"].startswith("ns:") and _alive(p)], stop_s)
    _kill([p["pid"] for p in holders if _alive(p)], stop_s)
    state["status"] = "down"
    _write_state(root, state)


def down(directory=None, keep: bool = False) -> str:
    """Stop exactly what :func:`up` started (by PID), which removes its namespaces and their mounts; then remove the
    sandbox's files unless ``keep``. Returns one line saying what was done."""
    root = _directory(directory)
    if not root.exists():
        return f"sandbox {root}: nothing to stop"
    with _locked(root):
        state = _read_state(root)
        n = 0
        if state:
            n = sum(_alive(p) for p in state.get("processes", []))
            _stop(state, root)
        if not keep:
            for name in _OWNED:
                p = root / name
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
    if not keep:
        with contextlib.suppress(OSError):
            root.rmdir()  # only when nothing else (e.g. stored images) is there
    kept = f"; files kept in {root}" if keep else ""
    return f"sandbox {root}: stopped {n} process(es){kept}"


def info_line(info: dict) -> str:
    """One line per fact of an :func:`up` result, for the task's output."""
    head = "already running" if info.get("already_running") else f"up in {info['seconds']:.2f} s"
    nodes = ", ".join(f"{n['hostname']} {n['ip']}" for n in info["nodes"])
    return (f"sandbox {info['directory']}: {head}; partition {info['partition']}; nodes {nodes}; "
            f"{info['gpus_per_node']} fake GPUs per node\n"
            f"  clients: invoke sandbox.exec -- sinfo   or   . {shlex.quote(info['env_file'])} && sinfo")


# ------------------------------------------------------------------------------------------------ extra SPANK plugins
# Hook added by the launch area: tests that need a SPANK plugin (the pyxis test double) list it here.


def set_plugstack(plugins: Sequence[str | os.PathLike], directory=None) -> Path:
    """Write the sandbox's ``etc/plugstack.conf`` listing ``plugins`` (``optional`` entries; [] empties it).

    Why no restart: Slurm reads plugstack.conf beside $SLURM_CONF in every client (srun/sbatch option parsing) and
    in slurmstepd at each step, so the change applies to the next command. ``sandbox.down`` removes it with etc/.
    """
    root = _directory(directory)
    text = "".join(f"optional {Path(p).absolute()}\n" for p in plugins)
    return atomic_write(root / "etc" / "plugstack.conf", text)


def munge_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("munge")
    except KeyError:
        raise ShipyardError("sandbox.up: no 'munge' user (reinstall the munge package: apt-get install --reinstall "
                            "munge)") from None


__all__ = ["up", "down", "status", "is_up", "default_directory", "client_argv", "client_env", "run_client",
           "exec_command", "make_plan", "render_configs", "render_env_sh",
           "cannot_run_reason", "missing_packages", "Plan", "Host"]
