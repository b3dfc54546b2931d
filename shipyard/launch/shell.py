"""`invoke shell [ENV]`: an interactive ``srun --pty`` on the cluster's interactive partition, inside the container.

The command is built as an argv list (pure function of the registry model and the flags) and only turned into a
shell line for printing, with every word quoted by :func:`shipyard.escaping.shell_quote`, the same quoting the
launchers use. The container part is asked of the runtime object (:mod:`shipyard.runtimes`), as the launchers
ask it, with the same image and mounts: ``apptainer shell --nv`` with the cluster's binds and no ``--contain``; pyxis
flags on srun with ``--pty bash`` (the home directory stays mounted: it is the user's shell); a plain shell for the
host runtime.

VS Code Remote-SSH needs the *allocated* node's name, which exists only once srun has started. So the interactive
shell first prints the ssh config snippet on the node itself (the node's own ``hostname`` is substituted there), then
``exec``s the shell. Before srun, on the login node, the image check of the staged image runs (the batch launcher's
check as a script of its own, :mod:`shipyard.launch.image_check`): a replaced image is refused there, in one line,
before any node is asked for. ``--command`` runs a command in the same container without a terminal (no snippet), which is also
how the tests prove on the sandbox that the command really lands on a compute node.
"""

from __future__ import annotations

import getpass
import shlex
import subprocess
from dataclasses import dataclass
from typing import Sequence

from shipyard import slurm
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_join, shell_quote
from shipyard.launch import fabric, options
from shipyard import runtimes
from shipyard.runtimes.mounts import job_mounts
from shipyard.runtimes import Placement
from shipyard.launch import passthrough
from shipyard.registry.model import Cluster, Environment, Registry
from shipyard.staging import versions

JOB_NAME = "shipyard-shell"  # `invoke status` lists jobs named shipyard-*
NODE_MARK = "@NODE@"  # replaced by the allocated node's hostname, on the node
# Runs on the node (inside the container for pyxis): print the snippet with this node's name, then become the shell.
_PRELUDE = 'printf "%s\\n" "${1//' + NODE_MARK + '/$(hostname)}"; shift; exec "$@"'


@dataclass(frozen=True)
class ShellPlan:
    """What `invoke shell` runs: ``module load`` lines (login node, before srun) and the srun argv."""

    cluster: str
    modules: tuple[str, ...]
    argv: tuple[str, ...]
    snippet: str  # with NODE_MARK where the node's name goes
    interactive: bool
    check: tuple[str, ...] = ()  # the image check run on the login node before srun (none: no image)
    local_sandbox: bool = False  # the cluster is this machine's sandbox: srun takes the sandbox's route


def ssh_snippet(cluster: Cluster, user: str) -> str:
    """An ~/.ssh/config block that lets VS Code Remote-SSH attach to the node (ProxyJump via the login node).

    ssh into a compute node works only while you hold a job there on clusters with pam_slurm_adopt (the usual
    setup), which is exactly while this shell runs.
    """
    login = cluster.login or f"<login node of {cluster.name}: set clusters.{cluster.name}.login in registry.yaml>"
    return "\n".join([
        f"# ~/.ssh/config for VS Code Remote-SSH: connect to host shipyard-{cluster.name}-node while this shell runs",
        f"Host shipyard-{cluster.name}-node",
        f"    HostName {NODE_MARK}",
        f"    ProxyJump {login}",
        f"    User {user}",
    ])


def _default_time(cluster: Cluster) -> str:
    """The shell's time limit without --time: launch.yaml's ``shell_time``, or the cluster's ``scheduler.time`` or
    the partition's ``max_time`` when shorter. Never none: a forgotten shell must not hold a GPU node for long."""
    candidates = [options.defaults()["shell_time"], cluster.time, cluster.partition_info().max_time]
    return min((c for c in candidates if c), key=options.seconds)


