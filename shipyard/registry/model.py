"""The one model every renderer reads: resolved environments, clusters and registries.

``registry.load()`` turns registry.yaml into these frozen dataclasses. Definitions, Dockerfiles, launchers, build
manifests and checks all read the same objects, so a fact (a pin, a bind, a partition) lives in exactly one place.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping

from packaging.version import InvalidVersion, Version

from shipyard.errors import ShipyardError, pick


@functools.lru_cache(maxsize=4096)
def vtuple(version: str) -> Version:
    """A version to compare and sort by, with PEP 440's rules (packaging): '1.29' == '1.29.0' < '1.29.1', and
    '2.3.0rc1' < '2.3.0'. A string packaging cannot read ('470.57.02-1ubuntu') compares by its numeric parts, the
    others as 0 (only used on validated versions).

    Cached: the checks compare the same few dozen versions of the data over and over (about 1,700 parses per
    `invoke check`), and a Version is immutable."""
    try:
        return Version(str(version))
    except InvalidVersion:
        nums = [str(int(p)) if p.isdigit() else "0" for p in re.split(r"[.+-]", str(version)) if p != ""]
        return Version(".".join(nums) or "0")


# Where a resolved value came from; `invoke show` prints it next to each pin.
EXPLICIT = "explicit"
DEFAULT = "default"
COMPAT = "compat data"


@dataclass(frozen=True)
class Pin:
    """A resolved value and where it came from (explicit, inherited from ENV, default, compat data)."""

    value: str | None
    source: str


@dataclass(frozen=True)
class FileCopy:
    src: str
    dst: str


@dataclass(frozen=True)
class NcclTests:
    """nccl-tests built into the image (registry.yaml ``nccl_tests:``; facts in shipyard/data/nccl_tests.yaml)."""

    version: str
    url: str  # the pinned upstream release, or the registry's override (a mirror, a local file): same sha256
    sha256: str
    commit: str
    mpi: str  # openmpi | none
    compiler: str  # "cuda-image" (/usr/local/cuda of a devel base) | "pip" (pip's CUDA compiler wheels)
    source: str = EXPLICIT


@dataclass(frozen=True)
class Environment:
    """A fully resolved environment: every pin the definition will carry, and nothing else."""

    name: str
    torch: Pin
    cuda: Pin  # CUDA variant of the wheel, MAJOR.MINOR
    python: Pin
    os: Pin
    nccl: Pin
    torchvision: Pin  # value None: left out
    torchaudio: Pin  # value None: left out / not published
    cudnn: Pin  # what the torch wheel brings (informational)
    base: Pin  # the image the definition bootstraps from
    torch_index: Pin  # pip index for torch; value None means PyPI
    nccl_default: str | None  # what the torch wheel pins (None if unknown)
    nccl_package: str | None  # nvidia-nccl-cuXX wheel name when NCCL is a pip package
    cuda_image_flavor: str
    cuda_image_cudnn: bool
    base_is_cuda_image: bool
    system_python: str | None  # the OS image's own python3 version
    stack: str = "shipyard"  # shipyard: we install python+torch; base: the base image carries them, %test verifies
    pip: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    files: tuple[FileCopy, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    build_args: tuple[tuple[str, str], ...] = ()
    clusters: tuple[str, ...] | None = None  # None: checked against every cluster
    fabrics: tuple[str, ...] = ()  # fast-fabric userspace the image carries: "ib", "efa" (see fabrics_source)
    fabrics_source: str = ""  # explicit, or which clusters it was derived from
    efa_installer: str | None = None  # the EFA installer version the image installs (from its EFA clusters)
    efa_installer_sha256: str | None = None  # its tarball's sha256 as a cluster gives it (else shipyard's data)
    description: str = ""
    extends_chain: tuple[str, ...] = ()
    line: int | None = None  # line in registry.yaml where the environment starts
    nccl_tests: NcclTests | None = None  # None: the image carries no nccl-tests

    @property
    def nccl_override(self) -> bool:
        """True when the requested NCCL differs from the one the torch wheel pins (needs a visible override)."""
        return self.nccl_default is not None and self.nccl.value != self.nccl_default

    @property
    def cuda_variant(self) -> str:
        """The wheel tag, e.g. ``cu121``."""
        return "cu" + (self.cuda.value or "").replace(".", "")

    def pins(self) -> dict[str, Pin]:
        """The pins in a stable order, for `show`, labels and manifests."""
        return {
            "torch": self.torch,
            "cuda": self.cuda,
            "python": self.python,
            "os": self.os,
            "nccl": self.nccl,
            "torchvision": self.torchvision,
            "torchaudio": self.torchaudio,
            "cudnn": self.cudnn,
            "base": self.base,
            "torch_index": self.torch_index,
        }

    def spec(self) -> dict:
        """The resolved spec as plain data (no provenance of where values came from: only what is built)."""
        return {
            "name": self.name,
            "pins": {k: p.value for k, p in self.pins().items()},
            "nccl_package": self.nccl_package,
            "cuda_image": {"flavor": self.cuda_image_flavor, "cudnn": self.cuda_image_cudnn},
            "stack": self.stack,
            "pip": list(self.pip),
            "apt": list(self.apt),
            "env": [list(kv) for kv in self.env],
            "files": [asdict(f) for f in self.files],
            "labels": [list(kv) for kv in self.labels],
            "build_args": [list(kv) for kv in self.build_args],
        } | ({"fabrics": list(self.fabrics), "efa_installer": self.efa_installer} if self.fabrics else {}) | (
            {"efa_installer_sha256": self.efa_installer_sha256} if self.efa_installer_sha256 else {}) | (
            {"nccl_tests": {"version": self.nccl_tests.version, "sha256": self.nccl_tests.sha256,
                            "mpi": self.nccl_tests.mpi, "compiler": self.nccl_tests.compiler}}
            if self.nccl_tests else {})

    @property
    def spec_hash(self) -> str:
        """sha256 of the canonical JSON of :meth:`spec`: the provenance label and part of the build cache key."""
        blob = json.dumps(self.spec(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class Gpu:
    model: str
    arch: str  # "sm_90"

    @property
    def sm(self) -> int:
        return int(self.arch.removeprefix("sm_"))


@dataclass(frozen=True)
class Partition:
    """One Slurm partition's nodes: what a job on it can ask for. Every field is resolved: a value the partition
    does not set is the cluster's (so a registry that lists partitions by name only keeps its meaning).

    Why per partition: real clusters mix node types (a ParallelCluster's c5 CPU queue, g5 A10 queue and p5 H100
    queue); one set of cluster-wide facts made a g5 job ask for the p5 queue's CPUs and EFA settings."""

    name: str
    gpus_per_node: int
    gpus: tuple[Gpu, ...] = ()
    cpus_per_node: int | None = None
    mem_per_node_mb: int | None = None  # what Slurm can schedule on one node (RealMemory), MB
    fabric: str = "socket"
    max_time: str | None = None  # Slurm [D-]HH[:MM[:SS]]
    instance_type: str | None = None
    exclusive: bool = False  # jobs get whole nodes (ParallelCluster's JobExclusiveAllocation)
    line_rate_gbps: float | None = None
    mig: str | None = None  # the MIG profile of the partition's GPUs (1g.10gb, ...); None: whole GPUs
    own: frozenset[str] = frozenset()  # the fields set in the partition's own entry (for keys in messages)


