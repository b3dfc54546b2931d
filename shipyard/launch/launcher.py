"""Slurm launchers for PyTorch training: one model (:class:`Launcher`), one template, any runtime.

``build()`` resolves the registry (default environment, cluster, its runtime, partition and GPUs) plus the user's
flags into a frozen :class:`Launcher`; ``render()`` is a pure function of that model to the text of
``launch/<name>.sbatch``. ``invoke nccl-test`` renders from the same model with ``kind="nccl-test"``, so the
runtime, mounts, NCCL environment and header are the same code path for both.

What differs per container runtime (image location, srun and exec words, how variables reach the container, site
modules) is asked of the runtime objects in :mod:`shipyard.launch.runtimes`; the flags, their checks and the
"regenerate with" line come from the options model in :mod:`shipyard.launch.options`.

Why Jinja2 templates under shipyard/launch/templates/: the scripts are mostly shell, and reading them as shell (with
the few substitutions marked) is how reviewers check them against launcher-rules.md. Every value a user typed goes
through :func:`shell_quote` before it reaches the template.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from shipyard import __version__, project, registry, slurm, templating
from shipyard.cli import argv_after_dashdash
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_join
from shipyard.files import atomic_write
from shipyard.launch import options, runtimes
from shipyard.launch.fabric import (
    EnvVar,
    check_forbidden,
    expected_transport,
    fabric_env,
    launch_data,
)
from shipyard.launch.mounts import Mount, job_mounts, parse_mounts
from shipyard.launch.runtimes import Placement, Runtime
from shipyard.registry.model import Cluster, Registry

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ------------------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Launcher:
    """Everything a launcher script says. Built by :func:`build`; rendered by :func:`render`."""

    name: str
    kind: str  # "torchrun" | "nccl-test"
    environment: str
    cluster: str
    runtime: str  # a name in runtimes.NAMES: pyxis | apptainer | host
    fabric: str  # efa | ib | socket
    nodes: int
    gpus_per_node: int
    partition: str
    root: str  # project directory (absolute): workdir, and where launch/ lives
    registry: str = "registry.yaml"  # the registry file the launcher was generated from
    command: tuple[str, ...] = ()  # training script and its arguments, exactly as given
    account: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    image: str | None = None
    modules: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: tuple[EnvVar, ...] = ()
    requeue: bool = False
    max_restarts: int = 0
    signal: str = "USR2"
    signal_before: int | None = None
    monitor: bool = False
    monitor_interval: int = 5
    nccl_debug: bool = False
    rdzv_port: int = 29500
    srun_wait: int = 60
    chain: int = 1
    transport: str = ""
    nccl_test_binary: str = "all_reduce_perf"
    nccl_test_mpi: str = "pmix"
    nccl_test_args: tuple[str, ...] = ()
    regenerate: tuple[str, ...] = field(default=(), compare=False)

    @property
    def path(self) -> Path:
        return project.launcher_path(Path(self.root), self.name)

    @property
    def log_dir(self) -> str:
        return str(project.launch_logs_dir(Path(self.root)))

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


# ------------------------------------------------------------------------------------------------ parsing flags


def parse_env(items: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``--env K=V`` (repeatable) -> pairs, in order; a later K wins."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, val = item.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise ShipyardError(f"--env {item!r}: expected NAME=VALUE with NAME a shell variable name "
                                "(letters, digits, _; not starting with a digit)")
        out[key] = val
    return tuple(out.items())


# ------------------------------------------------------------------------------------------------ build
# build() resolves the Launcher's fields in small steps, each for one concern; they run in this order, so that of
# several bad flags the same one is reported first as before.


def build(
    reg: Registry,
    environment: str | None = None,
    *,
    cluster: str | None = None,
    nodes: int | str | None = None,
    gpus_per_node: int | str | None = None,
    runtime: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    time: str | None = None,
    mounts: str | Sequence[str] | None = None,
    env: Sequence[str] | None = None,
    name: str | None = None,
    image: str | None = None,
    command: Sequence[str] = (),
    chain: int | str | None = None,
    requeue: bool = False,
    max_restarts: int | str | None = None,
    signal_before: int | str | None = None,
    monitor: bool = False,
    monitor_interval: int | str | None = None,
    nccl_debug: bool = False,
    kind: str = "torchrun",
) -> Launcher:
    """Resolve registry defaults and flags into a :class:`Launcher`; every bad value is one ShipyardError line."""
    env_obj = reg.environment(environment)
    cl = reg.cluster(cluster)
    rt = runtimes.get(runtime or cl.runtime)
    fields = dict(kind=kind, environment=env_obj.name, cluster=cl.name, runtime=rt.name, fabric=cl.fabric,
                  root=str(reg.root), registry=str(reg.root / reg.path.name), command=tuple(command))
    fields |= _partition(cl, partition)
    fields |= _resources(cl, kind, nodes, gpus_per_node)
    fields |= _job(cl, kind, time, name, account)
    _check_project(reg, kind, command)
    user_mounts = parse_mounts(mounts, reg.root)
    fields |= _mounts(reg, cl, rt, user_mounts)
    user_env = parse_env(env)
    fields |= _environment(cl, user_env, nccl_debug, env_obj)
    fields |= _image(reg, env_obj.name, cl, rt, image)
    fields |= _checkpointing(chain, requeue, max_restarts, signal_before)
    fields |= _monitoring(kind, monitor, monitor_interval)
    fields |= _site_constants(cl)
    launcher = Launcher(**fields)
    return replace(launcher, regenerate=regenerate_argv(launcher, user_mounts, user_env, image))


def _partition(cl: Cluster, partition: str | None) -> dict:
    """``--partition``, one of the cluster's (default: its scheduler.partition)."""
    partition = partition or cl.partition
    if partition not in cl.partitions:
        raise ShipyardError(f"--partition {partition!r}: not a partition of cluster {cl.name} "
                            f"(valid: {', '.join(cl.partitions)})")
    return {"partition": partition}


