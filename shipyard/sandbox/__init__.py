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
import os
import shlex
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Sequence

from shipyard import procs, slurm
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write
from shipyard.sandbox import apptainer as real_apptainer
from shipyard.sandbox import runtimes as real_runtimes
from shipyard.sandbox import start
from shipyard.sandbox import state as record
from shipyard.sandbox.plan import (
    CLIENTS,
    Host,
    Plan,
    facts,
    make_plan,
    render_configs,
    render_env_sh,
)
from shipyard.slurm import (
    DIR_ENV,
    SANDBOX,
    client_argv,
    client_env,
    read_sandbox_state,
    sandbox_directory,
    sandbox_running,
)

# What down() removes without --keep; anything else in the directory (e.g. the cluster's image storage) stays.
_OWNED = ("etc", "log", "run", "state", "dev", "jobs", "nodes", "node-local", "env.sh", "state.json", ".lock")


def default_directory() -> Path:
    """``$SHIPYARD_SANDBOX_DIR``, else the machine's one sandbox directory (shipyard/data/sandbox.yaml)."""
    return sandbox_directory()


def _directory(directory) -> Path:
    return sandbox_directory(directory)



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


# ------------------------------------------------------------------------------------------------ public API


def is_up(directory=None) -> bool:
    """True when every process the sandbox in ``directory`` started is still running."""
    return sandbox_running(read_sandbox_state(_directory(directory)))


def run_client(argv: Sequence[str], directory=None, timeout: float | None = None,
               **kwargs) -> subprocess.CompletedProcess:
    """Run a Slurm client against the sandbox (``subprocess.run`` keyword arguments pass through)."""
    kwargs.setdefault("env", client_env(directory))
    return subprocess.run(client_argv(argv, directory, timeout), **kwargs)


def status(directory=None) -> str:
    """A human summary: where the sandbox is, its nodes and partitions (sinfo) and its jobs (squeue)."""
    root = _directory(directory)
    state = read_sandbox_state(root)
    if not sandbox_running(state):
        dead = [p["role"] for p in (state or {}).get("processes", []) if not procs.alive(p)]
        crashed = bool(dead) and state.get("status") == "up"
        why = f" (stopped: {', '.join(dead)}; invoke sandbox.up restarts it)" if crashed else ""
        return f"sandbox {root}: down{why}"
    info = state["info"]
    lines = [f"sandbox {root}: up since {time.strftime('%H:%M:%S', time.localtime(state['started']))}, "
             f"controller {info['controller']['name']} ({info['controller']['ip']}), "
             f"env file {root / 'env.sh'}"]
    for argv in (["sinfo", "-N", "-o", "%N %P %T %c %m %G"], ["squeue", "-o", "%i %P %j %T %M %D %R"]):
        res = slurm.run(SANDBOX, argv, directory=root)
        lines.append(f"$ {shlex.join(argv)}")
        lines.append((res.stdout + res.stderr).rstrip())
    return "\n".join(lines)


def up(nodes: int | None = None, gpus_per_node: int | None = None, directory=None, install: bool = True, *,
       cluster) -> dict:
    """Start the sandbox (or report the one already running there) and wait until every node is idle.

    ``cluster`` (a :class:`shipyard.registry.model.Cluster`, the registry's ``clusters.sandbox``) gives the shape.
    Returns ``{"directory", "controller": {name, ip}, "nodes": [{name, hostname, ip}],
    "partition", "gpus_per_node", "env_file", "conf", "logs", "already_running", "seconds"}``; ``seconds`` is
    packages-installed to every-node-idle.
    """
    reason = cannot_run_reason()
    if reason:
        raise ShipyardError(f"sandbox.up: {reason}")
    root = _directory(directory)
    plan = make_plan(root, nodes, gpus_per_node, cluster=cluster)
    with record.locked(root):
        state = read_sandbox_state(root)
        if sandbox_running(state):
            info = dict(state["info"], already_running=True)
            want = (len(plan.nodes), plan.gpus_per_node)
            have = (len(info["nodes"]), info["gpus_per_node"])
            if (nodes is not None or gpus_per_node is not None) and want != have:
                raise ShipyardError(f"sandbox.up: the sandbox in {root} already runs with {have[0]} nodes x "
                                    f"{have[1]} GPUs; run invoke sandbox.down first to start {want[0]} x {want[1]}")
            return info
        if state:  # a crashed or half-started sandbox: stop what is left of it, keep its logs for now
            record.stop(state, root)
        ensure_packages(install)
        return start.start(plan)


