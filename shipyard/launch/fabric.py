"""NCCL presets per cluster fabric (efa / ib / socket), read from shipyard/data/launch.yaml.

Why a data file and not code: which variables a fabric needs changes with aws-ofi-nccl and libfabric releases
(launcher-rules.md rule 9). Keeping them as data lets a site update them without touching the renderer, and keeps the
"what NOT to set" list beside what to set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shipyard import facts as data
from shipyard import nccl_transport
from shipyard.errors import ShipyardError
from shipyard.escaping import shell_quote
from shipyard.registry import compat, fabric_checks
from shipyard.registry.model import Cluster, Environment


def launch_data() -> dict:
    """shipyard/data/launch.yaml, parsed once."""
    return data.load("launch")


@dataclass(frozen=True)
class EnvVar:
    """One variable the launcher exports. ``expand``: the value is a shell word expanded on the node."""

    name: str
    value: str
    expand: bool = False
    origin: str = ""  # "fabric efa", "cluster grete", "--env": printed in the launcher as a comment
    # A path list put IN FRONT of the image's value inside the container (never exported from the host, where the
    # runtime would let it replace the image's value): launch.yaml's prepend_in_container, from host_injection.
    prepend: bool = False


def prepend_exports(env: Sequence[EnvVar]) -> list[str]:
    """The shell that puts each ``prepend`` variable of ``env`` in front of the container's own value (run inside
    it): launchers and `invoke shell --command` use the same lines."""
    return [f'export {v.name}={shell_quote(v.value)}"${{{v.name}:+:${v.name}}}"' for v in env if v.prepend]


def aws_ofi_nccl_version(cluster: Cluster) -> str | None:
    """The cluster's aws-ofi-nccl: given directly, or implied by its EFA installer in the compatibility data."""
    return fabric_checks.aws_ofi_nccl(cluster)


def fabric_env(cluster: Cluster, env: Environment | None = None) -> list[EnvVar]:
    """The NCCL variables for the cluster's fabric, the host injection's, then the cluster profile's own ``env``
    (which wins). A plugin path (NCCL_*_PLUGIN) is exported only when the image carries the fabric userspace or a
    host-injection bind holds it: a path the container lacks makes NCCL fail or warn on every rank. Path lists of
    the host injection (launch.yaml's prepend_in_container) are marked ``prepend``: they go in front of the image's
    value inside the container, never replace it."""
    data = launch_data()["fabrics"]
    if cluster.fabric not in data:
        raise ShipyardError(f"clusters.{cluster.name}.fabric: no NCCL preset for {cluster.fabric!r} "
                            f"(valid: {', '.join(data)})")
    preset = data[cluster.fabric]
    origin = f"fabric {cluster.fabric}"
    out: dict[str, EnvVar] = {}
    for k, v in (preset.get("env") or {}).items():
        out[k] = EnvVar(k, str(v), False, origin)
    for k, v in (preset.get("expand") or {}).items():
        out[k] = EnvVar(k, str(v), True, origin)
    ofi = aws_ofi_nccl_version(cluster)
    for cond in preset.get("when_aws_ofi_nccl_below") or ():
        if ofi is not None and compat.vtuple(ofi) < compat.vtuple(cond["version"]):
            for k, v in cond["env"].items():
                out[k] = EnvVar(k, str(v), False, f"{origin}, aws-ofi-nccl {ofi} < {cond['version']}")
    if env is not None and not fabric_checks.image_carries_fabric(env, cluster):
        # a plugin file is there only when the image has it or a host-injection bind brings it
        binds = [str(b).rstrip("/") + "/" for b in ((cluster.host_injection or {}).get("binds") or ())]
        for name in fabric_checks.plugin_paths(cluster):
            if name in out and not any(out[name].value.startswith(b) for b in binds):
                out.pop(name)
    for v in host_injection_env(cluster):
        out[v.name] = v
    hca = cluster.fabric_options.get("ib_hca")
    if hca:
        out["NCCL_IB_HCA"] = EnvVar("NCCL_IB_HCA", str(hca), False, f"clusters.{cluster.name}.fabric_options.ib_hca")
    for k, v in cluster.env:
        out[k] = EnvVar(k, v, False, f"clusters.{cluster.name}.env")
    check_forbidden(cluster, out, f"clusters.{cluster.name}.env")
    return list(out.values())


