"""`invoke check`'s fast-fabric rules for one (environment, cluster): the image can use the cluster's fabric, and the
EFA floors from shipyard/data/compat.yaml's `efa` section (each fact there carries its source).

Why a module of its own: the fabric rules need the fabric userspace data (shipyard/data/fabrics.yaml) and the
launcher's presets; keeping them here leaves compat.py to the wheel/driver/arch rules. It reports through the
``add(severity, key, message)`` callback compat.check_on_cluster gives it, so it does not import compat (no cycle).
"""

from __future__ import annotations

import re
from typing import Callable

from shipyard import facts
from shipyard.registry.model import Cluster, Environment, vtuple

ERROR = "ERROR"
WARN = "WARN"
FAST = ("ib", "efa")


_v = vtuple  # PEP 440 comparison: an installer '1.29' is not older than '1.29.0'


def _installer(inst) -> dict | None:
    """The compatibility data of EFA installer ``inst``, whether written '1.40' or '1.40.0'."""
    installers = facts.load("compat")["efa"]["installers"]
    return next((v for k, v in installers.items() if _v(k) == _v(str(inst))), None)


def efa_installer_sha256(version: str) -> str | None:
    """The recorded sha256 of EFA installer ``version``'s tarball (shipyard/data/fabrics.yaml ``efa.sha256``, with
    its source), whether written '1.43' or '1.43.0'; None when not recorded (the build then refuses to unpack it)."""
    table = facts.load("fabrics")["efa"].get("sha256") or {}
    return next((str(v) for k, v in table.items() if _v(k) == _v(str(version))), None)


def aws_ofi_nccl(cluster: Cluster) -> str | None:
    """The cluster's aws-ofi-nccl: given directly, or the one its EFA installer bundles (compatibility data)."""
    ofi = cluster.fabric_options.get("aws_ofi_nccl")
    if ofi:
        return str(ofi)
    inst = cluster.fabric_options.get("efa_installer")
    known = _installer(inst) if inst else None
    return str(known["aws_ofi_nccl"]) if known else None


def image_has_fabric(env: Environment, cluster: Cluster) -> bool:
    """The image carries the cluster's fabric userspace, or the cluster's runtime injects the host's."""
    return cluster.host_injection is not None or image_carries_fabric(env, cluster)


def image_carries_fabric(env: Environment, cluster: Cluster) -> bool:
    """The image itself carries the cluster's fabric userspace (host injection not counted)."""
    if cluster.fabric == "efa":
        return "efa" in env.fabrics and env.efa_installer is not None
    return cluster.fabric in env.fabrics


def efa_capable(instance_type: str | None) -> bool:
    """The instance type can attach an EFA: ``efa: true`` in shipyard/data/ec2.yaml (AWS's list of the types EFA
    supports, with its source). A type the data does not mark is not known to be capable."""
    return bool((facts.load("ec2")["instances"].get(instance_type or "") or {}).get("efa"))


def efa_unused(cluster: Cluster) -> list[tuple[str, str]]:
    """(registry key, message) for each partition on sockets whose instance type supports EFA: every launcher for
    it runs NCCL over TCP, at a fraction of the instance's network, and nothing at run time says so. A fact the
    partitions inherit from the cluster is reported once, under the cluster's key."""
    out: dict[str, str] = {}
    for pname in cluster.partitions:
        part = cluster.partition_info(pname)
        if part.fabric != "socket" or not efa_capable(part.instance_type):
            continue
        key = cluster.key("fabric", pname)
        if key == f"clusters.{cluster.name}.fabric" and "instance_type" in part.own:
            key = f"clusters.{cluster.name}.scheduler.partitions.{pname}.fabric"
        where = f"partition {pname}: " if ".partitions." in key else ""
        out.setdefault(key, f"{where}{part.instance_type} supports EFA but the fabric is socket, so NCCL "
                            "runs over TCP; set fabric: efa where the nodes have EFA attached (ParallelCluster: "
                            "Efa: Enabled: true on the queue's compute resources), or confirm that TCP is meant")
    return list(out.items())


def plugin_paths(cluster: Cluster) -> list[str]:
    """Variables of the cluster's launch preset that name a plugin file inside the image (NCCL_*_PLUGIN)."""
    preset = facts.load("launch")["fabrics"].get(cluster.fabric, {})
    names = {**(preset.get("env") or {}), **(preset.get("expand") or {})}
    return [k for k, v in names.items() if k.endswith("_PLUGIN") and str(v).startswith("/")]


