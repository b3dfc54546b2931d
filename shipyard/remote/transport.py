"""The ssh transport: argv that run a command on a cluster's login node through the shared master connection.

* **Destination.** ``clusters.NAME.login`` is resolved by the user's own ssh configuration (``ssh -G``: HostName,
  User, Port, ProxyJump, IdentityFile all come from there); ``$SHIPYARD_SSH_CONFIG`` names another config file
  (``ssh -F``). Nothing here reads or writes a key, a password or a code.
* **ControlPath.** The user's when their config sets one, else ``<cache dir>/shipyard/ssh/%C``
  (shipyard/data/remote.yaml).
* **Never a prompt.** Every command but `remote.login` runs with ``BatchMode=yes`` and ``ControlMaster=no`` and
  stdin closed, after ``ssh -O check`` (local, bounded) found the master: without one it is one line naming
  ``invoke remote.login CLUSTER``, exit 2, in well under 5 s.
* **Quoting.** ssh joins its remote words with spaces and the login shell parses them again, so the remote command
  is built as ONE string here, each word quoted once with :func:`shipyard.escaping.shell_join`, and passed as one
  argument after ``--``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Sequence

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_join, shell_quote


def policy() -> dict:
    """shipyard/data/remote.yaml."""
    return facts.load("remote")


def on_cluster(cluster) -> bool:
    """This process already runs on ``cluster``'s login node (a forwarded command): Slurm runs as there."""
    return os.environ.get(policy()["on_cluster_env"]) == getattr(cluster, "name", cluster)


def is_remote(cluster) -> bool:
    """``cluster`` is reached over ssh from here: it has ``login`` and ``remote``, and this is not its login node."""
    return getattr(cluster, "remote", None) is not None and bool(getattr(cluster, "login", None)) \
        and not on_cluster(cluster)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / policy()["ssh"]["control_dir"]


def config_args() -> list[str]:
    """``-F FILE`` when ``$SHIPYARD_SSH_CONFIG`` names one (tests, a second config), else nothing."""
    path = os.environ.get(policy()["ssh_config_env"])
    return ["-F", path] if path else []


@dataclass(frozen=True)
class Destination:
    """A cluster's login node as the user's ssh config resolves it."""

    cluster: str
    login: str  # as written in the registry: an alias or [user@]host
    control_path: str  # the user's ControlPath, or ours (with ssh's %-tokens, expanded by ssh itself)
    own_control_path: bool  # ours (shipyard made its directory), not the user's
    proxy_jump: str | None
    hostname: str
    user: str | None

    def options(self) -> list[str]:
        """The options every ssh to this destination gets: the config file and the ControlPath."""
        return config_args() + ["-o", f"ControlPath={self.control_path}"]


def resolve(cluster) -> Destination:
    """``ssh -G LOGIN``: the user's configuration for the cluster's login node (no network)."""
    login = cluster.login
    if login.startswith("-"):
        raise ShipyardError(f"clusters.{cluster.name}.login: {login!r} starts with '-' (expected [user@]host or an "
                            "~/.ssh/config alias)")
    p = policy()["ssh"]
    try:
        res = subprocess.run(["ssh", *config_args(), "-G", "--", login], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=p["resolve_timeout_s"])
    except FileNotFoundError:
        raise ShipyardError("ssh is not on PATH: install the OpenSSH client to reach cluster "
                            f"{cluster.name} from here") from None
    except subprocess.TimeoutExpired:
        raise ShipyardError(f"ssh -G {login}: no answer within {p['resolve_timeout_s']} s") from None
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise ShipyardError(f"clusters.{cluster.name}.login {login!r}: ssh -G refused it: {last}")
    conf: dict[str, str] = {}
    for line in res.stdout.splitlines():
        key, _, value = line.partition(" ")
        conf.setdefault(key.lower(), value)
    theirs = conf.get("controlpath", "none")
    own = theirs in ("", "none")
    path = str(cache_dir() / p["control_name"]) if own else theirs
    jump = conf.get("proxyjump")
    return Destination(cluster.name, login, path, own, None if jump in (None, "none") else jump,
                       conf.get("hostname", login), conf.get("user"))