def down(directory=None, keep: bool = False) -> str:
    """Stop exactly what :func:`up` started (by PID), which removes its namespaces and their mounts; then remove the
    sandbox's files unless ``keep``. Returns one line saying what was done."""
    root = _directory(directory)
    if not root.exists():
        return f"sandbox {root}: nothing to stop"
    with record.locked(root):
        state = read_sandbox_state(root)
        n = 0
        if state:
            n = sum(procs.alive(p) for p in state.get("processes", []))
            record.stop(state, root)
        installed = real_runtimes.installed_for(root)
        # what sandbox.runtimes installed (enroot under /usr, /etc), unless another running sandbox holds it too
        changed = real_runtimes.uninstall(root, running=_other_running(root))
        installed = installed and real_runtimes.read_record() is None
        held = real_apptainer.holds(real_apptainer.sandbox_holder(root))
        removed = real_apptainer.release(real_apptainer.sandbox_holder(root), sandbox_running=_other_running(root))
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
    rt = "; removed enroot" if installed else ""
    if held:
        rt += "; removed Apptainer" if removed else "; left Apptainer to the others that hold it"
    rt += "".join(f"; left {c}" for c in changed)
    return f"sandbox {root}: stopped {n} process(es){rt}{kept}"


def _other_running(root: Path):
    """Whether a sandbox folder other than ``root`` runs (a holder of the machine's Apptainer)."""
    return lambda d: Path(d) != Path(root) and sandbox_running(read_sandbox_state(d))


def info_line(info: dict) -> str:
    """One line per fact of an :func:`up` result, for the task's output."""
    head = "already running" if info.get("already_running") else f"up in {info['seconds']:.2f} s"
    nodes = ", ".join(f"{n['hostname']} {n['ip']}" for n in info["nodes"])
    users = info.get("host_access")
    anyone = (f"\n  any local user, as themselves: export SLURM_CONF={shlex.quote(info['conf'])}" if users is True else
              f"\n  other users cannot reach it: {users}" if users else "")
    return (f"sandbox {info['directory']}: {head}; partition {info['partition']}; nodes {nodes}; "
            f"{info['gpus_per_node']} fake GPUs per node\n"
            f"  clients: invoke sandbox.exec -- sinfo   or   . {shlex.quote(info['env_file'])} && sinfo" + anyone)


# ------------------------------------------------------------------------------------------------ extra SPANK plugins
# Hook added by the launch area: tests that need a SPANK plugin (the pyxis test double) list it here.


def unreadable_by_others(path: Path) -> str | None:
    """Why a user other than the owner cannot load the file ``path`` (a directory above it without o+x, or the file
    without o+r), or None when every user can; None too for a file that does not exist (yet)."""
    path = Path(path).absolute()
    if not path.exists():
        return None
    for d in reversed(path.parents):
        mode = stat.S_IMODE(d.stat().st_mode)
        if not mode & stat.S_IXOTH:
            return f"{d} is not searchable by others (mode {mode:04o})"
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & stat.S_IROTH:
        return f"it is not readable by others (mode {mode:04o})"
    return None


