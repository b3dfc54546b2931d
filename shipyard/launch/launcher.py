"""Slurm launchers for PyTorch training: one model (:class:`Launcher`), one template, any runtime.

``build()`` resolves the registry (the cluster's runtime, partition and GPUs) plus the user's flags (one
:class:`~shipyard.launch.options.Options`, as the task parsed them) into a frozen :class:`Launcher`; ``render()`` is a pure function of that model to the text of
``launch/<name>.sbatch``. ``invoke nccl-test`` renders from the same model with ``kind="nccl-test"``, so the
runtime, mounts, NCCL environment and header are the same code path for both.

What differs per container runtime (image location, srun and exec words, how variables reach the container, site
modules) is asked of the runtime objects in :mod:`shipyard.runtimes`; the flags, their checks and the
"regenerate with" line come from the options model in :mod:`shipyard.launch.options`, the values a flag falls back
to from shipyard/data/launch.yaml. Loading the registry, the check gate and printing are the command's
(:mod:`shipyard.commands.launch`).

Why Jinja2 templates under shipyard/launch/templates/: the scripts are mostly shell, and reading them as shell (with
the few substitutions marked) is how reviewers check them against launcher-rules.md. Every value a user typed goes
through :func:`shell_quote` before it reaches the template.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields as fields_of, replace
from pathlib import Path
from typing import Sequence

from shipyard import __version__, facts, identity, project, slurm, templating
from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_join, shell_quote
from shipyard.files import atomic_write
from shipyard import runtimes
from shipyard.launch import hints, options, passthrough, preflight, sweep as sweeps
from shipyard.staging import record as staged
from shipyard.staging import versions
from shipyard.launch.fabric import (
    EnvVar,
    check_forbidden,
    expected_transport,
    fabric_env,
    fallback_allowed,
    launch_data,
    pin_hint,
    prepend_exports,
    transport_pin,
)
from shipyard.runtimes.mounts import Mount, job_mounts, parse_mounts, spec as mount_spec
from shipyard.runtimes import Placement, Runtime
from shipyard.registry.loader import mem_mb
from shipyard.registry.model import Cluster, Environment, Registry
from shipyard.remote.sync import code_identity

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ------------------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Resources:
    """What the job asks Slurm for: the ``#SBATCH`` lines of sbatch_directives.sh.j2. Checked against the cluster's
    profile by :func:`build`; a field left at its default asks for nothing and takes Slurm's."""

    nodes: int
    gpus_per_node: int
    partition: str
    account: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None  # #SBATCH --mem (Slurm syntax); None: Slurm's default
    exclusive: bool = False
    sbatch_extra: tuple[tuple[str, str], ...] = ()  # --sbatch KEY=VALUE, checked (shipyard/launch/passthrough.py)


@dataclass(frozen=True)
class RuntimeImage:
    """Where the job runs: the container runtime, its image and site modules, what is mounted, and the staged image
    the launcher is bound to (sbatch_environment.sh.j2, sbatch_image.sh.j2, the srun words). Unbound by default: no
    hashes, so the job checks nothing (and :func:`require_bound` refuses a container launcher without them)."""

    runtime: str  # a name in runtimes.NAMES: pyxis | apptainer | charliecloud | host
    image: str | None = None
    modules: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    image_sha256: str | None = None  # the staged image this launcher is bound to (see shipyard/staging/record.py)
    image_input_hash: str | None = None
    image_bound_from: str = ""  # where the hashes were read: the stage record or the build manifest
    image_opt_out: bool = False  # --image: the job runs what it is given, unchecked
    image_spec_sha256: str | None = None  # the spec the bound image was built from (nccl-test checks it)


@dataclass(frozen=True)
class Nccl:
    """The fabric and what the job exports for NCCL: the preset, site and user variables in export order, the pinned
    transport and who allowed a fallback (the header's transport lines, sbatch_environment.sh.j2), and the awk that
    reads which transport the run selected (sbatch_verdict.sh.j2)."""

    fabric: str  # efa | ib | socket
    transport: str  # awk over the job's log: the transport NCCL selected (shipyard/data/nccl.yaml)
    env: tuple[EnvVar, ...] = ()
    nccl_debug: bool = False
    transport_pin: str = ""  # "NCCL_NET=VALUE (where it comes from)" as exported; "" when NCCL_NET is not set
    transport_fallback: str = ""  # who allowed NCCL to fall back to sockets (the flag or the cluster key); "": nobody


@dataclass(frozen=True)
class TorchrunStep:
    """What only a torchrun launcher has: the c10d rendezvous of a multi-node job (sbatch_rendezvous.sh.j2), the
    checks each node passes before torchrun (preflight.sh.j2) and the hints read after a failed step."""

    rdzv_port: int  # the first c10d store port; a job uses rdzv_port + job id % rdzv_ports
    rdzv_ports: int
    node_checks: preflight.NodeChecks | None = None  # --preflight: what each node is held to (None: off)
    failure_hints: str = ""  # awk over the log of a failed step: a hint per known misleading error (launch/hints.py)


