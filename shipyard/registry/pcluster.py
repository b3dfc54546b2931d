"""``invoke cluster.import-pcluster CONFIG``: a ParallelCluster 3 cluster config -> a cluster profile in registry.yaml.

Why: a ParallelCluster user already has a config that says almost everything shipyard needs (queues and their
instance types, EFA, shared storage, whether pyxis is installed); writing the profile by hand repeats it, with the
usual typos. Each Slurm queue becomes a partition with its instances' facts from ``shipyard/data/ec2.yaml`` (GPUs,
model, arch, vCPUs, schedulable memory, network rate); ``Efa.Enabled`` decides its fabric; SharedStorage mount dirs
become binds; a pyxis post-install script picks the pyxis runtime (a GPU cluster whose config does not show its
runtime needs ``--runtime``: never a silent ``host``), and :func:`review` lists what the config cannot say.

The profile is inserted as text into registry.yaml (the user's comments and layout stay as they are), the result is
loaded and validated like any registry before anything is written, the diff is shown, and the file is replaced
atomically. An instance type missing from the data file is refused by name, and nothing is written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.registry import loader

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def ec2() -> dict:
    """shipyard/data/ec2.yaml."""
    return facts.load("ec2")


def _at(lines: Mapping, fname: str, path: tuple) -> str:
    return f"{fname}:{loader._line(lines, path) or 1}"


def _instance_types(cr: dict) -> list[str]:
    """A compute resource's instance types: the ``Instances:`` list (flexible instances) or the older
    ``InstanceType:`` key."""
    if isinstance(cr.get("Instances"), list):
        return [str(i.get("InstanceType")) for i in cr["Instances"] if isinstance(i, dict)]
    if cr.get("InstanceType"):
        return [str(cr["InstanceType"])]
    return []


def _scripts(node: Any) -> list[str]:
    """Every ``Script:`` value anywhere below ``node`` (custom actions of the head node and of each queue)."""
    if isinstance(node, dict):
        out = [str(v) for k, v in node.items() if k == "Script" and isinstance(v, str)]
        for v in node.values():
            out += _scripts(v)
        return out
    if isinstance(node, list):
        return [s for v in node for s in _scripts(v)]
    return []


RUNTIMES = ("pyxis", "apptainer", "host")


def _detected_runtime(config: dict) -> str | None:
    """pyxis where a post-install script installs it (aws-samples' pyxis/enroot scripts), apptainer where one
    installs Apptainer/Singularity; None when the config does not say."""
    scripts = " ".join(_scripts(config)).lower()
    if "pyxis" in scripts or "enroot" in scripts:
        return "pyxis"
    if "apptainer" in scripts or "singularity" in scripts:
        return "apptainer"
    return None


def _runtime(config: dict, fname: str, gpu: bool, chosen: str | None) -> str:
    """``--runtime`` when given; else what the post-install scripts install; else ``host`` for a cluster without
    GPUs. A GPU cluster whose runtime the config does not show is refused: a silent ``host`` would run training
    outside any container, and `invoke check` could not tell."""
    if chosen:
        if chosen not in RUNTIMES:
            raise ShipyardError(f"--runtime {chosen!r}: use one of {', '.join(RUNTIMES)}")
        return chosen
    found = _detected_runtime(config)
    if found or not gpu:
        return found or "host"
    raise ShipyardError(f"{fname}: no post-install script installs pyxis/enroot or Apptainer, so the config does not "
                        "say how jobs start containers; pass --runtime pyxis (ParallelCluster's usual), --runtime "
                        "apptainer, or --runtime host (no container: the nodes' own Python)")


def newest_efa_installer() -> str:
    """The newest EFA installer release shipyard's compatibility data knows (shipyard/data/compat.yaml)."""
    known = facts.load("compat")["efa"]["installers"]
    return max(known, key=lambda v: tuple(int(x) for x in str(v).split(".")))


def review(config_text: str, fname: str, name: str, prof: dict, chosen: str | None = None) -> list[str]:
    """What the import could not know from the config, one line each, for the user to review before the first job:
    how the runtime was chosen, the driver, the account, the login host, the EFA installer version it suggested."""
    config, _ = loader.parse_yaml(config_text, fname)
    key = f"clusters.{name}"
    rt = prof["runtime"]
    why = ("--runtime" if chosen else "a post-install script installs it" if _detected_runtime(config)
           else "no GPUs: the nodes' own Python, no container")
    notes = [f"{key}.runtime: {rt} ({why})"]
    if prof.get("gpus_per_node"):
        notes.append(f"{key}.driver: not in the config; set it to the NVIDIA driver of the compute nodes' AMI "
                     f"(`invoke doctor --cluster {name}` reads it with nvidia-smi), or `invoke check` cannot judge "
                     "CUDA against it")
    notes.append(f"{key}.scheduler.account: not in the config; set it if your site charges jobs to an account")
    notes.append(f"{key}.login: not in the config; the head node's host name, for `invoke shell`'s ssh snippet")
    if (prof.get("fabric_options") or {}).get("efa_installer"):
        notes.append(f"{key}.fabric_options.efa_installer: {prof['fabric_options']['efa_installer']}, the newest "
                     "release shipyard's data knows; the image installs this version (pin another deliberately)")
    return notes


def _partition(queue: dict, qpath: tuple, lines, fname: str) -> dict:
    """One SlurmQueue -> the partition's entry. With several compute resources (or several instance types) a job
    must fit on any node of the queue, so GPUs, CPUs, memory and rate are the smallest; GPU models are all of them;
    the fabric is EFA only when every compute resource enables it."""
    data = ec2()
    crs = queue.get("ComputeResources") or []
    if not isinstance(crs, list) or not crs:
        raise ShipyardError(f"{_at(lines, fname, qpath)}: queue {queue.get('Name')!r} has no ComputeResources")
    nodes = []
    for i, cr in enumerate(crs):
        crpath = qpath + ("ComputeResources", i)
        types = _instance_types(cr)
        if not types:
            raise ShipyardError(f"{_at(lines, fname, crpath)}: compute resource {cr.get('Name')!r} names no "
                                "InstanceType or Instances")
        for t in types:
            spec = data["instances"].get(t)
            if spec is None:
                raise ShipyardError(f"{_at(lines, fname, crpath)}: instance type {t!r} is not in "
                                    "shipyard/data/ec2.yaml; add it there with its source (nothing was written)")
            vcpus = spec["vcpus"] // 2 if cr.get("DisableSimultaneousMultithreading") else spec["vcpus"]
            mem = cr.get("SchedulableMemory") or int(spec["memory_gib"] * 1024 * data["schedulable_memory_fraction"])
            efa = bool((cr.get("Efa") or {}).get("Enabled"))
            nodes.append(dict(type=t, gpus=spec.get("gpus", 0), gpu=spec.get("gpu"), cpus=vcpus, mem=int(mem),
                              efa=efa, rate=spec["network_gbps"]))
    types = list(dict.fromkeys(n["type"] for n in nodes))
    models = list(dict.fromkeys(n["gpu"] for n in nodes if n["gpu"]))
    part: dict[str, Any] = {
        "description": f"ParallelCluster queue {queue['Name']}: {', '.join(types)}",
        "instance_type": types[0] if len(types) == 1 else None,
        "gpus_per_node": min(n["gpus"] for n in nodes),
        "gpus": [{"model": m, "arch": data["gpus"][m]} for m in models],
        "cpus_per_node": min(n["cpus"] for n in nodes),
        "mem_per_node": f"{min(n['mem'] for n in nodes)}M",
        "fabric": "efa" if all(n["efa"] for n in nodes) else "socket",
        "line_rate_gbps": min(n["rate"] for n in nodes),
        "exclusive": bool(queue.get("JobExclusiveAllocation", False)),
    }
    max_time = (queue.get("CustomSlurmSettings") or {}).get("MaxTime")
    if max_time:
        part["max_time"] = str(max_time)
    return {k: v for k, v in part.items() if v is not None}


def profile(config_text: str, fname: str, runtime: str | None = None) -> dict:
    """The cluster profile (plain data, as it goes into registry.yaml) for a ParallelCluster config's text;
    ``runtime`` is the user's ``--runtime`` (see :func:`_runtime`)."""
    config, lines = loader.parse_yaml(config_text, fname)
    if not isinstance(config, dict):
        raise ShipyardError(f"{fname}:1: not a ParallelCluster config (expected a mapping with Scheduling)")
    sched = config.get("Scheduling")
    if not isinstance(sched, dict) or str(sched.get("Scheduler", "")).lower() != "slurm":
        raise ShipyardError(f"{_at(lines, fname, ('Scheduling',))}: Scheduling.Scheduler: only slurm clusters can "
                            "be imported (shipyard launches Slurm jobs)")
    queues = sched.get("SlurmQueues")
    if not isinstance(queues, list) or not queues:
        raise ShipyardError(f"{_at(lines, fname, ('Scheduling',))}: Scheduling.SlurmQueues: no queues")
    parts: dict[str, dict] = {}
    for i, q in enumerate(queues):
        qpath = ("Scheduling", "SlurmQueues", i)
        name = str((q or {}).get("Name", ""))
        if not _NAME.match(name):
            raise ShipyardError(f"{_at(lines, fname, qpath)}: queue name {name!r} is not a Slurm partition name")
        parts[name] = _partition(q, qpath, lines, fname)
    gpu_parts = sorted((p for p in parts if parts[p]["gpus_per_node"]), key=lambda p: -parts[p]["gpus_per_node"])
    default = gpu_parts[0] if gpu_parts else next(iter(parts))
    cpu_parts = [p for p in parts if not parts[p]["gpus_per_node"]]
    interactive = gpu_parts[-1] if gpu_parts else default  # the smallest GPU nodes: cheapest for a shell
    mounts = [str(s["MountDir"]) for s in config.get("SharedStorage") or [] if isinstance(s, dict) and s.get("MountDir")]
    binds = [f"{m}:{m}" for m in mounts if m != "/home"]
    lustre = [str(s["MountDir"]) for s in config.get("SharedStorage") or []
              if isinstance(s, dict) and s.get("StorageType") == "FsxLustre" and s.get("MountDir")]
    store = (lustre or [m for m in mounts if m != "/home"] or ["/home"])[0]
    d = parts[default]
    out: dict[str, Any] = {
        "description": f"imported from ParallelCluster config {Path(fname).name}",
        "runtime": _runtime(config, fname, bool(gpu_parts), runtime),
        "fabric": d["fabric"],
        "gpus_per_node": d["gpus_per_node"],
        "cpus_per_node": d["cpus_per_node"],
        "mem_per_node": d["mem_per_node"],
    }
    if d.get("instance_type"):
        out["instance_type"] = d["instance_type"]
    if d["gpus"]:
        out["gpus"] = d["gpus"]
    out["scheduler"] = {"partition": default, "partitions": parts, "interactive_partition": interactive,
                        "build_partition": cpu_parts[0] if cpu_parts else default}
    if binds:
        out["binds"] = binds
    out["storage"] = f"{store.rstrip('/')}/shipyard/images"
    out["fabric_options"] = {"line_rate_gbps": d["line_rate_gbps"]}
    if any(p["fabric"] == "efa" for p in parts.values()):
        out["fabric_options"]["efa_installer"] = newest_efa_installer()  # a suggestion: review() says so
    return out


def _dump(name: str, prof: dict) -> str:
    """The profile as registry.yaml text: two spaces under ``clusters:``, flow style for the small GPU entries."""
    body = yaml.safe_dump({name: prof}, sort_keys=False, default_flow_style=None, width=120)
    return "".join("  " + line if line.strip() else line for line in body.splitlines(keepends=True))


def insert(registry_text: str, fname: str, name: str, prof: dict, source: str) -> str:
    """registry.yaml's text with the profile added at the end of ``clusters:`` (the rest byte for byte: comments,
    order and quoting stay the user's). A cluster of that name already there is refused, not replaced."""
    data, lines = loader.parse_yaml(registry_text, fname)
    if not isinstance(data, dict) or not isinstance(data.get("clusters"), dict):
        raise ShipyardError(f"{fname}:1: no 'clusters:' mapping to add the profile to")
    if name in data["clusters"]:
        raise ShipyardError(f"{fname}:{lines[('clusters', name)]}: clusters.{name} already exists; pass --name "
                            "NAME for another profile name, or remove that entry first")
    text_lines = registry_text.splitlines(keepends=True)
    if text_lines and not text_lines[-1].endswith("\n"):
        text_lines[-1] += "\n"
    tops = sorted(lines[(k,)] for k in data)  # 1-based lines of the top-level keys, in file order
    after = [ln for ln in tops if ln > lines[("clusters",)]]
    end = after[0] - 1 if after else len(text_lines)  # 0-based index where the next top-level key's line is
    while end > 0 and (not text_lines[end - 1].strip() or text_lines[end - 1].lstrip().startswith("#")) and after:
        end -= 1  # keep the next section's leading comments and blank lines with it
    block = "\n" + f"  # Imported from {source} by `invoke cluster.import-pcluster`.\n" + _dump(name, prof)
    return "".join(text_lines[:end]) + block + "".join(text_lines[end:])


def check_name(name: str) -> str:
    """``name`` when it can name a cluster profile (``--name``); else one error line."""
    if not _NAME.match(name):
        raise ShipyardError(f"--name {name!r}: use letters, digits, '.', '_' and '-'")
    return name


def added(registry_text: str, rpath: Path, name: str, prof: dict, source: str) -> str:
    """The registry text with ``clusters.NAME`` inserted, validated as a whole registry before anyone writes it."""
    after = insert(registry_text, str(rpath), name, prof, source)
    loader.load_text(after, str(rpath), rpath)
    return after