def login_hint(cluster) -> str:
    name = getattr(cluster, "name", cluster)
    return f"invoke remote.login {name}"


def check_argv(dest: Destination) -> list[str]:
    return ["ssh", *dest.options(), "-O", "check", "--", dest.login]


def master_alive(dest: Destination) -> bool:
    """``ssh -O check``: a master answers on the ControlPath (local socket; bounded by ``check_timeout_s``)."""
    try:
        res = subprocess.run(check_argv(dest), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             timeout=policy()["ssh"]["check_timeout_s"])
    except subprocess.TimeoutExpired:
        return False
    return res.returncode == 0


def require_master(cluster) -> Destination:
    """The destination, after ``ssh -O check`` found the shared connection; else one line, exit 2."""
    dest = resolve(cluster)
    if not master_alive(dest):
        raise ShipyardError(f"cluster {cluster.name}: no shared ssh connection to {cluster.login} "
                            f"(open it once with: {login_hint(cluster)})")
    return dest


def project_dir(cluster, project: str) -> str:
    """``<remote.root>/<project>`` on the cluster."""
    if not project or "/" in project or project in (".", ".."):
        raise ShipyardError(f"project directory name {project!r}: expected one plain directory name")
    return str(PurePosixPath(cluster.remote.root) / project)


def remote_script(cluster, argv: Sequence[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                  raw: str | None = None) -> str:
    """The one string the login shell runs: the prelude (as the registry's owner wrote it; it must succeed), then
    ``cd CWD`` and the command with each word quoted once (or ``raw``: an already-quoted command line)."""
    lines = ["set -e"]
    if cluster.remote.prelude.strip():
        lines.append(cluster.remote.prelude.rstrip("\n"))
    if cwd:
        lines.append(f"cd -- {shell_quote(cwd)}")
    lines.append("set +e")
    if env:
        lines.append("export " + " ".join(f"{k}={shell_quote(v)}" for k, v in env.items()))
    lines.append(raw if raw is not None else shell_join([str(a) for a in argv]))
    return "\n".join(lines)


def ssh_argv(dest: Destination, script: str, *, tty: bool = False) -> list[str]:
    """``ssh`` through the master, never prompting: the remote script as one argument."""
    opts: list[str] = []
    for o in policy()["ssh"]["batch_options"]:
        opts += ["-o", o]
    return ["ssh", *dest.options(), *opts, "-tt" if tty else "-T", "--", dest.login, script]


def command_argv(cluster, argv: Sequence[str], **kwargs) -> list[str]:
    """``argv`` run on ``cluster``'s login node through the master (checked first; see :func:`require_master`)."""
    return ssh_argv(require_master(cluster), remote_script(cluster, argv, **kwargs))


def login_argv(dest: Destination) -> list[str]:
    """`remote.login`: open the master in the background (``-f -N``), interactively, kept for ControlPersist."""
    p = policy()["ssh"]
    opts: list[str] = []
    for o in p["login_options"]:
        opts += ["-o", o]
    return ["ssh", *dest.options(), *opts, "-o", f"ControlPersist={p['control_persist']}", "-f", "-N", "--",
            dest.login]


def exit_argv(dest: Destination) -> list[str]:
    return ["ssh", *dest.options(), "-O", "exit", "--", dest.login]


def ensure_control_dir(dest: Destination) -> None:
    """Our ControlPath's directory, private (0700); the user's own ControlPath is theirs to manage."""
    if dest.own_control_path:
        d = Path(dest.control_path).parent
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        if d.is_symlink():
            raise ShipyardError(f"{d}: is a symlink; remove it (shipyard keeps its ssh sockets in a real directory)")
        os.chmod(d, 0o700)