@dataclass(frozen=True)
class NcclTest:
    """An nccl-test launcher's step (sbatch_srun_nccl_test.sh.j2). ``binary`` is the --binary flag's value, as the
    "regenerate with" line repeats it; ``nccl_test_binary`` is what the step runs: that name, or its absolute path
    in a shipyard-built image."""

    binary: str
    sizes: str
    iters: int
    check: int
    nccl_test_binary: str
    nccl_test_mpi: str  # srun's MPI plugin; "none": one task per node drives its GPUs
    nccl_test_args: tuple[str, ...]
    nccl_test_tasks: int  # ranks per node: one per GPU, or one driving every GPU with mpi none
    nccl_test_grace: int  # seconds a failed task waits before exiting, so that its last lines reach the log
    nccl_test_per_node: str  # mpi none: the line the job prints first, for nccl-report ("": an MPI job)


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint signal, requeue and chain (sbatch_step.sh.j2 forwards the signal, sbatch_requeue.sh.j2
    requeues). Off by default: one job, no signal, no requeue."""

    signal: str
    chain: int  # jobs submitted one after the other (1: one job)
    requeue: bool = False
    max_restarts: int = 0
    signal_before: int | None = None  # seconds before the time limit; None: no checkpoint signal


@dataclass(frozen=True)
class Monitoring:
    """``--monitor``: a sampler on each node beside torchrun (sbatch_monitor.sh.j2). Off by default."""

    monitor_interval: int
    monitor: bool = False


@dataclass(frozen=True)
class SweepArray:
    """``--sweep``/``--sweep-file``: the combinations, one array task each (sbatch_sweep.sh.j2). None: no sweep."""

    combinations: sweeps.Sweep | None = None
    max_concurrent: int | None = None  # --max-concurrent: the array's %P


PARTS = {"resources": Resources, "runtime_image": RuntimeImage, "nccl": Nccl, "torchrun_step": TorchrunStep,
         "nccl_test": NcclTest, "checkpoint": Checkpoint, "monitoring": Monitoring, "sweep_array": SweepArray}
_PART_OF = {f.name: part for part, cls in PARTS.items() for f in fields_of(cls)}


@dataclass(frozen=True)
class Launcher:
    """Everything a launcher script says: what the job is, and its parts (:data:`PARTS`), each the model of the
    template blocks it names. Built by :func:`build`, which sets every field from the flags, the registry or
    shipyard/data/launch.yaml; rendered by :func:`render`. A part's field reads as the launcher's own (``l.nodes``
    is ``l.resources.nodes``), so a caller need not know which part holds it; :meth:`of` and :meth:`replace` take
    the fields flat."""

    name: str
    kind: str  # "torchrun" | "nccl-test"
    environment: str
    cluster: str
    local_sandbox: bool  # the cluster's profile says it is this machine's sandbox: its clients take the sandbox's route
    root: str  # project directory (absolute): workdir, and where launch/ lives
    registry: str  # the registry file the launcher was generated from
    workdir: str  # where the job runs (the host path; default: root): torchrun resolves the script from here
    container_workdir: str  # the same directory as the container sees it (== workdir without a container)
    command: tuple[str, ...]  # training script and its arguments, exactly as given
    srun_wait: int
    umask: str  # every launcher's umask (shipyard/data/launch.yaml): what its job writes is its user's alone
    forced: tuple[str, ...]  # `invoke check` errors that --force overrode (named in the header)
    code_commit: str | None  # the project's commit (git, else what remote.sync shipped); None: unknown
    code_dirty: bool  # uncommitted changes to tracked files were part of it
    resources: Resources
    runtime_image: RuntimeImage
    nccl: Nccl
    torchrun_step: TorchrunStep
    nccl_test: NcclTest
    checkpoint: Checkpoint
    monitoring: Monitoring
    sweep_array: SweepArray
    handout: bool = False  # a student's launcher (shipyard/launch/handout.py): runs where it is submitted from
    regenerate: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, **values) -> Launcher:
        """A launcher from its fields given flat: each part's go to that part."""
        grouped: dict[str, dict] = {part: {} for part in PARTS}
        own = {}
        for key, value in values.items():
            (grouped[_PART_OF[key]] if key in _PART_OF else own)[key] = value
        return cls(**own, **{part: PARTS[part](**given) for part, given in grouped.items()})

    def replace(self, **values) -> Launcher:
        """This launcher with the fields given flat changed, in whichever part they are."""
        own = {k: v for k, v in values.items() if k not in _PART_OF}
        for part in PARTS:
            changed = {k: v for k, v in values.items() if _PART_OF.get(k) == part}
            if changed:
                own[part] = replace(getattr(self, part), **changed)
        return replace(self, **own)

    def __getattr__(self, name: str):
        part = _PART_OF.get(name)
        if part is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(object.__getattribute__(self, part), name)

    @property
    def path(self) -> Path:
        return project.launcher_path(Path(self.root), self.name)

    @property
    def log_mode(self) -> str:
        """The mode a file created under the launcher's umask gets (its log, which Slurm opened before the umask)."""
        return f"{0o666 & ~int(self.umask, 8):04o}"

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
        if not sep or not _ENV_NAME.fullmatch(key):
            raise ShipyardError(f"--env {item!r}: expected NAME=VALUE with NAME a shell variable name "
                                "(letters, digits, _; not starting with a digit)")
        out[key] = val
    return tuple(out.items())


# ------------------------------------------------------------------------------------------------ build
# build() resolves the Launcher's fields in small steps, each for one concern; they run in this order, so that of
# several bad flags the same one is reported first as before.


