"""Start sequence of the local Slurm sandbox: files, munged, namespaces and their network, slurmctld, slurmds.

Split from :mod:`shipyard.sandbox` (the public API) because this is the part that changes the machine: every step
records what it started in ``state.json`` before the next step runs, so a failure at any point leaves a record from
which :func:`shipyard.sandbox.down` (or the failure handler here) stops exactly what was started.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import re
import stat
import subprocess
import time
from pathlib import Path
from typing import Sequence

from shipyard import procs
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write
from shipyard.sandbox.plan import Plan, facts, host_overlap, render_configs, render_env_sh, shifted
from shipyard.sandbox.state import stop, write_state
from shipyard.slurm import DIR_ENV, namespace_argv, python_bin

_SOCKET_MAX = 107  # sun_path holds 108 bytes including the terminating NUL


NETWORK_LOCK = Path("/run/lock/shipyard-sandbox-network.lock")  # machine-wide: sandboxes choose networks in turn
_NETWORKS = 64  # how many /24s after the data's network a sandbox may take


def _free_network(plan: Plan) -> Plan:
    """The plan on the first /24 (from the data's) that the host has no address, route or link in: each sandbox
    running on this machine (several test processes start their own) then gets the host's leg of its own."""
    def ip(*args: str) -> list[str]:
        return subprocess.run(["ip", "-o", "-4", *args], capture_output=True, text=True).stdout.splitlines()

    addresses, routes = ip("addr", "show"), ip("route", "show")
    for n in range(_NETWORKS):
        candidate = shifted(plan, n)
        if host_overlap(candidate, addresses, routes) is None and subprocess.run(
                ["ip", "link", "show", candidate.host_link], capture_output=True).returncode != 0:
            return candidate
    return plan  # all taken: the data's network, and the host's leg is skipped with its reason


def start(plan: Plan) -> dict:
    """Bring up the planned sandbox; return its info dict. On any failure, stop what was started and re-raise.
    The network is chosen, and the host's leg attached, under one machine-wide lock."""
    NETWORK_LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(NETWORK_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _start(_free_network(plan), fd)
    finally:
        os.close(fd)


def _start(plan: Plan, lock_fd: int) -> dict:
    t0 = time.monotonic()
    root = plan.root
    info = {
        "directory": str(root),
        "controller": {"name": plan.controller.name, "ip": plan.controller.ip},
        "nodes": [{"name": n.name, "hostname": n.name, "ip": n.ip} for n in plan.nodes],
        "partition": plan.partition,
        "gpus_per_node": plan.gpus_per_node,
        "env_file": str(plan.env_sh),
        "conf": str(plan.conf),
        "logs": str(plan.log_dir),
    }
    state = {"version": 1, "status": "starting", "started": time.time(), "info": info, "processes": []}
    _prepare_files(plan)
    write_state(root, state)
    try:
        _start_munged(plan, state)
        holders = {h.name: _start_holder(plan, state, h.name) for h in (plan.controller, *plan.nodes)}
        _network(plan, holders)
        info["host_access"] = _attach_host(plan, holders[plan.controller.name], state)
        fcntl.flock(lock_fd, fcntl.LOCK_UN)  # the network is claimed: the next sandbox sees it taken
        for host, port in ((plan.controller, plan.slurmctld_port), *((n, plan.slurmd_port) for n in plan.nodes)):
            check_port_free(holders[host.name], host.ip, port, host.name)
        _spawn(plan, state, "slurmctld", _in_ns(holders[plan.controller.name], "slurmctld", "-D", "-i", "-f",
                                                str(plan.conf)))
        for n in plan.nodes:
            _spawn(plan, state, f"slurmd-{n.name}", _in_ns(holders[n.name], "slurmd", "-D", "-N", n.name, "-f",
                                                           str(plan.conf)))
        _wait_idle(plan, state, holders[plan.controller.name])
    except BaseException:
        stop(state, root)
        raise
    info["seconds"] = round(time.monotonic() - t0, 3)
    state["status"] = "up"
    write_state(root, state)
    atomic_write(plan.env_sh, render_env_sh(plan, f"/proc/{holders[plan.controller.name]}/ns/net",
                                               python_bin(), host_access=info["host_access"] is True))
    return dict(info, already_running=False)


# ------------------------------------------------------------------------------------------------ steps


def _prepare_files(plan: Plan) -> None:
    root = plan.root
    if len(str(plan.munge_socket)) > _SOCKET_MAX:
        raise ShipyardError(f"sandbox directory {root}: path too long for munge's socket (at most "
                            f"{_SOCKET_MAX - len('/run/munge/munge.socket')} characters); set ${DIR_ENV} "
                            "to a shorter path")
    for parent in root.parents:  # munged runs as user munge and must reach its socket directory
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            raise ShipyardError(f"sandbox directory {root}: {parent} is not searchable by others (mode "
                                f"{stat.S_IMODE(parent.stat().st_mode):04o}), so munged (user munge) cannot reach "
                                f"its socket; chmod o+x {parent} or set ${DIR_ENV} elsewhere")
    for sub in ("etc", "log", "run", "state/slurmctld", "dev", "jobs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    if plan.node_local.is_symlink():
        raise ShipyardError(f"sandbox.up: {plan.node_local} is a symlink; not following it")
    plan.node_local.mkdir(mode=0o755, parents=True, exist_ok=True)
    for n in plan.nodes:
        plan.node_dir(n.name).mkdir(parents=True, exist_ok=True)
    for name, text in render_configs(plan).items():
        atomic_write(root / "etc" / name, text)
    munge = munge_user()
    plan.munge_dir.mkdir(mode=0o755, exist_ok=True)
    os.chown(plan.munge_dir, munge.pw_uid, munge.pw_gid)
    os.chmod(plan.munge_dir, 0o755)  # munged requires o+x on its socket directory
    for p in plan.munge_dir.iterdir():  # a stale socket or pid file of a crashed run
        p.unlink()
    mlog = plan.log("munged")
    mlog.touch(mode=0o640)
    os.chown(mlog, munge.pw_uid, munge.pw_gid)
    for i in range(plan.gpus_per_node):  # fake GPUs: NVIDIA character devices, no driver behind them
        dev = root / "dev" / f"nvidia{i}"
        if dev.exists() or dev.is_symlink():
            dev.unlink()
        os.mknod(dev, 0o660 | stat.S_IFCHR, os.makedev(int(facts()["gpu_device_major"]), i))


def _spawn(plan: Plan, state: dict, role: str, argv: Sequence[str], **kwargs) -> int:
    """Start a long-running process detached from our session, log to log/<role>.log, record PID + start time."""
    log = plan.log(role)
    env = dict(os.environ, SLURM_CONF=str(plan.conf))
    with open(log, "ab") as fh:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, **kwargs)
    st = procs.proc_stat(proc.pid)
    state["processes"].append({"role": role, "pid": proc.pid, "start": st[1] if st else 0, "log": str(log)})
    write_state(plan.root, state)
    return proc.pid


def _start_munged(plan: Plan, state: dict) -> None:
    """munged on the host (its socket is a file under the sandbox directory, reachable from every namespace)."""
    key = facts()["munge_key"]
    if not os.path.exists(key):
        raise ShipyardError(f"sandbox.up: munge key {key} is missing (create it with: mungekey --create "
                            f"--keyfile={key} && chown munge:munge {key})")
    munge = munge_user()
    d = plan.munge_dir
    _spawn(plan, state, "munged",
           ["munged", "-F", f"--socket={plan.munge_socket}", f"--key-file={key}",
            f"--log-file={plan.log('munged')}", f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}"],
           user=munge.pw_uid, group=munge.pw_gid, extra_groups=[])
    _wait(lambda: plan.munge_socket.exists(), facts()["timeouts"]["holder_s"], state, "munged", plan)


def _start_holder(plan: Plan, state: dict, name: str) -> int:
    """A ``sleep`` that owns a new network, UTS and mount namespace with hostname ``name`` and our /etc/hosts and
    /etc/resolv.conf.

    The bind mounts exist only inside the new mount namespace (propagation private), so the host never sees them.
    """
    # A node also gets its own folder at one shared path: nodes/<name> bound onto node_local (enroot's and pyxis's
    # per-node paths, see shipyard/sandbox/runtimes.py), and the sandbox's etc/ onto /etc/slurm, Slurm's compiled-in
    # configuration directory: like a real compute node, a job's own srun finds slurm.conf there even without
    # $SLURM_CONF (Snakemake's jobstep plugin drops every SLURM_* variable but a few before its srun).
    script = ('hostname "$1" && mount --bind "$2" /etc/hosts && { [ ! -e /etc/resolv.conf ] || '
              'mount --bind "$3" /etc/resolv.conf; } && { [ -z "$4" ] || mount --bind "$4" "$5"; } && '
              '{ [ -z "$6" ] || [ ! -d /etc/slurm ] || mount --bind "$6" /etc/slurm; } && exec sleep infinity')
    own = ([str(plan.node_dir(name)), str(plan.node_local), str(plan.conf.parent)]
           if name != plan.controller.name else ["", "", ""])
    pid = _spawn(plan, state, f"ns:{name}",
                 ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "--",
                  "sh", "-c", script, "holder", name, str(plan.hosts), str(plan.resolv), *own])
    _wait(lambda: _comm(pid) == "sleep", facts()["timeouts"]["holder_s"], state, f"ns:{name}", plan)
    return pid


def _network(plan: Plan, holders: dict[str, int]) -> None:
    """A bridge in the controller's namespace and one veth pair per node, created directly in the namespaces."""
    ctl = plan.controller
    cmds = ["link set lo up", f"link add {plan.bridge} type bridge",
            f"addr add {ctl.ip}/{plan.prefix_len} dev {plan.bridge}", f"link set {plan.bridge} up"]
    for i, n in enumerate(plan.nodes, 1):
        cmds += [f"link add v{i} type veth peer name eth0 netns {holders[n.name]}",
                 f"link set v{i} master {plan.bridge}", f"link set v{i} up"]
    _ip_batch(holders[ctl.name], cmds, ctl.name)
    for n in plan.nodes:
        _ip_batch(holders[n.name], ["link set lo up", f"addr add {n.ip}/{plan.prefix_len} dev eth0",
                                    "link set eth0 up"], n.name)


def _attach_host(plan: Plan, ctl_pid: int, state: dict) -> bool | str:
    """Put the host on the sandbox's bridge (a veth pair: ``plan.host_link`` with ``plan.host_ip`` here, its peer
    on the bridge), so every user's Slurm clients reach the controller and nodes with SLURM_CONF alone and the nodes
    reach an srun on the host. True when attached; else why not (one line), and clients keep root's nsenter route.

    The pair lives and dies with the controller's namespace: when the sandbox stops, the kernel removes both ends."""
    def ip(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", *args], capture_output=True, text=True)

    taken = host_overlap(plan, ip("-o", "-4", "addr", "show").stdout.splitlines(),
                         ip("-o", "-4", "route", "show").stdout.splitlines())
    if taken:
        return f"the host already has {taken} in the sandbox's network"
    if ip("link", "show", plan.host_link).returncode == 0:
        return f"the host already has a link named {plan.host_link}"
    made = ip("link", "add", plan.host_link, "type", "veth", "peer", "name", "host0", "netns", str(ctl_pid))
    if made.returncode != 0:
        return f"ip link add {plan.host_link} failed: {made.stderr.strip() or made.returncode}"
    state["info"]["host_link"] = plan.host_link
    write_state(plan.root, state)
    _ip_batch(ctl_pid, ["link set host0 master " + plan.bridge, "link set host0 up"], plan.controller.name)
    res = subprocess.run(["ip", "-batch", "-"], input=f"addr add {plan.host_ip}/{plan.prefix_len} dev "
                         f"{plan.host_link}\nlink set {plan.host_link} up\n", capture_output=True, text=True)
    if res.returncode != 0:
        raise ShipyardError(f"sandbox.up: the host's leg {plan.host_link} on the sandbox network failed: "
                            f"{res.stderr.strip() or res.returncode}")
    return True


def _ip_batch(pid: int, cmds: list[str], where: str) -> None:
    res = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "ip", "-batch", "-"],
                         input="\n".join(cmds) + "\n", capture_output=True, text=True)
    if res.returncode != 0:
        raise ShipyardError(f"sandbox.up: network setup in namespace {where} failed: "
                            f"{res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")


