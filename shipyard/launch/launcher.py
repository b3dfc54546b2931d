"""Slurm launchers for PyTorch training: one model (:class:`Launcher`), one template per file, three runtimes.

``build()`` resolves the registry (default environment, cluster, its runtime, partition and GPUs) plus the user's
flags into a frozen :class:`Launcher`; ``render()`` is a pure function of that model to the text of
``launch/<name>.sbatch``. ``invoke nccl-test`` renders from the same model with ``kind="nccl-test"``, so the
runtime, mounts, NCCL environment and header are the same code path for both.

Why Jinja2 templates under shipyard/templates/launch/: the scripts are mostly shell, and reading them as shell (with
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

from shipyard import __version__, registry, slurm, templating
from shipyard.cli import argv_after_dashdash
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_join
from shipyard.files import atomic_write
from shipyard.launch.fabric import (
    EnvVar,
    check_forbidden,
    expected_transport,
    fabric_env,
    launch_data,
)
from shipyard.registry.model import Cluster, Registry

RUNTIMES = ("pyxis", "apptainer", "host")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIME = re.compile(r"^([0-9]+-)?[0-9]+(:[0-9]{2}){0,2}$")


# ------------------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Mount:
    """A host path made visible in the container: ``src`` on the node, ``dst`` inside, read-only or not."""

    src: str
    dst: str
    ro: bool = False

    def pyxis(self) -> str:
        return f"{self.src}:{self.dst}" + (":ro" if self.ro else "")

    def apptainer(self) -> str:
        return f"{self.src}:{self.dst}" + (":ro" if self.ro else "")


@dataclass(frozen=True)
class Launcher:
    """Everything a launcher script says. Built by :func:`build`; rendered by :func:`render`."""

    name: str
    kind: str  # "torchrun" | "nccl-test"
    environment: str
    cluster: str
    runtime: str  # pyxis | apptainer | host
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
        return Path(self.root) / "launch" / f"{self.name}.sbatch"

    @property
    def log_dir(self) -> str:
        return str(Path(self.root) / "launch" / "logs")

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


# ------------------------------------------------------------------------------------------------ parsing flags


def parse_mounts(text: str | Sequence[str] | None, root: Path, flag: str = "--mounts") -> tuple[Mount, ...]:
    """``SRC:DST[:ro|rw],...`` (or ``SRC`` alone: same path inside) -> mounts; a relative SRC is under the project."""
    if not text:
        return ()
    items = text.split(",") if isinstance(text, str) else [i for t in text for i in t.split(",")]
    out = []
    for item in items:
        parts = item.split(":")
        if not item or len(parts) > 3 or not parts[0]:
            raise ShipyardError(f"{flag} {item!r}: expected SRC:DST[:ro], comma-separated (e.g. /data:/data:ro)")
        src = parts[0]
        dst = parts[1] if len(parts) > 1 and parts[1] else src
        flags = parts[2] if len(parts) > 2 else "rw"
        if flags not in ("ro", "rw"):
            raise ShipyardError(f"{flag} {item!r}: mount flag {flags!r} is not valid (valid: ro, rw)")
        if not dst.startswith("/"):
            raise ShipyardError(f"{flag} {item!r}: the destination {dst!r} must be an absolute path")
        if not src.startswith("/"):
            src = str((root / src).resolve())
        for p in (src, dst):
            if any(c.isspace() or not c.isprintable() for c in p):
                raise ShipyardError(f"{flag} {item!r}: paths with spaces or control characters cannot be mounted "
                                    "by pyxis or apptainer")
        out.append(Mount(src, dst, flags == "ro"))
    return tuple(out)


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


def _positive(value, flag: str, minimum: int = 1) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ShipyardError(f"{flag} {value!r}: expected an integer >= {minimum}") from None
    if n < minimum:
        raise ShipyardError(f"{flag} {value}: must be at least {minimum}")
    return n


# ------------------------------------------------------------------------------------------------ build


def _default_image(reg: Registry, env_name: str, cluster: Cluster, runtime: str) -> str:
    """``<cluster.storage>/<env>.sqsh`` for pyxis, ``.sif`` for apptainer (a relative storage is under the project)."""
    if not cluster.storage:
        raise ShipyardError(f"clusters.{cluster.name}.storage is not set: give --image (a path or registry image) "
                            f"for the {runtime} runtime")
    storage = Path(cluster.storage)
    if not storage.is_absolute():
        storage = reg.root / storage
    return str(storage / f"{env_name}.{'sqsh' if runtime == 'pyxis' else 'sif'}")


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
    defaults = launch_data()["defaults"]
    env_obj = reg.environment(environment)
    cl = reg.cluster(cluster)
    runtime = runtime or cl.runtime
    if runtime not in RUNTIMES:
        raise ShipyardError(f"--runtime {runtime!r}: unknown runtime (valid: {', '.join(RUNTIMES)})")
    partition = partition or cl.partition
    if partition not in cl.partitions:
        raise ShipyardError(f"--partition {partition!r}: not a partition of cluster {cl.name} "
                            f"(valid: {', '.join(cl.partitions)})")
    n = _positive(nodes if nodes is not None else 1, "--nodes")
    if cl.nodes is not None and n > cl.nodes:
        raise ShipyardError(f"--nodes {n}: cluster {cl.name} has {cl.nodes} nodes (clusters.{cl.name}.nodes)")
    g = _positive(gpus_per_node if gpus_per_node is not None else cl.gpus_per_node, "--gpus-per-node", 0)
    if g > cl.gpus_per_node:
        raise ShipyardError(f"--gpus-per-node {g}: cluster {cl.name} has {cl.gpus_per_node} GPUs per node "
                            f"(clusters.{cl.name}.gpus_per_node)")
    if kind == "nccl-test" and g < 1:
        raise ShipyardError(f"--gpus-per-node {g}: nccl-test runs one rank per GPU and needs at least 1")
    time = time or cl.time
    if time is not None and not _TIME.match(time):
        raise ShipyardError(f"--time {time!r}: expected Slurm time [D-]HH[:MM[:SS]], e.g. 02:00:00")
    name = name or (defaults["name"] if kind == "torchrun" else "nccl-test")
    if not _NAME.match(name):
        raise ShipyardError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it names "
                            "launch/<name>.sbatch and the job)")
    account = account or cl.account
    if account is not None and not _NAME.match(account):
        raise ShipyardError(f"--account {account!r}: use letters, digits, '.', '_' and '-' (it goes into an "
                            "#SBATCH line)")
    if any(c.isspace() or not c.isprintable() or c in "%#" for c in str(reg.root)):
        raise ShipyardError(f"{reg.root}: the project directory's path has spaces, control characters, '%' or '#'; "
                            "#SBATCH --output cannot name a log there (move the project)")
    if kind == "torchrun" and not command:
        raise ShipyardError("no training command: put the script and its arguments after `--`, e.g. "
                            "invoke launch --nodes 2 -- examples/train.py --epochs 3")

    user_mounts = parse_mounts(mounts, reg.root)
    if slurm.is_sandbox(cl):
        for m in user_mounts:
            if not Path(m.src).exists():
                raise ShipyardError(f"--mounts: source {m.src} does not exist on the sandbox (it runs on this "
                                    "machine; create it or fix the path)")
    site_mounts = parse_mounts(list(cl.binds), reg.root, f"clusters.{cl.name}.binds")
    project = Mount(str(reg.root), str(reg.root))
    all_mounts: dict[str, Mount] = {}
    for m in (project, *site_mounts, *user_mounts):  # a later mount of the same destination wins
        all_mounts[m.dst] = m

    user_env = parse_env(env)
    check_forbidden(cl, [k for k, _ in user_env], "--env")
    variables: dict[str, EnvVar] = {v.name: v for v in fabric_env(cl)}
    debug = launch_data()["nccl_debug"]["full" if nccl_debug else "default"]
    for k, v in debug.items():
        variables[k] = EnvVar(k, str(v), False, "--nccl-debug" if nccl_debug else "NCCL transport line")
    for k, v in user_env:
        variables[k] = EnvVar(k, v, False, "--env")

    if runtime == "host":
        img = None
        if image:
            raise ShipyardError("--image: the host runtime runs without a container; drop --image or pick "
                                "--runtime pyxis|apptainer")
    else:
        img = image or _default_image(reg, env_obj.name, cl, runtime)

    k_chain = _positive(chain if chain is not None else 1, "--chain")
    restarts = _positive(max_restarts if max_restarts is not None else defaults["max_restarts"],
                         "--max-restarts", 0)
    sig_before = signal_before
    if sig_before is None and (requeue or k_chain > 1):
        sig_before = defaults["signal_before"]
    sig_before = None if sig_before is None else _positive(sig_before, "--signal-before")
    interval = _positive(monitor_interval if monitor_interval is not None else defaults["monitor_interval"],
                         "--monitor-interval")
    nt = launch_data()["nccl_test"]

    launcher = Launcher(
        name=name,
        kind=kind,
        environment=env_obj.name,
        cluster=cl.name,
        runtime=runtime,
        fabric=cl.fabric,
        nodes=n,
        gpus_per_node=g,
        partition=partition,
        root=str(reg.root),
        registry=str(reg.root / reg.path.name),
        command=tuple(command),
        account=account,
        time=time,
        cpus_per_task=(cl.cpus_per_node if kind == "torchrun" else None),
        image=img,
        modules=cl.modules if runtime == "apptainer" else (),
        mounts=tuple(all_mounts.values()) if runtime != "host" else (),
        env=tuple(variables.values()),
        requeue=bool(requeue),
        max_restarts=restarts if requeue else 0,
        signal=defaults["signal"],
        signal_before=sig_before,
        monitor=bool(monitor) and kind == "torchrun",
        monitor_interval=interval,
        nccl_debug=bool(nccl_debug),
        rdzv_port=int(defaults["rdzv_port"]),
        srun_wait=int(defaults["srun_wait"]),
        chain=k_chain,
        transport=expected_transport(cl.fabric),
        nccl_test_binary=nt["binary"],
        nccl_test_mpi=nt["mpi"],
        nccl_test_args=tuple(nt["args"]),
    )
    return replace(launcher, regenerate=regenerate_argv(launcher, user_mounts, user_env, image))


def regenerate_argv(l: Launcher, user_mounts, user_env, image) -> tuple[str, ...]:
    """The exact ``invoke`` command that writes this launcher again (every resolved default made explicit)."""
    task = "launch" if l.kind == "torchrun" else "nccl-test"
    argv = ["invoke", task, "--environment", l.environment, "--cluster", l.cluster, "--nodes", str(l.nodes),
            "--gpus-per-node", str(l.gpus_per_node), "--runtime", l.runtime, "--partition", l.partition,
            "--name", l.name]
    if Path(l.registry).name != "registry.yaml":
        argv += ["--registry", l.registry]
    if l.account:
        argv += ["--account", l.account]
    if l.time:
        argv += ["--time", l.time]
    if image:
        argv += ["--image", image]
    if user_mounts:
        argv += ["--mounts", ",".join(m.pyxis() for m in user_mounts)]
    for k, v in user_env:
        argv += ["--env", f"{k}={v}"]
    if l.nccl_debug:
        argv.append("--nccl-debug")
    if l.monitor:
        argv += ["--monitor", "--monitor-interval", str(l.monitor_interval)]
    if l.kind == "torchrun":
        if l.chain > 1:
            argv += ["--chain", str(l.chain)]
        if l.requeue:
            argv += ["--requeue", "--max-restarts", str(l.max_restarts)]
        if l.signal_before:
            argv += ["--signal-before", str(l.signal_before)]
        argv += ["--", *l.command]
    return tuple(argv)


# ------------------------------------------------------------------------------------------------ render


def container_argv(l: Launcher) -> list[str]:
    """What goes between ``srun <options>`` and the command on each node, per runtime (rules 6-8)."""
    names = ",".join(v.name for v in l.env)
    if l.runtime == "pyxis":
        argv = [f"--container-image={l.image}",
                f"--container-mounts={','.join(m.pyxis() for m in l.mounts)}",
                f"--container-workdir={l.root}",
                "--no-container-mount-home"]
        if names:
            argv.append(f"--container-env={names}")  # rule 6: the image's values win unless named here
        return argv
    if l.runtime == "apptainer":
        # rule 8: --nv, --bind; no --contain/--containall (no /dev/infiniband, 64 MiB tmpfs HOME and /tmp)
        return ["apptainer", "exec", "--nv", "--bind", ",".join(m.apptainer() for m in l.mounts),
                "--pwd", l.root, l.image]
    return []


def render(l: Launcher) -> str:
    """The launcher script for ``l`` (a pure function: same model, same text)."""
    return templating.render("shipyard.launch", "sbatch.sh.j2", trim_blocks=True,
        l=l,
        version=__version__,
        regenerate=shell_join(l.regenerate),
        container=container_argv(l),
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