def build(reg: Registry, env: Environment, cluster: Cluster, opts: options.Options, command: Sequence[str] = (),
          workdir: str | os.PathLike | None = None, forced: Sequence[str] = (), *,
          kind: str = options.TORCHRUN) -> Launcher:
    """Resolve registry defaults and the flags in ``opts`` into a :class:`Launcher` for ``env`` on ``cluster`` (the
    objects the command resolved from ``opts.environment`` and ``opts.cluster``); every bad value is one
    ShipyardError line.

    ``command``: the training script and its arguments. ``workdir``: the directory the job runs in and resolves
    relative paths from, as torchrun would from where ``invoke launch`` ran (the command passes its working
    directory; default: the project root). ``forced``: the `invoke check` errors ``--force`` overrode."""
    rt = runtimes.get(opts.runtime or cluster.runtime)
    fields = dict(kind=kind, environment=env.name, runtime=rt.name,
                  root=str(reg.root), registry=str(reg.root / reg.path.name), command=tuple(command))
    fields["sbatch_extra"] = passthrough.parse(opts.sbatch)  # a new flag: checked first
    fields |= _partition(cluster, opts.partition)
    cl = cluster.on(fields["partition"])  # from here on: the chosen partition's GPUs, CPUs, memory and fabric
    fields |= {"cluster": cl.name, "local_sandbox": cl.local_sandbox, "fabric": cl.fabric}
    fields |= _resources(cl, kind, opts.nodes, opts.gpus_per_node)
    fields |= _cpus_and_memory(cl, kind, fields["gpus_per_node"], opts.cpus_per_task, opts.mem, opts.exclusive)
    fields |= _job(cl, kind, opts.time, opts.name, opts.account)
    _check_project(reg, kind, command)
    user_mounts = parse_mounts(opts.mounts, reg.root)
    fields |= _mounts(reg, cl, rt, user_mounts)
    fields |= _workdir(reg, rt, fields["mounts"], workdir)
    _check_script(cl, rt, kind, command, fields)
    user_env = parse_env(opts.env)
    fields |= _environment(cl, user_env, opts.nccl_debug, env, opts.allow_transport_fallback)
    fields |= _code(Path(reg.root), fields["env"])
    fields |= _image(reg, env.name, cl, rt, opts.image)
    fields |= _checkpointing(opts.chain, opts.requeue, opts.max_restarts, opts.signal_before)
    fields |= _sweep(kind, opts, fields["chain"])
    fields |= _monitoring(kind, opts.monitor, opts.monitor_interval)
    fields |= _site_constants(cl, next((v for v in fields["env"] if v.name == "NCCL_NET"), None))
    fields |= _nccl_test(cl, kind, opts, fields["gpus_per_node"], in_image=rt.containerised and not opts.image)
    fields |= _binding(reg, env.name, rt, fields["image"], opts.image)
    fields |= _nccl_test_env(kind, fields["nodes"], fields["env"])
    fields |= _preflight(env, cl, kind, opts.preflight, fields["gpus_per_node"], bool(opts.image))
    fields["forced"] = tuple(" ".join(str(f).split()) for f in forced)  # one comment line each
    launcher = Launcher.of(**fields)
    given = _resolved_options(launcher, opts, user_mounts, user_env)
    return replace(launcher, regenerate=options.invocation(kind, given, launcher.command))


def _partition(cl: Cluster, partition: str | None) -> dict:
    """``--partition``, one of the cluster's (default: its scheduler.partition)."""
    partition = partition or cl.partition
    if partition not in cl.partitions:
        raise ShipyardError(f"--partition {partition!r}: not a partition of cluster {cl.name} "
                            f"(valid: {', '.join(cl.partitions)})")
    return {"partition": partition}


def _resources(cl: Cluster, kind: str, nodes, gpus_per_node) -> dict:
    """Nodes, GPUs and CPUs per node, within what the cluster profile says it has."""
    n = options.check("nodes", nodes if nodes is not None else options.defaults()["nodes"])
    if cl.nodes is not None and n > cl.nodes:
        raise ShipyardError(f"--nodes {n}: cluster {cl.name} has {cl.nodes} nodes (clusters.{cl.name}.nodes)")
    mig = int(facts.load("compat")["mig"]["gpus_per_node"]) if cl.mig else None
    default_g = cl.gpus_per_node if mig is None else min(mig, cl.gpus_per_node)
    g = options.check("gpus_per_node", gpus_per_node if gpus_per_node is not None else default_g)
    if mig is not None and g > mig:
        raise ShipyardError(f"--gpus-per-node {g}: partition {cl.partition} of cluster {cl.name} has MIG instances "
                            f"({cl.mig}); a multi-process NCCL job can use {mig} per node, because "
                            f"{' '.join(facts.load('compat')['mig']['reason'].split())}")
    if g > cl.gpus_per_node:
        raise ShipyardError(f"--gpus-per-node {g}: partition {cl.partition} of cluster {cl.name} has {cl.gpus_per_node} "
                            f"GPUs per node ({cl.key('gpus_per_node')})")
    if kind == options.NCCL_TEST and g < 1:
        raise ShipyardError(f"--gpus-per-node {g}: nccl-test runs one rank per GPU and needs at least 1")
    return {"nodes": n, "gpus_per_node": g}


