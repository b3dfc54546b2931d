"""`invoke remote.login`, `remote.sync`, `remote.logout`, and the forwarding of cluster commands from a workstation.

A cluster with ``login`` and ``remote`` (docs/remote.md) is used from a workstation through ONE shared ssh
connection that `remote.login` opens interactively (the only command that may prompt: key passphrase, one-time
code). `launch`, `logs`, `status`, `doctor`, `shell`, `stage` and `build --slurm` for such a cluster are forwarded:
the same command line runs on the login node, in the synced checkout, with ``SHIPYARD_ON_CLUSTER=NAME`` so that
shipyard there uses Slurm directly. Launchers are therefore rendered and checked where the stage record, the images
and the logs are.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Sequence

from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_join
from shipyard.remote import sync as sync_stage
from shipyard.remote import transport

# invoke's own flags that take a value and mean something only on this machine (where tasks.py is)
_LOCAL_FLAGS = {"-r", "--search-root", "-c", "--collection", "-f", "--config"}


def _remote_cluster(ctx: Context, name: str | None):
    cl = ctx.cluster(name)
    if cl.remote is None or not cl.login:
        raise ShipyardError(f"clusters.{cl.name}: needs both login and remote (root, prelude) to be used from "
                            "here; see docs/remote.md")
    return cl


def login(ctx: Context, cluster: str | None = None) -> int:
    """`invoke remote.login CLUSTER`: open the shared connection (may prompt once), kept for ControlPersist."""
    cl = _remote_cluster(ctx, cluster)
    dest = transport.resolve(cl)
    transport.ensure_control_dir(dest)
    if transport.master_alive(dest):
        ctx.say(f"shared connection to {cl.login} already open (ControlPath {dest.control_path})")
        return 0
    p = transport.policy()["ssh"]
    try:
        res = subprocess.run(transport.login_argv(dest), timeout=p["login_timeout_s"])
    except subprocess.TimeoutExpired:
        raise ShipyardError(f"ssh {cl.login}: login not done within {p['login_timeout_s']} s", exit_code=1) from None
    if res.returncode != 0 or not transport.master_alive(dest):
        raise ShipyardError(f"ssh {cl.login}: login failed (exit {res.returncode}); ssh printed why above",
                            exit_code=1)
    via = f" via {dest.proxy_jump}" if dest.proxy_jump else ""
    ctx.say(f"shared connection to {cl.login}{via} open for {p['control_persist']} "
            f"(ControlPath {dest.control_path}); commands for cluster {cl.name} now run through it")
    return 0


def logout(ctx: Context, cluster: str | None = None) -> int:
    """`invoke remote.logout CLUSTER`: close the shared connection (``ssh -O exit``)."""
    cl = _remote_cluster(ctx, cluster)
    dest = transport.resolve(cl)
    if not transport.master_alive(dest):
        ctx.say(f"no shared connection to {cl.login} open")
        return 0
    subprocess.run(transport.exit_argv(dest), stdin=subprocess.DEVNULL, capture_output=True,
                   timeout=transport.policy()["ssh"]["check_timeout_s"])
    ctx.say(f"closed the shared connection to {cl.login}")
    return 0


def sync(ctx: Context, cluster: str | None = None) -> int:
    """`invoke remote.sync CLUSTER`: ship the project; say what changed (or that nothing did)."""
    cl = _remote_cluster(ctx, cluster)
    s = sync_stage.sync(cl, ctx.root)
    code = f"{s.commit[:12]}{' (dirty: uncommitted changes shipped)' if s.dirty else ''}"
    if s.changed:
        ctx.say(f"synced {s.files} files to {cl.login}:{s.destination} with {s.method} ({s.changed} changed); "
                f"code {code}")
    else:
        ctx.say(f"nothing to transfer: {cl.login}:{s.destination} already has these {s.files} files; code {code}")
    return 0


def task_words(argv: Sequence[str]) -> list[str]:
    """``sys.argv`` of this invoke run without the program and invoke's own flags before the task name (``-r ROOT``
    ...: they name this machine's tasks.py): the task and its flags, exactly as the shell passed them."""
    words, i = list(argv[1:]), 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in _LOCAL_FLAGS else 1
    return words[i:]


def forward(ctx: Context, cl, argv: Sequence[str] | None = None, *, tty: bool = False) -> int:
    """Run this command line on ``cl``'s login node, in the synced checkout; its exit code. Output streams here."""
    p = transport.policy()
    dest = transport.require_master(cl)
    target = transport.project_dir(cl, ctx.root.name)
    words = task_words(sys.argv if argv is None else argv)
    invoke = cl.remote.invoke or p["invoke"]
    script = transport.remote_script(
        cl, (), cwd=target, raw=f"{invoke} {shell_join(words)}",
        env={p["on_cluster_env"]: cl.name, "SHIPYARD_REGISTRY": f"{target}/{ctx.registry.path.name}"})
    ctx.out.flush()
    res = subprocess.run(transport.ssh_argv(dest, script, tty=tty), stdin=None if tty else subprocess.DEVNULL)
    if res.returncode == 255 and not transport.master_alive(dest):  # ssh's own failure: the master went away
        raise ShipyardError(f"cluster {cl.name}: the shared ssh connection to {cl.login} closed during the command "
                            f"(open it again with: {transport.login_hint(cl)})")
    return res.returncode