def check_port_free(ns_pid: int, ip: str, port: int, where: str) -> None:
    """Refuse, naming the holder of the port, when ``port`` already listens inside the namespace of ``ns_pid``."""
    res = subprocess.run(["nsenter", f"--net=/proc/{ns_pid}/ns/net", "--", "ss", "-Hltnp", f"sport = :{port}"],
                         capture_output=True, text=True)
    busy = [line for line in res.stdout.splitlines() if line.strip()]
    if busy:
        users = sorted(set(re.findall(r'\("([^"]+)",pid=(\d+)', "\n".join(busy))))
        who = ", ".join(f"{c} (pid {p})" for c, p in users) or "another process"
        raise ShipyardError(f"sandbox.up: port {port}/tcp on {ip} in namespace {where} is already in use by {who}; "
                            "stop it (or run invoke sandbox.down) and retry")


def _in_ns(pid: int, *argv: str) -> list[str]:
    """Run argv in the namespaces held by ``pid``. nsenter execs (no --pid, no fork), so the PID is the daemon's."""
    return ["nsenter", f"--target={pid}", "--net", "--uts", "--mount", "--", *argv]


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _tail(path: str | Path, n: int = 1) -> str:
    try:
        lines = [x for x in Path(path).read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:]) or "(empty log)"