def set_plugstack(plugins: Sequence, directory=None, required: bool = False) -> Path:
    """Write the sandbox's ``etc/plugstack.conf`` listing ``plugins`` ([] empties it). Each is a path, or a
    ``(path, [arguments])`` pair (the real pyxis takes ``runtime_path=...``, ``container_scope=...``); entries are
    ``optional`` unless ``required``.

    Why no restart: Slurm reads plugstack.conf beside $SLURM_CONF in every client (srun/sbatch option parsing) and
    in slurmstepd at each step, so the change applies to the next command. ``sandbox.down`` removes it with etc/.

    Every user's srun loads these plugins (students rehearsing a handout as their own users, too): a plugin that
    only its owner can read would put "Permission denied" into every other user's job log (optional) or stop their
    jobs (required), so it is refused here, in one line, rather than found in someone's log.
    """
    root = _directory(directory)
    lines = []
    for entry in plugins:
        path, args = (entry, []) if isinstance(entry, (str, os.PathLike)) else entry
        words = [str(Path(path).absolute()), *map(str, args)]
        bad = [w for w in words if not w or any(c.isspace() for c in w) or "#" in w]
        if bad:
            raise ShipyardError(f"plugstack.conf: {bad[0]!r} cannot be written (no spaces or # in a plugin's "
                                "path or arguments)")
        why = unreadable_by_others(Path(path))
        if why:
            raise ShipyardError(f"plugstack.conf: SPANK plugin {words[0]}: {why}, but every user's srun loads it "
                                "(another user's job would log 'Permission denied'); put it where all users can "
                                "read it")
        lines.append(" ".join(["required" if required else "optional", *words]) + "\n")
    return atomic_write(root / "etc" / "plugstack.conf", "".join(lines))


def plugstack(directory=None) -> str:
    """The sandbox's plugstack.conf as it is now ("" when absent): to restore it after a test."""
    try:
        return (_directory(directory) / "etc" / "plugstack.conf").read_text()
    except FileNotFoundError:
        return ""


def restore_plugstack(text: str, directory=None) -> None:
    atomic_write(_directory(directory) / "etc" / "plugstack.conf", text)


# ------------------------------------------------------------------------------------------------ real runtimes


def default_sources(project_root) -> Path | None:
    """shipyard/data/sandbox.yaml's ``runtimes.sources`` relative to the project, when that folder exists."""
    p = (Path(project_root) / real_runtimes.runtime_facts()["sources"]).resolve()
    return p if p.is_dir() else None


def install_runtimes(sources, directory=None, install: bool = True, use_pyxis: bool = True) -> dict:
    """Build (cached) and install real enroot + pyxis for the running sandbox in ``directory``; list the real pyxis
    in its plugstack.conf (unless ``use_pyxis`` is False: the pyxis double stays where a test put it).

    Returns ``{"build", "built_now", "seconds", "slurm", "enroot", "pyxis", "plugstack"}``."""
    t0 = time.monotonic()
    root = _directory(directory)
    state = read_sandbox_state(root)
    if not sandbox_running(state):
        raise ShipyardError(f"sandbox.runtimes: the sandbox in {root} is down; run invoke sandbox.up first")
    src = real_runtimes.find_sources(sources)
    real_runtimes.ensure_build_tools(install)
    slurm_v = real_runtimes.slurm_version()
    build_dir, built = real_runtimes.build(src, slurm_v)
    nodes = [n["name"] for n in state["info"]["nodes"]]
    with record.locked(root):
        real_runtimes.install(build_dir, root, nodes,
                              running=lambda d: sandbox_running(read_sandbox_state(d)))
    archive = real_apptainer.archive_path(sources)
    real_apptainer.install(archive, real_apptainer.sandbox_holder(root),
                           sandbox_running=lambda d: sandbox_running(read_sandbox_state(d)))
    lib, args = real_runtimes.plugstack_entry(build_dir, root)
    if use_pyxis:
        set_plugstack([(lib, args)], root, required=True)
    f = real_runtimes.runtime_facts()
    return {"build": str(build_dir), "built_now": built, "seconds": round(time.monotonic() - t0, 2),
            "slurm": slurm_v, "enroot": f["enroot"]["version"], "pyxis": f["pyxis"]["version"],
            "plugstack": [str(lib), *args], "apptainer": real_apptainer.apptainer_facts()["version"],
            "apptainer_bin": str(real_apptainer.bin_dir())}


__all__ = ["up", "down", "status", "is_up", "default_directory", "client_argv", "client_env", "run_client",
           "make_plan", "render_configs", "render_env_sh", "cannot_run_reason", "missing_packages",
           "Plan", "Host", "CLIENTS", "DIR_ENV"]