def _resources(cl: Cluster, kind: str, nodes, gpus_per_node) -> dict:
    """Nodes, GPUs and CPUs per node, within what the cluster profile says it has."""
    n = options.check("nodes", nodes if nodes is not None else 1)
    if cl.nodes is not None and n > cl.nodes:
        raise ShipyardError(f"--nodes {n}: cluster {cl.name} has {cl.nodes} nodes (clusters.{cl.name}.nodes)")
    g = options.check("gpus_per_node", gpus_per_node if gpus_per_node is not None else cl.gpus_per_node)
    if g > cl.gpus_per_node:
        raise ShipyardError(f"--gpus-per-node {g}: cluster {cl.name} has {cl.gpus_per_node} GPUs per node "
                            f"(clusters.{cl.name}.gpus_per_node)")
    if kind == options.NCCL_TEST and g < 1:
        raise ShipyardError(f"--gpus-per-node {g}: nccl-test runs one rank per GPU and needs at least 1")
    # torchrun is one task per node and gets the node's CPUs; nccl-test's ranks share them as Slurm sees fit
    return {"nodes": n, "gpus_per_node": g,
            "cpus_per_task": cl.cpus_per_node if kind == options.TORCHRUN else None}


def _job(cl: Cluster, kind: str, time, name, account) -> dict:
    """The job's time limit, name and account: words that end up in #SBATCH lines, so checked strictly."""
    time = time or cl.time
    name = name or (launch_data()["defaults"]["name"] if kind == options.TORCHRUN else "nccl-test")
    account = account or cl.account
    return {"time": None if time is None else options.check("time", time),
            "name": options.check("name", name),
            "account": None if account is None else options.check("account", account)}


def _check_project(reg: Registry, kind: str, command: Sequence[str]) -> None:
    """The project directory must be nameable in #SBATCH --output; torchrun needs a training command."""
    if any(c.isspace() or not c.isprintable() or c in "%#" for c in str(reg.root)):
        raise ShipyardError(f"{reg.root}: the project directory's path has spaces, control characters, '%' or '#'; "
                            "#SBATCH --output cannot name a log there (move the project)")
    if kind in options.COMMAND_KINDS and not command:
        raise ShipyardError("no training command: put the script and its arguments after `--`, e.g. "
                            "invoke launch --nodes 2 -- examples/train.py --epochs 3")