def _dead_daemon_error(plan: Plan, state: dict) -> ShipyardError | None:
    for p in state["processes"]:
        if not procs.alive(p):
            last = _tail(p["log"])
            try:
                text = Path(p["log"]).read_text(errors="replace")
            except OSError:
                text = ""
            hint = " (a port it needs is in use)" if "Address already in use" in text else ""
            return ShipyardError(f"sandbox.up: {p['role']} exited{hint}; see {p['log']} (last line: {last})")
    return None


def _wait(ready, seconds: float, state: dict, role: str, plan: Plan) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        err = _dead_daemon_error(plan, state)
        if err:
            raise err
        if time.monotonic() > deadline:
            log = next(p["log"] for p in state["processes"] if p["role"] == role)
            raise ShipyardError(f"sandbox.up: {role} not ready after {seconds} s; see {log} (last line: "
                                f"{_tail(log)})")
        time.sleep(0.02)


def _sinfo(plan: Plan, ctl_pid: int) -> tuple[dict[str, str], str]:
    """Node -> state as sinfo reports it (empty when the controller does not answer), and sinfo's stderr."""
    res = subprocess.run(namespace_argv(["sinfo", "-h", "-N", "-o", "%N %t"], ctl_pid, plan.conf, 5),
                         capture_output=True, text=True)
    nodes = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            nodes[parts[0]] = parts[1]
    return nodes, res.stderr.strip()