def _cpus_and_memory(cl: Cluster, kind: str, g: int, cpus, mem, exclusive: bool) -> dict:
    """``--cpus-per-task``, ``--mem``, ``--exclusive``; by default what fits the partition: the whole node when the
    job takes all its GPUs (or the partition allocates whole nodes), else CPUs and memory in proportion to the GPUs
    asked for, so a 1-GPU job on a shared 8-GPU node asks for an eighth of it. torchrun is one task per node and
    gets those CPUs; nccl-test's ranks (one per GPU) share the node's CPUs as Slurm sees fit."""
    exclusive = bool(exclusive) or cl.exclusive
    total_g, total_c = cl.gpus_per_node, cl.cpus_per_node
    whole = exclusive or total_g == 0 or g >= total_g
    share = max(g, 1) / total_g if not whole else 1.0  # a 0-GPU job on a GPU node gets one GPU's share
    if cpus is not None:
        cpus = options.check("cpus_per_task", cpus)
        if total_c is not None and cpus > total_c:
            raise ShipyardError(f"--cpus-per-task {cpus}: partition {cl.partition} of cluster {cl.name} has "
                                f"{total_c} CPUs per node ({cl.key('cpus_per_node')})")
    elif kind == options.TORCHRUN and total_c is not None:
        cpus = max(1, int(total_c * share))
    if mem is not None:
        mem = options.check("mem", str(mem))
        try:
            want, have = mem_mb(mem), cl.mem_per_node_mb
        except ShipyardError as exc:
            raise ShipyardError(f"--mem {exc}") from None
        if have is not None and want > have:
            raise ShipyardError(f"--mem {mem}: partition {cl.partition} of cluster {cl.name} has {have}M per node "
                                f"({cl.key('mem_per_node')})")
    elif not whole and cl.mem_per_node_mb is not None:
        if int(cl.mem_per_node_mb * share) < 1:  # --mem=0 would be the whole node's memory
            raise ShipyardError(f"partition {cl.partition} of cluster {cl.name}: {cl.mem_per_node_mb}M per node "
                                f"({cl.key('mem_per_node')}) leaves less than 1M for {max(g, 1)} of {total_g} GPUs; "
                                "fix mem_per_node or pass --mem")
        mem = f"{int(cl.mem_per_node_mb * share)}M"
    return {"cpus_per_task": cpus if kind == options.TORCHRUN else None, "mem": mem, "exclusive": exclusive}


def _job(cl: Cluster, kind: str, time, name, account) -> dict:
    """The job's time limit, name and account: words that end up in #SBATCH lines, so checked strictly.

    The default name carries the cluster (``train-<cluster>``), so launchers for two clusters do not overwrite each
    other; the default time is capped at the partition's maximum, a ``--time`` above it is refused."""
    max_time = cl.partition_info().max_time
    if time is not None:
        time = options.check("time", time)
        if max_time and options.seconds(time) > options.seconds(max_time):
            raise ShipyardError(f"--time {time}: partition {cl.partition} of cluster {cl.name} allows at most "
                                f"{max_time} ({cl.key('max_time')})")
    else:
        time = cl.time
        if max_time and (time is None or options.seconds(time) > options.seconds(max_time)):
            time = max_time
    name = name or f"{options.default_name(kind)}-{cl.name}"
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


def _workdir(reg: Registry, rt: Runtime, mounts: tuple[Mount, ...], workdir) -> dict:
    """The job's working directory on the node and in the container. A container sees a host directory only
    through a mount, so the directory must lie under one (the project, a cluster bind or ``--mounts``)."""
    host = Path(workdir).absolute() if workdir else Path(reg.root)
    text = str(host)
    if any(c.isspace() or not c.isprintable() or c in "%#" for c in text):
        raise ShipyardError(f"{text}: the working directory's path has spaces, control characters, '%' or '#'; "
                            "#SBATCH --chdir cannot name it (run invoke launch from another directory)")
    if not rt.containerised:
        return {"workdir": text, "container_workdir": text}
    inside = _to_container(host, mounts)
    if inside is None:
        raise ShipyardError(f"{text}: the container cannot see this directory (mounted: "
                            f"{', '.join(m.src for m in mounts)}); run invoke launch from the project directory or "
                            "a bound one, or add it with --mounts")
    return {"workdir": text, "container_workdir": str(inside)}


def _to_container(host: Path, mounts) -> Path | None:
    """``host`` as the container sees it through the mount with the longest matching source (None: not mounted)."""
    best = None
    for m in mounts:
        src = Path(m.src)
        if (host == src or src in host.parents) and (best is None or len(m.src) > len(best.src)):
            best = m
    return None if best is None else Path(best.dst) / host.relative_to(best.src)


def _to_host(inside: Path, mounts) -> tuple[Path, Path] | None:
    """(host path, host directory of the mount) of a container path (None: the path is in the image itself)."""
    best = None
    for m in mounts:
        dst = Path(m.dst)
        if (inside == dst or dst in inside.parents) and (best is None or len(m.dst) > len(best.dst)):
            best = m
    return None if best is None else (Path(best.src) / inside.relative_to(best.dst), Path(best.src))


def _check_script(cl: Cluster, rt: Runtime, kind: str, command: Sequence[str], fields: dict) -> None:
    """The training script must exist where the job will look: torchrun opens it relative to the working
    directory, on the node or in the container. Checked when that place is visible from here (always on the
    sandbox, which is this machine; elsewhere when its directory exists here, e.g. on the login node)."""
    if kind not in options.COMMAND_KINDS or not command or command[0].startswith("-"):
        return  # torchrun -m MODULE / --no-python: not a file
    script = command[0]
    if rt.containerised:
        inside = Path(fields["container_workdir"]) / script
        found = _to_host(inside, fields["mounts"])
        if found is None:
            return  # inside the image: not visible from here
        host, anchor = found
    else:
        host = Path(fields["workdir"]) / script
        anchor = Path(fields["workdir"]) if not Path(script).is_absolute() else host.parent
    if not (slurm.is_sandbox(cl) or anchor.is_dir()):
        return
    if not host.is_file():
        where = f"in the container's {fields['container_workdir']}" if rt.containerised else fields["workdir"]
        raise ShipyardError(f"{script}: no such file at {host}, where the job will look (torchrun runs it from "
                            f"{where}); run invoke launch from the script's directory or give its path from here")