@dataclass(frozen=True)
class Remote:
    """A cluster reached from a workstation over ssh (``clusters.NAME.remote``, docs/remote.md)."""

    root: str  # directory on the cluster that holds synced projects: ROOT/<project directory name>
    prelude: str = ""  # shell lines run before every remote command, as the registry's owner wrote them
    invoke: str | None = None  # how shipyard runs there (None: shipyard/data/remote.yaml's default)


@dataclass(frozen=True)
class Cluster:
    """A cluster profile: scheduler defaults, hardware, fabric, container runtime and site specifics."""

    name: str
    runtime: str  # apptainer | pyxis | charliecloud | host
    fabric: str  # ib | efa | socket
    gpus_per_node: int
    partition: str
    partitions: tuple[str, ...]
    interactive_partition: str
    build_partition: str
    account: str | None = None
    time: str | None = None
    build_time: str | None = None
    build_cpus: int | None = None
    build_mem: str | None = None
    cpus_per_node: int | None = None
    nodes: int | None = None
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    modules: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()
    storage: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    fabric_options: Mapping[str, object] = field(default_factory=dict)
    instance_type: str | None = None
    login: str | None = None  # ssh destination of a login node (ProxyJump for `invoke shell`)
    remote: Remote | None = None  # submit over ssh through `login` (shipyard/remote/)
    host_requirements: tuple[str, ...] = ()
    description: str = ""
    line: int | None = None
    partition_facts: Mapping[str, Partition] = field(default_factory=dict)  # name -> resolved facts
    mem_per_node_mb: int | None = None
    exclusive: bool = False
    max_array_size: int | None = None  # scheduler.max_array_size (None: ask scontrol show config)
    mpi: str | None = None  # srun --mpi plugin for nccl-test (None: shipyard/data/launch.yaml's default)
    local_sandbox: bool = False  # the profile of this machine's Slurm sandbox (`invoke sandbox.up`), whatever its name
    gpu_injection: str | None = None  # how the site injects GPU libraries into ch-run containers (None: it does not)
    mig: str | None = None  # the chosen partition's MIG profile (set by on(); None: whole GPUs)

    @property
    def host_injection(self) -> Mapping[str, object] | None:
        """fabric_options.host_injection: the runtime brings the host's fabric libraries (None: it does not)."""
        v = self.fabric_options.get("host_injection")
        return v if isinstance(v, Mapping) else None

    @property
    def line_rate_gbps(self) -> float | None:
        v = self.fabric_options.get("line_rate_gbps")
        return float(v) if v is not None else None

    def partition_info(self, name: str | None = None) -> Partition:
        """The resolved facts of partition ``name`` (default: scheduler.partition); cluster-wide values where the
        partition sets none."""
        name = name or self.partition
        got = self.partition_facts.get(name)
        if got is not None:
            return got
        return Partition(name, self.gpus_per_node, self.gpus, self.cpus_per_node, self.mem_per_node_mb,
                         self.fabric, None, self.instance_type, self.exclusive, self.line_rate_gbps)

    def on(self, name: str | None = None) -> Cluster:
        """This cluster as seen by a job on partition ``name``: its GPUs, CPUs, memory, fabric, instance type and
        line rate replace the cluster-wide ones, and it is the default partition. Every consumer (check, launch,
        shell, doctor, build --slurm) reads a cluster through this, so none needs to know about partitions."""
        p = self.partition_info(name)
        opts = dict(self.fabric_options)
        if p.line_rate_gbps is not None:
            opts["line_rate_gbps"] = p.line_rate_gbps
        return replace(self, partition=p.name, gpus_per_node=p.gpus_per_node, gpus=p.gpus,
                       cpus_per_node=p.cpus_per_node, mem_per_node_mb=p.mem_per_node_mb, fabric=p.fabric,
                       instance_type=p.instance_type, exclusive=p.exclusive, fabric_options=opts, mig=p.mig)

    def key(self, field_name: str, partition: str | None = None) -> str:
        """The registry key a fact was written under: the partition's own entry if it sets it, else the cluster's."""
        p = self.partition_facts.get(partition or self.partition)
        if p is not None and field_name in p.own:
            return f"clusters.{self.name}.scheduler.partitions.{p.name}.{field_name}"
        return f"clusters.{self.name}.{field_name}"