def _wait_idle(plan: Plan, state: dict, ctl_pid: int) -> None:
    """Poll sinfo until every node is idle; on timeout name the failing daemon and its log."""
    seconds = facts()["timeouts"]["idle_s"]
    deadline = time.monotonic() + seconds
    nodes, err = {}, ""
    while time.monotonic() < deadline:
        dead = _dead_daemon_error(plan, state)
        if dead:
            raise dead
        nodes, err = _sinfo(plan, ctl_pid)
        if nodes and all(nodes.get(n.name) == "idle" for n in plan.nodes):
            return
        time.sleep(0.1)
    if not nodes:
        log = plan.log("slurmctld")
        raise ShipyardError(f"sandbox.up: slurmctld did not answer within {seconds} s ({err or 'no output'}); "
                            f"see {log} (last line: {_tail(log)})")
    bad = [n for n in plan.nodes if nodes.get(n.name) != "idle"]
    n = bad[0]
    log = plan.log(f"slurmd-{n.name}")
    raise ShipyardError(f"sandbox.up: node {n.name} is '{nodes.get(n.name, 'missing')}', not idle, after {seconds} s; "
                        f"see {log} (last line: {_tail(log)}) and {plan.log('slurmctld')}")


def munge_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("munge")
    except KeyError:
        raise ShipyardError("sandbox.up: no 'munge' user (reinstall the munge package: apt-get install --reinstall "
                            "munge)") from None
