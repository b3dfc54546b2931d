"""The sandbox's plan: the registry's ``clusters.sandbox`` shape plus the site facts (shipyard/data/sandbox.yaml),
as pure data; and the pure renderers of its config files (slurm.conf, gres.conf, hosts, resolv.conf, env.sh)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from pathlib import Path

from shipyard import facts as data
from shipyard import templating
from shipyard.errors import ShipyardError

CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "srun", "sinfo", "scancel", "salloc")


# ------------------------------------------------------------------------------------------------ facts and plan


def facts() -> dict:
    """The sandbox's site facts (shipyard/data/sandbox.yaml)."""
    return data.load("sandbox")


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
    cred_expire_s: int
    scheduler_parameters: str
    prefix_len: int
    bridge: str
    host_link: str
    host_ip: str

    conf = property(lambda self: self.root / "etc" / "slurm.conf")
    gres = property(lambda self: self.root / "etc" / "gres.conf")
    hosts = property(lambda self: self.root / "etc" / "hosts")
    resolv = property(lambda self: self.root / "etc" / "resolv.conf")
    env_sh = property(lambda self: self.root / "env.sh")
    state_file = property(lambda self: self.root / "state.json")
    munge_dir = property(lambda self: self.root / "run" / "munge")
    munge_socket = property(lambda self: self.root / "run" / "munge" / "munge.socket")
    log_dir = property(lambda self: self.root / "log")
    # One path, a different folder on every node: the node's holder binds nodes/<name> onto it. The same path for
    # every sandbox (an empty folder on the host), so enroot's drop-in and pyxis's runtime_path name no sandbox.
    node_local = property(lambda self: Path(facts()["runtimes"]["node_local"]))

    def node_dir(self, name: str) -> Path:
        return self.root / facts()["runtimes"]["nodes_dir"] / name

    def log(self, daemon: str) -> Path:
        return self.log_dir / f"{daemon}.log"


def make_plan(directory, nodes: int | None = None, gpus_per_node: int | None = None, *, cluster) -> Plan:
    """Combine the registry's sandbox cluster (``clusters.sandbox``; ``nodes`` and ``gpus_per_node`` override its
    shape) with the site facts."""
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
        cred_expire_s=int(f["cred_expire_s"]),
        scheduler_parameters=str(f["scheduler_parameters"]),
        prefix_len=int(net["prefix_len"]),
        bridge=net["bridge"],
        host_link=str(net["host"]["link"]),
        host_ip=str(net["host"]["ip"]),
    )


# ------------------------------------------------------------------------------------------------ rendering (pure)


def render(template: str, **context) -> str:
    """Render ``shipyard/sandbox/templates/<template>`` with StrictUndefined (a missing fact is an error)."""
    return templating.render("shipyard.sandbox", template, trim_blocks=True, **context)


def render_configs(plan: Plan) -> dict[str, str]:
    """slurm.conf, gres.conf and the namespaces' hosts and resolv.conf, keyed by file name."""
    return {
        "slurm.conf": render("slurm.conf.j2", p=plan),
        "gres.conf": render("gres.conf.j2", p=plan),
        "hosts": render("hosts.j2", p=plan),
        "resolv.conf": render("resolv.conf.j2", p=plan),
    }


def render_env_sh(plan: Plan, netns: str, python_bin: str, host_access: bool = True) -> str:
    """The env file to source: SLURM_CONF, and one shell function per Slurm client that puts this Python first on
    the job's PATH. With ``host_access`` (the host is on the sandbox's network) the clients run as they are, for any
    user; without it they enter the controller's namespace ``netns``, which only root can."""
    return render("env.sh.j2", p=plan, netns=netns, python_bin=python_bin, clients=CLIENTS, host_access=host_access,
                  apptainer_bin=f"{facts()['runtimes']['apptainer']['prefix']}/bin")


def network(plan: Plan) -> ipaddress.IPv4Network:
    """The sandbox's network (controller, nodes and the host's leg)."""
    return ipaddress.ip_network(f"{plan.controller.ip}/{plan.prefix_len}", strict=False)


def shifted(plan: Plan, n: int) -> Plan:
    """The plan on the ``n``-th /24 after the data's network (the same host numbers, the host's link named with
    ``n``): what a second sandbox on this machine runs on, so that each can give the host its own leg."""
    if n == 0:
        return plan
    step = n * (1 << (32 - plan.prefix_len))
    move = lambda ip: str(ipaddress.ip_address(ip) + step)  # noqa: E731
    return replace(plan, controller=Host(plan.controller.name, move(plan.controller.ip)),
                   nodes=tuple(Host(h.name, move(h.ip)) for h in plan.nodes), host_ip=move(plan.host_ip),
                   host_link=f"{plan.host_link.rstrip('0123456789')}{n}")


def host_overlap(plan: Plan, addresses: list[str], routes: list[str]) -> str | None:
    """What on the host already claims the sandbox's network (an address or a route into it, the default route
    aside), or None. ``addresses``: ``ip -o -4 addr`` lines; ``routes``: ``ip -o -4 route`` lines."""
    net = network(plan)
    for line in addresses:
        words = line.split()
        if "inet" in words:
            iface = ipaddress.ip_interface(words[words.index("inet") + 1])
            if iface.network.overlaps(net):
                return f"address {iface} on {words[1]}"
    for line in routes:
        dest = line.split()[0] if line.split() else "default"
        if dest == "default":
            continue
        try:
            if ipaddress.ip_network(dest, strict=False).overlaps(net):
                return f"route {line.strip()}"
        except ValueError:
            continue
    return None