def check(env: Environment, cluster: Cluster, add: Callable[[str, str, str], None]) -> None:
    """Add every fabric problem of ``env`` on ``cluster`` (a no-op for socket clusters)."""
    if cluster.fabric not in FAST:
        return
    ckey = f"clusters.{cluster.name}"
    if not image_has_fabric(env, cluster):
        what = ("rdma-core's libibverbs, providers and librdmacm" if cluster.fabric == "ib"
                else "libfabric and aws-ofi-nccl from the EFA installer")
        how = ("set clusters.{c}.fabric_options.efa_installer" if cluster.fabric == "efa" and "efa" in env.fabrics
               else "add {f} to environments.{e}.fabrics (or let it target the cluster)")
        add(ERROR, f"{ckey}.fabric",
            f"{env.name} is meant for {cluster.name} ({cluster.fabric}) but its image has no {what} and the "
            f"cluster declares no fabric_options.host_injection: NCCL would silently fall back to TCP sockets; "
            + how.format(c=cluster.name, f=cluster.fabric, e=env.name))
        for var in plugin_paths(cluster):
            add(ERROR, f"{ckey}.fabric",
                f"the {cluster.fabric} launch preset exports {var}, a file the {env.name} image does not have: "
                "the launcher leaves it out until the image carries aws-ofi-nccl or the host injects it")
    if cluster.fabric == "efa":
        _efa(env, cluster, add)


def _efa(env: Environment, cluster: Cluster, add: Callable[[str, str, str], None]) -> None:
    efa = facts.load("compat")["efa"]
    ckey = f"clusters.{cluster.name}"
    nccl = env.nccl.value
    ofi = aws_ofi_nccl(cluster)
    inst = cluster.fabric_options.get("efa_installer")
    if inst and _installer(inst) is None:
        add(WARN, f"{ckey}.fabric_options.efa_installer",
            f"EFA installer {inst} is not in the compatibility data: the aws-ofi-nccl it bundles is not verified")
    if ("efa" in env.fabrics and env.efa_installer and not env.efa_installer_sha256
            and efa_installer_sha256(env.efa_installer) is None):
        add(WARN, f"{ckey}.fabric_options.efa_installer",
            f"no sha256 of EFA installer {env.efa_installer} is recorded in shipyard/data/fabrics.yaml (efa.sha256): "
            f"building {env.name} fails before unpacking it; set {ckey}.fabric_options.efa_installer_sha256 to "
            "AWS's published checksum of that tarball, or pin an installer that has one")
    if "efa" in env.fabrics and env.efa_installer and inst and _v(str(inst)) != _v(env.efa_installer):
        add(WARN, f"{ckey}.fabric_options.efa_installer",
            f"{env.name} installs EFA installer {env.efa_installer} (the newest of its EFA clusters), not {inst}")
    if ofi and nccl:
        for floor in efa["nccl_floors"]:
            if _v(ofi) >= _v(floor["aws_ofi_nccl"]):
                if _v(nccl) < _v(floor["min_nccl"]):
                    add(ERROR, f"{ckey}.fabric_options",
                        f"aws-ofi-nccl {ofi} supports NCCL >= {floor['min_nccl']}; {env.name} has NCCL {nccl} "
                        f"[{floor['source']}]")
                break
    if ofi:
        for bug in efa["plugin_bugs"]:
            if _v(bug["from"]) <= _v(ofi) < _v(bug["fixed_in"]):
                where = f" (bundled in EFA installer {inst})" if inst and not cluster.fabric_options.get("aws_ofi_nccl") else ""
                add(ERROR, f"{ckey}.fabric_options",
                    f"aws-ofi-nccl {ofi}{where} {bug['what']}; fixed in {bug['fixed_in']} [{bug['source']}]")
    itype = cluster.instance_type or ""
    for family, fl in efa["instance_floors"].items():
        if not re.match(rf"{re.escape(family)}[a-z]*\.", itype):
            continue
        scope = f"{itype} [{fl['source']}]"
        cuda = env.cuda.value
        if fl.get("min_cuda") and cuda and _v(cuda) < _v(fl["min_cuda"]):
            add(ERROR, f"{ckey}.instance_type", f"{scope} needs CUDA >= {fl['min_cuda']}; {env.name} has CUDA {cuda}")
        if nccl and _v(nccl) < _v(fl["min_nccl"]):
            add(ERROR, f"{ckey}.instance_type", f"{scope} needs NCCL >= {fl['min_nccl']} "
                f"({fl['recommended_nccl']} recommended); {env.name} has {nccl}")
        if ofi and _v(ofi) < _v(fl["min_aws_ofi_nccl"]):
            add(ERROR, f"{ckey}.fabric_options", f"{scope} needs aws-ofi-nccl >= {fl['min_aws_ofi_nccl']} "
                f"({fl['recommended_aws_ofi_nccl']} recommended); the cluster has {ofi}")
        cond = fl["installer_when_nccl"]
        if nccl and inst and _v(nccl) >= _v(cond["nccl"]) and _v(str(inst)) < _v(cond["min_installer"]):
            add(ERROR, f"{ckey}.fabric_options.efa_installer", f"{scope} with NCCL >= {cond['nccl']} needs EFA "
                f"installer >= {cond['min_installer']}; the cluster has {inst}")