def build(reg: Registry, env: Environment, cluster: Cluster, *, command: str | None = None,
          gpus: int | str | None = None, time: str | None = None, user: str | None = None,
          runtime: str | None = None, partition: str | None = None,
          sbatch: Sequence[str] | None = None, check: str | None = None) -> ShellPlan:
    """Resolve flags and registry facts into the exact command for ``env`` on ``cluster`` (no side effects). The
    shell runs on ``partition`` (default: the interactive partition), and its GPUs are checked against that
    partition's. ``check``: the image check script (:mod:`shipyard.launch.image_check`) that runs before srun."""

    partition = partition or cluster.interactive_partition
    if partition not in cluster.partitions:
        raise ShipyardError(f"--partition {partition!r}: not a partition of cluster {cluster.name} "
                            f"(valid: {', '.join(cluster.partitions)})")
    cluster = cluster.on(partition)
    rt = runtimes.get(runtime or cluster.runtime)
    if gpus is None:
        gpus = 1 if cluster.gpus_per_node > 0 else 0
    try:
        gpus = int(gpus)
    except (TypeError, ValueError):
        raise ShipyardError(f"--gpus {gpus!r}: expected an integer from 0 to {cluster.gpus_per_node}") from None
    if not 0 <= gpus <= cluster.gpus_per_node:
        raise ShipyardError(f"--gpus {gpus}: partition {partition} of cluster {cluster.name} has "
                            f"{cluster.gpus_per_node} GPUs per node ({cluster.key('gpus_per_node')}); "
                            f"use 0 to {cluster.gpus_per_node}")
    # --command is a shell string, run by bash on the node (in the container): `hostname; nproc`, pipes, $VARS
    if command is not None and not command.strip():
        raise ShipyardError("--command '': give the command to run on the node, e.g. --command 'nvidia-smi -L'")
    if command is not None:
        try:
            shlex.split(command)  # an unterminated quote is refused here, not by bash on a node after the queue
        except ValueError as exc:
            raise ShipyardError(f"--command {command!r}: {exc} (give a shell command line, e.g. --command "
                                "'hostname; nproc')") from None
    words = ["bash", "-c", _with_injected_paths(cluster, env, command)] if command is not None else None
    time = time or _default_time(cluster)
    srun = ["srun", f"--partition={partition}"]
    if cluster.account:
        srun.append(f"--account={cluster.account}")
    srun += ["--nodes=1", "--ntasks=1", f"--job-name={JOB_NAME}"]
    if gpus:
        srun.append(f"--gpus-per-node={gpus}")
    if time:
        srun.append(f"--time={time}")
    srun += passthrough.words(passthrough.parse(sbatch))  # --sbatch KEY=VALUE: srun takes them too
    if words is None:
        srun.append("--pty")
    mounts = job_mounts(reg.root, cluster)
    place = Placement(versions.resolve(rt.image(reg.root, env.name, cluster)), mounts, str(reg.root), home=True)
    srun += rt.srun_words(place)
    snippet = ssh_snippet(cluster, user or getpass.getuser())
    if words is None:
        node = ["bash", "-c", _PRELUDE, "shipyard-shell", snippet] + rt.shell_words(place)
    else:
        node = rt.exec_words(place) + words
    modules = rt.modules(cluster)
    return ShellPlan(cluster.name, tuple(modules), tuple(srun + node), snippet, words is None,
                     check=("bash", str(check)) if check else (), local_sandbox=cluster.local_sandbox)


def _with_injected_paths(cluster: Cluster, env: Environment, command: str) -> str:
    """``command`` after the host injection's path lists go in front of the image's own values, as in a launcher
    (launch/fabric.py: never exported from the host, where the runtime would let them replace the image's)."""
    return "; ".join([*fabric.prepend_exports(fabric.fabric_env(cluster, env)), command])


def command_line(plan: ShellPlan) -> str:
    """The one shell line a user could paste on the login node (module loads first, then srun)."""

    loads = [f"module load {shell_quote(m)}" for m in plan.modules]
    return " && ".join(([shell_join(plan.check)] if plan.check else []) + loads + [shell_join(plan.argv)])


def run_argv(plan: ShellPlan) -> tuple[list[str], dict[str, str] | None]:
    """argv and environment to execute: module loads need a login shell (Lmod defines `module` there); the sandbox
    needs its namespace wrapper. No timeout on the sandbox: an interactive shell lasts as long as the user wants."""
    if plan.modules:
        return ["bash", "-lc", command_line(plan)], None
    return slurm.route(slurm.Target(plan.cluster, plan.local_sandbox), plan.argv, timeout=0)


def run(plan: ShellPlan) -> int:
    """Run the command (a terminal's shell, or ``--command``) and return srun's exit code."""
    if plan.check and not plan.modules:  # with modules, the login shell's line runs the check first
        rc = subprocess.run(list(plan.check)).returncode
        if rc:
            return rc
    argv, env = run_argv(plan)
    try:
        return subprocess.run(argv, env=env).returncode
    except FileNotFoundError:
        raise ShipyardError(f"{argv[0]} is not on PATH: run `invoke shell` on a login node of cluster "
                            f"{plan.cluster} (or use --dry-run to see the command)") from None