@dataclass(frozen=True)
class RegistryTarget:
    """A named OCI/docker registry (``oras://host/repo`` for SIF artifacts, ``docker://host/repo`` for images)."""

    name: str
    uri: str
    insecure: bool = False
    require_signed: bool = False

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def host(self) -> str:
        return self.uri.split("://", 1)[1].split("/", 1)[0]

    @property
    def repository(self) -> str:
        rest = self.uri.split("://", 1)[1]
        return rest.split("/", 1)[1] if "/" in rest else ""


@dataclass(frozen=True)
class BaseMirror:
    """registry.yaml's ``base_mirror``: a registry that serves the base images (a pull-through proxy, an air-gapped
    copy), so builds never reach the registry a base reference names."""

    url: str  # HOST[:PORT][/PREFIX], no scheme
    insecure_http: bool = False  # pull over plain HTTP: said explicitly, never a fallback

    @property
    def host(self) -> str:
        return self.url.split("/", 1)[0]

    def rewrite(self, reference: str) -> str:
        """``reference`` as the mirror serves it: ``URL/`` in front, tag and digest kept. A one-component name
        (``debian:12``) is a Docker Hub official image, which registries serve under ``library/``; a reference that
        names a registry host keeps that host as its first path component, so one mirror can keep several upstream
        registries apart."""
        path = reference if "/" in reference else f"library/{reference}"
        return f"{self.url}/{path}"