def _environment(cl: Cluster, user_env: tuple[tuple[str, str], ...], nccl_debug: bool, env_obj=None,
                 allow_fallback: bool = False) -> dict:
    """Variables in the order they are exported: the pinned transport (NCCL_NET, unless the flag or the cluster
    allows a fallback), fabric preset and site, NCCL_DEBUG, then ``--env`` (a later one of the same name wins)."""
    check_forbidden(cl, [k for k, _ in user_env], "--env")
    fallback = fallback_allowed(cl, allow_fallback)
    pin = None if fallback else transport_pin(cl)
    variables: dict[str, EnvVar] = {pin.name: pin} if pin else {}
    variables |= {v.name: v for v in fabric_env(cl, env_obj)}
    debug = launch_data()["nccl_debug"]["full" if nccl_debug else "default"]
    for k, v in debug.items():
        variables[k] = EnvVar(k, str(v), False, "--nccl-debug" if nccl_debug else "NCCL transport line")
    for k, v in user_env:
        variables[k] = EnvVar(k, v, False, "--env")
    net = variables.get("NCCL_NET")
    return {"env": tuple(variables.values()), "nccl_debug": bool(nccl_debug), "transport_fallback": fallback,
            "transport_pin": f"NCCL_NET={net.value} ({net.origin})" if net else ""}


def _code(root: Path, env: tuple[EnvVar, ...]) -> dict:
    """Which code the job runs: the commit and dirty flag in the header and as SHIPYARD_COMMIT / SHIPYARD_DIRTY in
    the job's environment (a checkout of its own, else the record `invoke remote.sync` left; unknown: neither)."""
    commit, dirty = code_identity(root, own_checkout=True)
    if commit == "unknown":
        return {"code_commit": None, "code_dirty": False}
    extra = (EnvVar("SHIPYARD_COMMIT", commit, False, "the project's commit"),
             EnvVar("SHIPYARD_DIRTY", "1" if dirty else "0", False, "1: uncommitted changes were part of it"))
    return {"code_commit": commit, "code_dirty": bool(dirty), "env": tuple(env) + extra}


def _image(reg: Registry, env_name: str, cl: Cluster, rt: Runtime, image: str | None) -> dict:
    """``--image``, else the runtime's image on the cluster's storage; the runtime's site modules come with it."""
    if image and not rt.containerised:
        others = "|".join(n for n in runtimes.NAMES if runtimes.get(n).containerised)
        raise ShipyardError(f"--image: the {rt.name} runtime runs without a container; drop --image or pick "
                            f"--runtime {others}")
    # the version stage's pointer names now: a job queued before the next stage still runs what it was written for
    return {"image": image or versions.resolve(rt.image(reg.root, env_name, cl, override_flag="--image")),
            "modules": rt.modules(cl)}


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _binding(reg: Registry, env_name: str, rt: Runtime, image: str | None, given: str | None) -> dict:
    """The hashes of the image the job must find (its stage record, else the local build manifest); ``--image``
    opts out. Unknown (nothing staged or built here) leaves the launcher unbound, which :func:`require_bound`
    refuses."""
    if not rt.containerised:
        return {}
    if given:
        return {"image_opt_out": True}
    b = staged.binding(reg.root, env_name, image, rt.suffix)
    if b is None or not (_HEX64.fullmatch(b.sha256) and _HEX64.fullmatch(b.input_hash)):
        return {}
    return {"image_sha256": b.sha256, "image_input_hash": b.input_hash,
            "image_bound_from": " ".join(b.source.split()), "image_spec_sha256": b.spec_sha256}


def _preflight(env: Environment, cl: Cluster, kind: str, flag: str | None, gpus: int, external: bool) -> dict:
    """``--preflight on|off`` (default: on when the job asks for GPUs): the facts each node is held to before
    torchrun (shipyard/launch/preflight.py)."""
    if kind != options.TORCHRUN or not preflight.wanted(flag, gpus):
        return {"node_checks": None}
    return {"node_checks": preflight.node_checks(env, cl, gpus, external)}


def _checkpointing(chain, requeue: bool, max_restarts, signal_before) -> dict:
    """``--chain``/``--requeue``: either needs the checkpoint signal, so it defaults on with them."""
    defaults = launch_data()["defaults"]
    k_chain = options.check("chain", chain if chain is not None else defaults["chain"])
    restarts = options.check("max_restarts", max_restarts if max_restarts is not None else defaults["max_restarts"])
    if signal_before is None and (requeue or k_chain > 1):
        signal_before = defaults["signal_before"]
    return {"chain": k_chain, "requeue": bool(requeue), "max_restarts": restarts if requeue else 0,
            "signal": defaults["signal"],
            "signal_before": None if signal_before is None else options.check("signal_before", signal_before)}


def _sweep(kind: str, opts: options.Options, chain: int) -> dict:
    """``--sweep``/``--sweep-file`` (torchrun only) and ``--max-concurrent``; a sweep is not chained (each task
    requeues on its own with ``--requeue``, and a resubmit runs what did not finish)."""
    sw = sweeps.from_options(opts.sweep, opts.sweep_file) if kind == options.TORCHRUN else None
    p = opts.max_concurrent
    if p is not None and sw is None:
        raise ShipyardError("--max-concurrent: only with --sweep or --sweep-file")
    if sw is not None and chain > 1:
        raise ShipyardError("--chain with a sweep: use --requeue (each task resumes itself); a resubmit runs the "
                            "combinations that did not finish")
    return {"combinations": sw, "max_concurrent": None if p is None else options.check("max_concurrent", p)}