def _mounts(reg: Registry, cl: Cluster, rt: Runtime, user_mounts: tuple[Mount, ...]) -> dict:
    """The project, the cluster's binds and ``--mounts`` (none without a container). On the sandbox the nodes are
    this machine, so a source that does not exist here is a typo, not a path on some other filesystem."""
    if slurm.is_sandbox(cl):
        for m in user_mounts:
            if not Path(m.src).exists():
                raise ShipyardError(f"--mounts: source {m.src} does not exist on the sandbox (it runs on this "
                                    "machine; create it or fix the path)")
    mounts = job_mounts(reg.root, cl, user_mounts)
    return {"mounts": mounts if rt.containerised else ()}


def _environment(cl: Cluster, user_env: tuple[tuple[str, str], ...], nccl_debug: bool, env_obj=None) -> dict:
    """Variables in the order they are exported: fabric preset and site, NCCL_DEBUG, then ``--env`` (a later one
    of the same name wins)."""
    check_forbidden(cl, [k for k, _ in user_env], "--env")
    variables: dict[str, EnvVar] = {v.name: v for v in fabric_env(cl, env_obj)}
    debug = launch_data()["nccl_debug"]["full" if nccl_debug else "default"]
    for k, v in debug.items():
        variables[k] = EnvVar(k, str(v), False, "--nccl-debug" if nccl_debug else "NCCL transport line")
    for k, v in user_env:
        variables[k] = EnvVar(k, v, False, "--env")
    return {"env": tuple(variables.values()), "nccl_debug": bool(nccl_debug)}


def _image(reg: Registry, env_name: str, cl: Cluster, rt: Runtime, image: str | None) -> dict:
    """``--image``, else the runtime's image on the cluster's storage; the runtime's site modules come with it."""
    if image and not rt.containerised:
        others = "|".join(n for n in runtimes.NAMES if runtimes.get(n).containerised)
        raise ShipyardError(f"--image: the {rt.name} runtime runs without a container; drop --image or pick "
                            f"--runtime {others}")
    return {"image": image or rt.image(reg.root, env_name, cl, override_flag="--image"), "modules": rt.modules(cl)}


def _checkpointing(chain, requeue: bool, max_restarts, signal_before) -> dict:
    """``--chain``/``--requeue``: either needs the checkpoint signal, so it defaults on with them."""
    defaults = launch_data()["defaults"]
    k_chain = options.check("chain", chain if chain is not None else 1)
    restarts = options.check("max_restarts", max_restarts if max_restarts is not None else defaults["max_restarts"])
    if signal_before is None and (requeue or k_chain > 1):
        signal_before = defaults["signal_before"]
    return {"chain": k_chain, "requeue": bool(requeue), "max_restarts": restarts if requeue else 0,
            "signal": defaults["signal"],
            "signal_before": None if signal_before is None else options.check("signal_before", signal_before)}


def _monitoring(kind: str, monitor: bool, monitor_interval) -> dict:
    """``--monitor`` samples beside torchrun; nccl-test measures the fabric alone."""
    interval = monitor_interval if monitor_interval is not None else launch_data()["defaults"]["monitor_interval"]
    return {"monitor": bool(monitor) and kind == options.TORCHRUN,
            "monitor_interval": options.check("monitor_interval", interval)}


def _site_constants(cl: Cluster) -> dict:
    """What no flag sets: shipyard/data/launch.yaml's ports and waits, and the transport the fabric should pick."""
    defaults, nt = launch_data()["defaults"], launch_data()["nccl_test"]
    return {"rdzv_port": int(defaults["rdzv_port"]), "srun_wait": int(defaults["srun_wait"]),
            "transport": expected_transport(cl.fabric), "nccl_test_binary": nt["binary"],
            "nccl_test_mpi": nt["mpi"], "nccl_test_args": tuple(nt["args"])}