def transport_pin(cluster: Cluster) -> EnvVar | None:
    """``NCCL_NET`` naming the network the cluster's fabric must use (shipyard/data/launch.yaml ``net_pin``): NCCL
    then fails at its first communicator when that network is missing, instead of falling back to sockets. For EFA
    the name is the one the cluster's aws-ofi-nccl answers to (given, or implied by its EFA installer)."""
    pin = (launch_data().get("net_pin") or {}).get(cluster.fabric)
    if not pin:
        return None
    name, why = pin["name"], f"fabric {cluster.fabric}: pinned transport"
    if "unknown" in pin:
        ofi = aws_ofi_nccl_version(cluster)
        if ofi is None:
            name, why = pin["unknown"], f"{why}, {pin['plugin']} version unknown: the name every release answers to"
        else:
            for rule in pin.get("below") or ():
                if compat.vtuple(ofi) < compat.vtuple(rule["version"]):
                    name = rule["name"]
                    break
            why = f"{why}, the name {pin['plugin']} {ofi} answers to"
    return EnvVar("NCCL_NET", str(name), False, why)


def fallback_allowed(cluster: Cluster, flag: bool) -> str:
    """Who turned the pinned transport off ("" when nobody did): the launch flag or the cluster profile."""
    if flag:
        return "--allow-transport-fallback"
    if cluster.fabric_options.get("allow_transport_fallback"):
        return f"clusters.{cluster.name}.fabric_options.allow_transport_fallback"
    return ""


def pin_hint(cluster: Cluster, value: str) -> dict | None:
    """The failure hint for a pinned network NCCL did not find: NCCL's own error names no fabric and no library."""
    hint = ((launch_data().get("net_pin") or {}).get("hint") or {}).get(cluster.fabric)
    if not hint:
        return None
    return {"match": "Failed to initialize any NET plugin",
            "hint": f"NCCL_NET={value} pins the network of fabric {cluster.fabric} and NCCL found none of that name: "
                    f"{' '.join(hint.split())}. Fix the image or the site injection; --allow-transport-fallback lets "
                    "NCCL fall back to sockets (slow)"}


def host_injection_env(cluster: Cluster) -> list[EnvVar]:
    """fabric_options.host_injection's variables; its path lists (launch.yaml's prepend_in_container) marked
    ``prepend``. Launchers and modules both take them from here, so both prepend the same variables."""
    prepend = set(launch_data().get("prepend_in_container") or ())
    return [EnvVar(str(k), str(v), False, f"clusters.{cluster.name}.fabric_options.host_injection",
                   prepend=k in prepend)
            for k, v in ((cluster.host_injection or {}).get("env") or {}).items()]


def module_env(cluster: Cluster) -> list[EnvVar]:
    """What `invoke modules` sets: the host injection's variables, then the cluster profile's ``env``, which wins
    over one of the same name as in :func:`fabric_env` (then it is set, not prepended)."""
    out = {v.name: v for v in host_injection_env(cluster)}
    for k, v in cluster.env:
        out[k] = EnvVar(k, v, False, f"clusters.{cluster.name}.env")
    return list(out.values())


def check_forbidden(cluster: Cluster, names, where: str) -> None:
    """Refuse variables the fabric must never have (rule 9: never set RDMAV_FORK_SAFE on EFA)."""
    never = launch_data()["fabrics"][cluster.fabric].get("never") or ()
    for name in names:
        if name in never:
            raise ShipyardError(f"{where}: {name} must not be set on a {cluster.fabric} fabric "
                                f"(docs/launcher-rules.md rule 9); remove it")


def expected_transport(fabric: str) -> str:
    """The end-of-job check of the transport NCCL selected, as the awk program the launcher runs over its log.

    The rules are shipyard/nccl_transport.py's (the same as `invoke nccl-report`), not a second copy here."""
    return nccl_transport.awk_program(fabric)