@dataclass(frozen=True)
class AptSnapshot:
    """registry.yaml's ``apt_snapshot``: a dated snapshot mirror of the OS's apt archive, so a rebuild installs the
    Debian/Ubuntu packages of that day, not today's (shipyard/data/apt.yaml: the archives and suites per OS)."""

    date: str  # YYYYMMDDTHHMMSSZ
    url: str | None = None  # a site's mirror, http(s)://HOST[:PORT][/PATH] (URL/ARCHIVE/DATE); None: the OS's own


@dataclass(frozen=True)
class Registry:
    """Everything registry.yaml says, resolved."""

    path: Path
    environments: Mapping[str, Environment]
    clusters: Mapping[str, Cluster]
    registries: Mapping[str, RegistryTarget]
    default_environment: str | None
    default_cluster: str | None
    default_registry: str | None
    base_mirror: BaseMirror | None = None  # None: bases are pulled from the registry their reference names
    apt_snapshot: AptSnapshot | None = None  # None: apt reads the base OS's own sources

    def base_reference(self, env: Environment) -> str:
        """The base image ``env``'s definitions bootstrap from: its own reference, or the mirror's copy of it."""
        base = env.base.value or ""
        return self.base_mirror.rewrite(base) if self.base_mirror and base else base

    @functools.cached_property
    def root(self) -> Path:
        """The project directory: definitions/, containers/ and launch/ live beside registry.yaml (resolved once: a
        command asks for it dozens of times)."""
        return self.path.resolve().parent

    def environment(self, name: str | None = None) -> Environment:
        return pick(self.environments, name or self.default_environment, "environment", self.path)

    def cluster(self, name: str | None = None) -> Cluster:
        return pick(self.clusters, name or self.default_cluster, "cluster", self.path)

    def sandbox_cluster(self) -> Cluster:
        """The profile with ``local_sandbox: true``: the shape of the machine's Slurm sandbox (the loader allows at
        most one)."""
        for cluster in self.clusters.values():
            if cluster.local_sandbox:
                return cluster
        raise ShipyardError(f"{self.path}: no cluster has local_sandbox: true (the profile `invoke sandbox.up` and "
                            "`invoke demo` run on; the repository's registry.yaml has one to copy)")

    def registry_target(self, name: str | None = None) -> RegistryTarget:
        return pick(self.registries, name or self.default_registry, "registry", self.path)