def _monitoring(kind: str, monitor: bool, monitor_interval) -> dict:
    """``--monitor`` samples beside torchrun; nccl-test measures the fabric alone."""
    interval = monitor_interval if monitor_interval is not None else launch_data()["defaults"]["monitor_interval"]
    return {"monitor": bool(monitor) and kind == options.TORCHRUN,
            "monitor_interval": options.check("monitor_interval", interval)}


def umask(value) -> str:
    """The data file's umask as four octal digits; one line when it is not a umask."""
    text = str(value)
    if not re.fullmatch(r"0?[0-7]{3}", text):
        raise ShipyardError(f"shipyard/data/launch.yaml defaults.umask {text!r}: expected an octal umask such as 077")
    return f"{int(text, 8):04o}"


def _site_constants(cl: Cluster, pinned: EnvVar | None = None) -> dict:
    """What no flag sets: shipyard/data/launch.yaml's ports and waits, and the transport the fabric should pick."""
    defaults = launch_data()["defaults"]
    return {"rdzv_port": int(defaults["rdzv_port"]), "rdzv_ports": int(defaults["rdzv_ports"]),
            "srun_wait": int(defaults["srun_wait"]), "umask": umask(defaults["umask"]),
            "transport": expected_transport(cl.fabric),
            "failure_hints": hints.awk_program(hints.failure_hints() + _pin_hints(cl, pinned))}


def _pin_hints(cl: Cluster, pinned: EnvVar | None) -> list[dict]:
    """The hint for a pinned network NCCL did not find (none when nothing pins NCCL_NET)."""
    hint = pin_hint(cl, pinned.value) if pinned else None
    return [hint] if hint else []


def _nccl_test(cl: Cluster, kind: str, opts: options.Options, gpus: int, in_image: bool) -> dict:
    """nccl-tests' binary and arguments from --binary, --sizes, --iters, --check (defaults: shipyard/data/launch.yaml),
    and the srun MPI plugin of the cluster (clusters.NAME.mpi, else the data's default). ``mpi: none`` runs one
    process per node driving its GPUs (-g G): nccl-tests without MPI has no multi-process mode.

    ``in_image``: the binary is in a shipyard-built image, named by its absolute path there
    (shipyard/data/nccl_tests.yaml ``prefix``): pyxis's step resolves a bare name on the job's PATH, which is the
    submitting host's, not the image's (seen with real pyxis 0.24.0: "execve(): all_reduce_perf: No such file or
    directory" on every node). In an external ``--image`` the template runs it through the container's ``/bin/sh``, so
    the image's own PATH finds it; on the host runtime the name is looked up as given."""
    defaults, nt = launch_data()["defaults"], launch_data()["nccl_test"]

    def get(name):
        value = getattr(opts, name)
        return options.check(name, value if value is not None else defaults[name])

    binary, sizes, iters, check = get("binary"), get("sizes"), get("iters"), get("check")
    mpi = cl.mpi or nt["mpi"]
    low, high = sizes.split(":")
    args = ["-b", low, "-e", high, *nt["args"], "-c", str(check), "-n", str(iters)]
    if mpi == "none":
        args[args.index("-g") + 1] = str(gpus)
    command = f"{facts.load('nccl_tests')['prefix']}/bin/{binary}" if in_image else binary
    return {"nccl_test_binary": command, "nccl_test_mpi": mpi, "nccl_test_args": tuple(args),
            "nccl_test_tasks": 1 if mpi == "none" else gpus, "binary": binary, "sizes": sizes, "iters": iters,
            "check": check, "nccl_test_grace": int(nt["failure_grace_s"]),
            "nccl_test_per_node": nt["per_node_line"] if mpi == "none" else ""}


def _nccl_test_env(kind: str, nodes: int, env: tuple[EnvVar, ...]) -> dict:
    """An nccl-test on 2 or more nodes measures the fabric with Ring (shipyard/data/launch.yaml
    ``nccl_test.multi_node_env``: Tree's 2-node busbw can exceed the link rate); a value the cluster or ``--env``
    gives wins."""
    if kind != options.NCCL_TEST or nodes < 2:
        return {}
    have = {v.name for v in env}
    extra = tuple(EnvVar(k, str(v), False, f"nccl-test on {nodes} nodes: busbw against the link rate")
                  for k, v in (launch_data()["nccl_test"].get("multi_node_env") or {}).items() if k not in have)
    return {"env": tuple(env) + extra}


def _resolved_options(l: Launcher, given: options.Options, user_mounts, user_env) -> options.Options:
    """The flags that write this launcher again: ``given`` with every resolved default made explicit (the header's
    "regenerate with" line is :func:`options.invocation` of it). A flag takes the value of the launcher's field of
    the same name; what the user typed for image, mounts and env is repeated as typed, not as resolved; the registry
    only when it is not the usual file name; ``--force`` only when it overrode something. A flag with no field of
    that name stays as given (checked by its option)."""
    values = {f.name: getattr(l, f.name) for f in fields_of(given) if hasattr(l, f.name)}
    return options.resolved(given, values | dict(
        registry=l.registry if Path(l.registry).name != "registry.yaml" else None,
        image=given.image or None,
        mounts=",".join(mount_spec(m) for m in user_mounts) or None,
        env=tuple(f"{k}={v}" for k, v in user_env),
        force=bool(l.forced),
    ))


# ------------------------------------------------------------------------------------------------ render