def regenerate_argv(l: Launcher, user_mounts, user_env, image) -> tuple[str, ...]:
    """The exact ``invoke`` command that writes this launcher again (every resolved default made explicit); what
    the user typed for image, mounts and env is repeated as typed, not as resolved."""
    given = options.Options(
        environment=l.environment, cluster=l.cluster, nodes=l.nodes, gpus_per_node=l.gpus_per_node,
        runtime=l.runtime, partition=l.partition, name=l.name,
        registry=l.registry if Path(l.registry).name != "registry.yaml" else None,
        account=l.account, time=l.time, image=image or None,
        mounts=",".join(m.spec() for m in user_mounts) or None,
        env=tuple(f"{k}={v}" for k, v in user_env),
        nccl_debug=l.nccl_debug, monitor=l.monitor, monitor_interval=l.monitor_interval,
        chain=l.chain, requeue=l.requeue, max_restarts=l.max_restarts, signal_before=l.signal_before,
    )
    return options.invocation(l.kind, given, l.command)


# ------------------------------------------------------------------------------------------------ render


def container_argv(l: Launcher) -> list[str]:
    """What goes between ``srun <options>`` and the command on each node: the runtime's srun and exec words."""
    rt = runtimes.get(l.runtime)
    p = Placement(l.image, l.mounts, l.root, tuple(v.name for v in l.env))
    return rt.srun_words(p) + rt.exec_words(p)


def render(l: Launcher) -> str:
    """The launcher script for ``l`` (a pure function: same model, same text)."""
    return templating.render("shipyard.launch", "sbatch.sh.j2", trim_blocks=True,
        l=l,
        version=__version__,
        regenerate=shell_join(l.regenerate),
        container=container_argv(l),
        env_prefix=runtimes.get(l.runtime).env_prefix,
        env_names=[v.name for v in l.env],
        log=f"{l.log_dir}/{l.name}-%j.out",
        usage_prefix=f"{l.log_dir}/{l.name}",
    )


def write(l: Launcher) -> Path:
    """Write ``launch/<name>.sbatch`` atomically (mode 0755) and create ``launch/logs/`` for Slurm's --output."""
    Path(l.log_dir).mkdir(parents=True, exist_ok=True)
    return atomic_write(l.path, render(l), mode=0o755)


# ------------------------------------------------------------------------------------------------ submit


def submit(l: Launcher, path: Path) -> list[str]:
    """``sbatch --parsable`` the launcher ``chain`` times, each after the previous one (afterany: see README)."""
    ids: list[str] = []
    for _ in range(l.chain):
        ids.append(slurm.submit(l.cluster, path, after=ids[-1] if ids else None))
    return ids


def launch_command(argv: Sequence[str], submit_jobs: bool = False, dry_run: bool = False,
                   registry_path=None, **flags) -> str:
    """``invoke launch``/``invoke nccl-test``: build, write (or print with ``dry_run``), optionally submit.

    Returns the text to print. ``argv`` is ``sys.argv`` (the training command is read after ``--``).
    """
    reg = registry.load(registry_path)
    l = build(reg, command=argv_after_dashdash(argv), **flags)
    if dry_run:
        if submit_jobs:
            raise ShipyardError("--dry-run and --submit exclude each other")
        return render(l).rstrip("\n")
    path = write(l)
    rel = os.path.relpath(path)
    lines = [f"wrote {rel}"]
    if submit_jobs:
        ids = submit(l, path)
        lines += [f"submitted job {ids[0]}"] + [f"submitted job {j} (afterany:{p})" for p, j in zip(ids, ids[1:])]
        lines.append(f"log: {l.log_dir}/{l.name}-{ids[0]}.out")
    else:
        how = "invoke sandbox.exec -- sbatch" if slurm.is_sandbox(l.cluster) else "sbatch"
        lines.append(f"submit with: {how} {shlex.quote(str(path))}   (or rerun with --submit)")
    return "\n".join(lines)


def main_argv() -> list[str]:
    """``sys.argv`` (kept as a function so tests can see what the task reads)."""
    return list(sys.argv)