def container_argv(l: Launcher) -> list[str]:
    """What goes between ``srun <options>`` and the command on each node: the runtime's srun and exec words."""
    rt = runtimes.get(l.runtime)
    name = f"{l.environment}-{l.image_sha256[:16]}" if l.image_sha256 else None  # only a staged image's hash
    p = Placement(l.image, l.mounts, l.container_workdir or l.root, tuple(v.name for v in l.env if not v.prepend),
                  container_name=name)
    return rt.srun_words(p) + rt.exec_words(p)


def _prepend_exports(l: Launcher) -> str:
    """Shell that puts host-injected path lists in front of the container's own values (run inside it)."""
    return "; ".join(prepend_exports(l.env))


def _nccl_test_script(l: Launcher, image_path: str) -> str:
    """The ``/bin/sh -c`` script each nccl-test task runs its binary through (POSIX sh: in the container when there
    is one): the image's PATH back for an external image, the host-injected path lists in front, then the binary; a
    failed binary's task waits ``nccl_test_grace`` seconds before exiting with its status, so that its last lines
    (why it failed) reach the log before srun's --kill-on-bad-exit ends the step."""
    run = f'"$@"; rc=$?; if [ "$rc" -ne 0 ]; then sleep {l.nccl_test_grace}; fi; exit "$rc"'
    return "; ".join(x for x in (image_path, _prepend_exports(l), run) if x)


def _own(l: Launcher) -> dict[str, object]:
    """What the templates read as ``l``: the launcher's own fields and what follows from them, as plain data."""
    own = {f.name: getattr(l, f.name) for f in fields_of(Launcher) if f.name not in PARTS}
    return own | {"multi_node": l.multi_node, "log_dir": l.log_dir, "log_mode": l.log_mode}


def _sweep_view(part: SweepArray) -> dict[str, object]:
    """The sweep part as the templates read it (how many combinations, the parameters' names), as plain data."""
    sw = part.combinations
    return {"combinations": {"count": sw.count, "names": sw.names} if sw else None,
            "max_concurrent": part.max_concurrent}


def render(l: Launcher) -> str:
    """The launcher script for ``l`` (a pure function: same model, same text). Its context is plain data, so the
    text is kept and an unchanged launcher renders without Jinja2 (shipyard/rendered.py)."""
    image_path = runtimes.get(l.runtime).image_path_prelude() if l.image_opt_out else ""
    return templating.render("shipyard.launch", "sbatch.sh.j2", trim_blocks=True,
        l=_own(l),
        **{part: getattr(l, part) for part in PARTS if part != "sweep_array"},  # each block reads its part by name
        sweep_array=_sweep_view(l.sweep_array),
        record=str(staged.record_path(l.image)) if l.image_sha256 else "",
        identity=identity.shell_rule(),  # the job's "image unchanged" check: shipyard/identity.py's stat format
        version=__version__,
        regenerate=shell_join(l.regenerate),
        container=container_argv(l),
        runtime_lines=runtimes.get(l.runtime).batch_lines(),
        env_prefix=runtimes.get(l.runtime).env_prefix,
        env_names=[v.name for v in l.env if not v.prepend],
        prepends=[v for v in l.env if v.prepend],
        prepend_exports=_prepend_exports(l),
        image_path=image_path,
        nccl_test_script=_nccl_test_script(l, image_path),
        # handout: the submit dir's logs/; a sweep: one log per array task
        log=(f"logs/{l.name}-%j.out" if l.handout
             else f"{l.log_dir}/{l.name}-" + ("%A_%a.out" if l.combinations else "%j.out")),
        sweep_table=str(sweeps.submitted_table_path(l.root, l.name, l.combinations)) if l.combinations else "",
        sweep_sha256=sweeps.table_sha256(l.combinations) if l.combinations else "",
        sweep_runs=str(sweeps.runs_dir(l.root, l.name)) if l.combinations else "",
        sweep_done=sweeps.DONE,
        usage_prefix=f"{l.log_dir}/{l.name}",
        sbatch_extra=passthrough.words(l.sbatch_extra),
    )


_WRITTEN_FOR = re.compile(r"^# environment \S+, cluster (\S+), runtime ", re.M)


def write(l: Launcher) -> Path:
    """Write ``launch/<name>.sbatch`` atomically (mode 0755) and create ``launch/logs/`` for Slurm's --output.

    A launcher written for another cluster under the same name is not replaced: the user would lose it silently."""
    try:
        old = _WRITTEN_FOR.search(l.path.read_text(errors="replace")[:4096])
    except OSError:
        old = None
    if old and old.group(1) != l.cluster:
        raise ShipyardError(f"{l.path}: already a launcher for cluster {old.group(1)}; pick another --name "
                            f"(e.g. --name {l.name}-{l.cluster}) or delete that file")
    Path(l.log_dir).mkdir(parents=True, exist_ok=True)
    return atomic_write(l.path, render(l), mode=0o755)


# ------------------------------------------------------------------------------------------------ submit


def target(l: Launcher) -> slurm.Target:
    """The cluster ``l`` was written for, as the Slurm client addresses it."""
    return slurm.Target(l.cluster, l.local_sandbox)


def submit(l: Launcher, path: Path) -> list[str]:
    """``sbatch --parsable`` the launcher ``chain`` times, each after the previous one (afterany: see README)."""
    ids: list[str] = []
    for _ in range(l.chain):
        ids.append(slurm.submit(target(l), path, after=ids[-1] if ids else None))
    return ids


def submit_sweep(l: Launcher, path: Path, max_array_size: int) -> tuple[list[str], int]:
    """Submit the combinations of ``l``'s sweep that have not finished, as arrays of task ids below
    ``max_array_size`` (one ``sbatch`` per array); (job ids, combinations already done)."""
    sw = l.combinations
    finished = sweeps.done(l.root, l.name, [sw.directory_name(i) for i in range(sw.count)])
    todo = [i for i, f in enumerate(finished) if not f]
    ids = []
    for offset, spec in sweeps.array_specs(todo, max_array_size):
        extra = [f"--array={spec}" + (f"%{l.max_concurrent}" if l.max_concurrent else "")]
        if offset:
            extra.append(f"--export=ALL,SHIPYARD_SWEEP_OFFSET={offset}")
        ids.append(slurm.submit(target(l), path, extra=extra))
    return ids, sw.count - len(todo)


def require_bound(l: Launcher) -> None:
    """A launcher for a container runtime names the image it runs (its sha256 and input hash), or ``--image``."""
    if not runtimes.get(l.runtime).containerised or l.image_sha256 or l.image_opt_out:
        return
    raise ShipyardError(f"{l.image}: no image to bind the launcher to (no stage record beside it, no "
                        f"{runtimes.get(l.runtime).suffix} in containers/{l.environment}.json); run `invoke build "
                        f"{l.environment}` and `invoke stage {l.environment} --cluster {l.cluster}`, or give --image "
                        "PATH to run an image unchecked")


def spec_drift(l: Launcher, env: Environment, root: Path) -> str | None:
    """Why the image ``l`` is bound to is not what registry.yaml's environment gives today (the spec recorded with
    it differs), naming the pins that differ when the build manifest in ``root`` is that build; None when it is, or
    when nothing was recorded to compare (an image given with --image, a launcher without a container)."""
    if not runtimes.get(l.runtime).containerised or l.image_opt_out or not l.image_spec_sha256:
        return None
    if l.image_spec_sha256 == env.spec_hash:
        return None
    what = f"spec sha256 {l.image_spec_sha256[:12]}, registry.yaml's is {env.spec_hash[:12]}"
    try:
        m = mf.read_manifest(project.manifest_path(root, env.name))
    except (ShipyardError, OSError):
        m = None
    if m and m.spec_hash == l.image_spec_sha256 and m.pins:
        now = {k: p.value for k, p in env.pins().items()}
        diff = [f"{k} {m.pins.get(k)} -> {v}" for k, v in now.items() if m.pins.get(k) != v]
        if diff:
            what = ", ".join(diff)
    return f"{l.image} was built from another spec of environments.{env.name} than registry.yaml's today ({what})"


def require_nccl_tests(l: Launcher, env: Environment, vouched: bool) -> None:
    """`invoke nccl-test` runs nccl-tests' binaries from the image: the bound image's build must have included them
    (``nccl_tests:`` in the environment, and the image's recorded spec is the registry's, which carries it); an
    external ``--image`` only with ``vouched`` (--image-has-nccl-tests). The host runtime has no image: the binary
    must be on the nodes' PATH, which nothing here can see."""
    if not runtimes.get(l.runtime).containerised:
        return
    if l.image_opt_out:
        if not vouched:
            raise ShipyardError(f"--image {l.image}: shipyard cannot tell whether it carries nccl-tests; add "
                                "--image-has-nccl-tests to vouch for it (NGC's PyTorch images do), or run an image "
                                "built with nccl_tests")
        return
    if env.nccl_tests is None:
        raise ShipyardError(f"environments.{env.name}.nccl_tests: not set, so its image has no {l.binary}; "
                            f"set `nccl_tests: true`, then `invoke build {env.name}` and `invoke stage {env.name}`, or "
                            "give --image IMAGE --image-has-nccl-tests")
    if env.nccl_tests.mpi == "none" and l.nccl_test_mpi != "none":
        raise ShipyardError(f"environments.{env.name}.nccl_tests.mpi: none (built without MPI), but cluster "
                            f"{l.cluster} starts ranks with srun --mpi={l.nccl_test_mpi}: every rank would run its own "
                            f"test; set clusters.{l.cluster}.mpi: none, or build with mpi: openmpi")
    if l.image_spec_sha256 != env.spec_hash:
        got = (l.image_spec_sha256 or "not recorded")[:12]
        raise ShipyardError(f"{l.image}: built from spec {got}, not registry.yaml's {env.spec_hash[:12]} (which has "
                            f"nccl_tests: {env.nccl_tests.version}); rebuild and stage it: `invoke build {env.name}`")


def chain_path(l: Launcher) -> Path:
    """``launch/<name>.chain.sh``: submits a ``--chain K`` launcher K times (written without ``--submit``)."""
    return l.path.with_name(f"{l.name}.chain.sh")


def chain_plan(l: Launcher) -> str:
    """What ``--chain K`` submits, as comment lines (``--dry-run`` prints them after the launcher)."""
    out = [f"# --chain {l.chain}: {chain_path(l).name} (or --submit) submits {l.path.name} {l.chain} times:"]
    for i in range(1, l.chain + 1):
        dep = f" --dependency=afterany:<job {i - 1}>" if i > 1 else ""
        out.append(f"#   job {i}: sbatch --parsable{dep} {l.path.name}")
    return "\n".join(out)


def render_chain(l: Launcher) -> str:
    return templating.render("shipyard.launch", "chain.sh.j2", trim_blocks=True, l=l, version=__version__,
                             sandbox=slurm.is_sandbox(target(l)), script=str(chain_path(l)))


def write_chain(l: Launcher) -> Path:
    """Write ``launch/<name>.chain.sh`` atomically (mode 0755)."""
    return atomic_write(chain_path(l), render_chain(l), mode=0o755)
