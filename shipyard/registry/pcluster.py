"""``invoke cluster.import-pcluster CONFIG``: a ParallelCluster 3 cluster config -> a cluster profile in registry.yaml.

Why: a ParallelCluster user already has a config that says almost everything shipyard needs (queues and their
instance types, EFA, shared storage, whether pyxis is installed); writing the profile by hand repeats it, with the
usual typos. Each Slurm queue becomes a partition with its instances' facts from ``shipyard/data/ec2.yaml`` (GPUs,
model, arch, vCPUs, schedulable memory, network rate); ``Efa.Enabled`` decides its fabric; SharedStorage mount dirs
become binds; a pyxis post-install script picks the pyxis runtime (a GPU cluster whose config does not show its
runtime needs ``--runtime``: never a silent ``host``), and :func:`review` lists what the config cannot say.

The profile is inserted as text into registry.yaml (the user's comments and layout stay as they are), the result is
loaded and validated like any registry before anything is written, the diff is shown, and the file is replaced
atomically. An instance type missing from the data file is refused by name, and nothing is written. A re-import
(``--update NAME``) merges the edited config into the existing profile (:func:`merged`): the config's keys follow
the config, the user's own keys, comments and quoting stay (:func:`updated`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.registry import fabric_checks, loader

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def ec2() -> dict:
    """shipyard/data/ec2.yaml."""
    return facts.load("ec2")


def _at(lines: Mapping, fname: str, path: tuple) -> str:
    return f"{fname}:{loader._line(lines, path) or 1}"


class _Config:
    """Typed reads of a config's keys: a value of the wrong shape is one line with its key path and file line."""

    def __init__(self, lines, fname: str):
        self.lines, self.fname = lines, fname

    def fail(self, path: tuple, what: str) -> ShipyardError:
        return ShipyardError(f"{_at(self.lines, self.fname, path)}: {loader._dotted(path)}: {what}")

    def get(self, node: dict, path: tuple, key: str, kind, default=None):
        v = node.get(key, default)
        if v is None or v is default:
            return v
        if kind is bool:
            return self.boolean(v, path + (key,))
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise self.fail(path + (key,), f"{v!r} is not a non-negative integer")
        if kind is str:
            if isinstance(v, (dict, list)):
                raise self.fail(path + (key,), "expected a string, not a " + type(v).__name__)
            return str(v)
        if kind in (dict, list) and not isinstance(v, kind):
            raise self.fail(path + (key,), f"expected a {'mapping' if kind is dict else 'list'}, not "
                                           f"{type(v).__name__} {str(v)[:40]!r}")
        return v

    def boolean(self, v, path: tuple) -> bool:
        """As ParallelCluster's schema reads a boolean: true/false and the strings it accepts ("false" is false)."""
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in _TRUE:
            return True
        if isinstance(v, str) and v.strip().lower() in _FALSE:
            return False
        raise self.fail(path, f"{v!r} is not a boolean (true or false)")


_TRUE = {"true", "t", "yes", "y", "on", "1"}
_FALSE = {"false", "f", "no", "n", "off", "0"}


def _instance_types(c: _Config, cr: dict, path: tuple) -> list[str]:
    """A compute resource's instance types: the ``Instances:`` list (flexible instances) or the older
    ``InstanceType:`` key."""
    insts = c.get(cr, path, "Instances", list)
    if insts is not None:
        out = []
        for j, i in enumerate(insts):
            if not isinstance(i, dict):
                raise c.fail(path + ("Instances", j), "expected a mapping with InstanceType")
            out.append(c.get(i, path + ("Instances", j), "InstanceType", str) or "")
        return [t for t in out if t]
    t = c.get(cr, path, "InstanceType", str)
    return [t] if t else []


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


def runtime_names() -> tuple[str, ...]:
    """The runtimes a cluster profile may name: the schema's list (shipyard.runtimes, a floor above, keeps its own
    list equal to it; a test checks)."""
    return tuple(loader.schema()["$defs"]["cluster"]["properties"]["runtime"]["enum"])


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
        if chosen not in runtime_names():
            raise ShipyardError(f"--runtime {chosen!r}: use one of {', '.join(runtime_names())}")
        return chosen
    found = _detected_runtime(config)
    if found or not gpu:
        return found or "host"
    raise ShipyardError(f"{fname}: no post-install script installs pyxis/enroot or Apptainer, so the config does not "
                        "say how jobs start containers; pass --runtime pyxis (ParallelCluster's usual), --runtime "
                        "apptainer, or --runtime host (no container: the nodes' own Python)")


def current_efa_installer() -> str:
    """The EFA installer shipyard suggests (shipyard/data/compat.yaml ``efa.current_installer``, with its source):
    the one fact the importer and the shipped registries' pins agree on."""
    return str(facts.load("compat")["efa"]["current_installer"]["version"])


def review(config_text: str, fname: str, name: str, prof: dict, chosen: str | None = None,
           why_runtime: str | None = None) -> list[str]:
    """What the import could not know from the config, one line each, for the user to review before the first job:
    how the runtime was chosen, the driver, the account, the login host, the EFA installer version it suggested."""
    config, _ = loader.parse_yaml(config_text, fname, core12=True)
    key = f"clusters.{name}"
    rt = prof["runtime"]
    why = why_runtime or ("--runtime" if chosen else "a post-install script installs it" if _detected_runtime(config)
                          else "no GPUs: the nodes' own Python, no container")
    notes = [f"{key}.runtime: {rt} ({why})"]
    if prof.get("gpus_per_node"):
        notes.append(f"{key}.driver: not in the config; set it to the NVIDIA driver of the compute nodes' AMI "
                     f"(`invoke doctor --cluster {name}` reads it with nvidia-smi), or `invoke check` cannot judge "
                     "CUDA against it")
    notes.append(f"{key}.scheduler.account: not in the config; set it if your site charges jobs to an account")
    notes.append(f"{key}.login: not in the config; the head node's host name, for `invoke shell`'s ssh snippet")
    if (prof.get("fabric_options") or {}).get("efa_installer"):
        notes.append(f"{key}.fabric_options.efa_installer: {prof['fabric_options']['efa_installer']}, the current "
                     "release in shipyard's data; the image installs this version (pin another deliberately)")
    parts = prof["scheduler"]["partitions"]
    for queue, types in efa_left_off(config).items():
        if parts.get(queue, {}).get("fabric") == "socket":
            notes.append(f"{key}.scheduler.partitions.{queue}.fabric: queue {queue}: {', '.join(types)} "
                         f"{'supports' if len(types) == 1 else 'support'} EFA but the queue does not enable it; "
                         "fabric set to socket (NCCL over TCP) - enable Efa in the cluster config "
                         "(ComputeResources: Efa: Enabled: true) and import again, or confirm")
    return notes


def efa_left_off(config: dict) -> dict[str, list[str]]:
    """Per queue, its EFA-capable instance types on compute resources that do not enable EFA. Why: ParallelCluster
    attaches no EFA unless the compute resource asks, so a p5 queue without ``Efa: Enabled`` runs NCCL over TCP,
    and the profile's ``fabric: socket`` is then right, but rarely what was meant. Reads a config that
    :func:`profile` has already accepted."""
    c = _Config({}, "")
    out: dict[str, list[str]] = {}
    for i, q in enumerate(config["Scheduling"]["SlurmQueues"]):
        qpath, name = ("Scheduling", "SlurmQueues", i), str(q.get("Name"))
        for j, cr in enumerate(q.get("ComputeResources") or []):
            crpath = qpath + ("ComputeResources", j)
            if c.get(c.get(cr, crpath, "Efa", dict) or {}, crpath + ("Efa",), "Enabled", bool, False):
                continue
            for t in _instance_types(c, cr, crpath):
                if fabric_checks.efa_capable(t) and t not in out.get(name, []):
                    out.setdefault(name, []).append(t)
    return out


def _partition(queue: dict, qpath: tuple, lines, fname: str) -> dict:  # noqa: C901 - one queue, key by key
    """One SlurmQueue -> the partition's entry. With several compute resources (or several instance types) a job
    must fit on any node of the queue, so GPUs, CPUs, memory and rate are the smallest; GPU models are all of them;
    the fabric is EFA only when every compute resource enables it."""
    data = ec2()
    c = _Config(lines, fname)
    crs = c.get(queue, qpath, "ComputeResources", list) or []
    if not crs:
        raise ShipyardError(f"{_at(lines, fname, qpath)}: queue {queue.get('Name')!r} has no ComputeResources")
    nodes = []
    for i, cr in enumerate(crs):
        crpath = qpath + ("ComputeResources", i)
        if not isinstance(cr, dict):
            raise c.fail(crpath, "expected a mapping (Name, InstanceType or Instances)")
        types = _instance_types(c, cr, crpath)
        if not types:
            raise ShipyardError(f"{_at(lines, fname, crpath)}: compute resource {cr.get('Name')!r} names no "
                                "InstanceType or Instances")
        for t in types:
            spec = data["instances"].get(t)
            if spec is None:
                raise ShipyardError(f"{_at(lines, fname, crpath)}: instance type {t!r} is not in "
                                    "shipyard/data/ec2.yaml; add it there with its source (nothing was written)")
            smt_off = c.get(cr, crpath, "DisableSimultaneousMultithreading", bool, False)
            vcpus = spec["vcpus"] // 2 if smt_off else spec["vcpus"]
            mem = (c.get(cr, crpath, "SchedulableMemory", int)
                   or int(spec["memory_gib"] * 1024 * data["schedulable_memory_fraction"]))
            efa = c.get(c.get(cr, crpath, "Efa", dict) or {}, crpath + ("Efa",), "Enabled", bool, False)
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
        "exclusive": c.get(queue, qpath, "JobExclusiveAllocation", bool, False),
    }
    custom = c.get(queue, qpath, "CustomSlurmSettings", dict) or {}
    max_time = c.get(custom, qpath + ("CustomSlurmSettings",), "MaxTime", str)
    if max_time:
        part["max_time"] = max_time
    return {k: v for k, v in part.items() if v is not None}


def profile(config_text: str, fname: str, runtime: str | None = None) -> dict:
    """The cluster profile (plain data, as it goes into registry.yaml) for a ParallelCluster config's text;
    ``runtime`` is the user's ``--runtime`` (see :func:`_runtime`)."""
    config, lines = loader.parse_yaml(config_text, fname, core12=True)  # ParallelCluster reads YAML 1.2
    if not isinstance(config, dict):
        raise ShipyardError(f"{fname}:1: not a ParallelCluster config (expected a mapping with Scheduling)")
    sched = config.get("Scheduling")  # a non-mapping Scheduling is refused just below
    if not isinstance(sched, dict) or str(sched.get("Scheduler", "")).lower() != "slurm":
        raise ShipyardError(f"{_at(lines, fname, ('Scheduling',))}: Scheduling.Scheduler: only slurm clusters can "
                            "be imported (shipyard launches Slurm jobs)")
    queues = sched.get("SlurmQueues")
    if not isinstance(queues, list) or not queues:
        raise ShipyardError(f"{_at(lines, fname, ('Scheduling',))}: Scheduling.SlurmQueues: no queues")
    c = _Config(lines, fname)
    parts: dict[str, dict] = {}
    for i, q in enumerate(queues):
        qpath = ("Scheduling", "SlurmQueues", i)
        if not isinstance(q, dict):
            raise c.fail(qpath, "expected a mapping (Name, ComputeResources)")
        name = c.get(q, qpath, "Name", str) or ""
        if not _NAME.match(name):
            raise ShipyardError(f"{_at(lines, fname, qpath)}: queue name {name!r} is not a Slurm partition name")
        if name in parts:
            raise c.fail(qpath + ("Name",), f"queue {name!r} is defined twice (queue names are unique in Slurm)")
        parts[name] = _partition(q, qpath, lines, fname)
    gpu_parts = sorted((p for p in parts if parts[p]["gpus_per_node"]), key=lambda p: -parts[p]["gpus_per_node"])
    default = gpu_parts[0] if gpu_parts else next(iter(parts))
    cpu_parts = [p for p in parts if not parts[p]["gpus_per_node"]]
    interactive = gpu_parts[-1] if gpu_parts else default  # the smallest GPU nodes: cheapest for a shell
    mounts, lustre = [], []
    for i, s in enumerate(c.get(config, (), "SharedStorage", list) or []):
        spath = ("SharedStorage", i)
        if not isinstance(s, dict):
            raise c.fail(spath, "expected a mapping (MountDir, StorageType)")
        m = c.get(s, spath, "MountDir", str)
        if not m:
            continue
        if not m.startswith("/") or ":" in m or "," in m or any(ch.isspace() or ord(ch) < 32 for ch in m):
            raise c.fail(spath + ("MountDir",), f"{m!r}: an absolute path without ':', ',' or whitespace "
                                                "(it becomes a bind SRC:DST)")
        mounts.append(m)
        if c.get(s, spath, "StorageType", str) == "FsxLustre":
            lustre.append(m)
    binds = [f"{m}:{m}" for m in mounts if m != "/home"]
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
        out["fabric_options"]["efa_installer"] = current_efa_installer()  # a suggestion: review() says so
    return out


class _NoAliasDumper(yaml.SafeDumper):
    """Never writes anchors/aliases: a profile shares objects (the default partition's GPU list), and an anchor name
    (&id001) written by one import collides with the next one's."""

    def ignore_aliases(self, data) -> bool:
        return True


def _dump(name: str, prof: dict, indent: int = 2) -> str:
    """The profile as registry.yaml text: ``indent`` spaces under ``clusters:`` (the registry's own), flow style for
    the small GPU entries, no anchors."""
    body = yaml.dump({name: prof}, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=None, width=120,
                     indent=indent)
    pad = " " * indent
    return "".join(pad + line if line.strip() else line for line in body.splitlines(keepends=True))


def insert(registry_text: str, fname: str, name: str, prof: dict, source: str) -> str:
    """registry.yaml's text with the profile added at the end of ``clusters:`` (the rest byte for byte: comments,
    order and quoting stay the user's). A cluster of that name already there is refused, not replaced. A block
    ``clusters:`` gets the block at its own indentation; a flow one (``clusters: {a: {...}}``) gets the profile as
    one more flow entry before its closing brace."""
    data, lines = loader.parse_yaml(registry_text, fname)
    if not isinstance(data, dict) or not isinstance(data.get("clusters"), dict):
        raise ShipyardError(f"{fname}:1: no 'clusters:' mapping to add the profile to")
    if name in data["clusters"]:
        raise ShipyardError(f"{fname}:{lines[('clusters', name)]}: clusters.{name} already exists; pass --update "
                            f"{name} to re-read the config into it (keeps the keys you added), or --name NAME for "
                            "another profile name")
    node = _clusters_node(registry_text)
    if node is not None and node.flow_style:
        return _insert_flow(registry_text, fname, node, name, prof)
    text_lines = registry_text.splitlines(keepends=True)
    if text_lines and not text_lines[-1].endswith("\n"):
        text_lines[-1] += "\n"
    indent = 2
    if data["clusters"]:
        first = text_lines[lines[("clusters", next(iter(data["clusters"])))] - 1]
        indent = len(first) - len(first.lstrip(" "))
    if indent < 1:
        raise ShipyardError(f"{fname}:{lines[('clusters',)]}: clusters: its entries are not indented under it; "
                            "cannot insert the profile as text (indent them, then import again)")
    tops = sorted(lines[(k,)] for k in data)  # 1-based lines of the top-level keys, in file order
    after = [ln for ln in tops if ln > lines[("clusters",)]]
    end = after[0] - 1 if after else len(text_lines)  # 0-based index where the next top-level key's line is
    while end > 0 and (not text_lines[end - 1].strip() or text_lines[end - 1].lstrip().startswith("#")) and after:
        end -= 1  # keep the next section's leading comments and blank lines with it
    block = ("\n" + " " * indent + f"# Imported from {source} by `invoke cluster.import-pcluster`.\n"
             + _dump(name, prof, indent))
    return "".join(text_lines[:end]) + block + "".join(text_lines[end:])


def _clusters_node(text: str):
    """The composed node of the top-level ``clusters:`` value (for its style and end), or None."""
    root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for k, v in root.value if isinstance(root, yaml.MappingNode) else ():
        if k.value == "clusters":
            return v
    return None


def _insert_flow(text: str, fname: str, node, name: str, prof: dict) -> str:
    end = node.end_mark.index  # just after the closing brace
    if text[end - 1:end] != "}":
        raise ShipyardError(f"{fname}:{node.start_mark.line + 1}: clusters: a flow mapping whose end shipyard cannot "
                            "find; write it in block style, then import again")
    entry = yaml.dump({name: prof}, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=True,
                      width=float("inf")).strip()[1:-1]
    sep = ", " if node.value else ""
    return text[:end - 1] + sep + entry + text[end - 1:]


def check_name(name: str, flag: str = "--name") -> str:
    """``name`` when it can name a cluster profile (``--name``, ``--update``); else one error line."""
    if not _NAME.match(name):
        raise ShipyardError(f"{flag} {name!r}: use letters, digits, '.', '_' and '-'")
    return name


def added(registry_text: str, rpath: Path, name: str, prof: dict, source: str) -> str:
    """The registry text with ``clusters.NAME`` inserted, validated as a whole registry before anyone writes it."""
    after = insert(registry_text, str(rpath), name, prof, source)
    loader.load_text(after, str(rpath), rpath)
    return after


# What a re-import (``--update``) takes from the config: the keys the import writes, per level of the profile. A key
# outside these is the user's own (a ``driver``, an ``account``, a partition's ``max_time`` set by hand...) and is
# kept as written; a key among them follows the config, and goes when the config no longer gives it.
_PRODUCED = {
    (): {"description", "runtime", "fabric", "gpus_per_node", "cpus_per_node", "mem_per_node", "instance_type",
         "gpus", "scheduler", "binds", "storage", "fabric_options"},
    ("scheduler",): {"partition", "partitions", "interactive_partition", "build_partition"},
    ("scheduler", "partitions", "*"): {"description", "instance_type", "gpus_per_node", "gpus", "cpus_per_node",
                                       "mem_per_node", "fabric", "line_rate_gbps", "exclusive", "max_time"},
    ("fabric_options",): {"line_rate_gbps", "efa_installer"},
}
# Lists the import writes that a user extends by hand (a site's /scratch beside the config's /fsx): the config's
# entries, then the user's others.
_UNION = {("binds",)}
# Keys the import writes only when the config says them, and a user often sets by hand: kept when the config is silent.
_OWN_WHEN_ABSENT = {("scheduler", "partitions", "*", "max_time")}
# Values the import only suggests (the config cannot say them for sure); an update keeps the user's value while the
# new profile still has the key, and while a partition it names still exists.
_SUGGESTED = {("description",), ("runtime",), ("storage",), ("fabric_options", "efa_installer"),
              ("scheduler", "partition"), ("scheduler", "interactive_partition"), ("scheduler", "build_partition")}


def _level(path: tuple) -> tuple:
    return ("scheduler", "partitions", "*") if path[:2] == ("scheduler", "partitions") and len(path) == 3 else path


def merged(old: Any, new: dict, path: tuple = ()) -> tuple[dict, list[str]]:
    """The profile ``new`` (read from the edited config) over the registry's ``old`` one: the user's own keys kept
    where they were, the config's keys updated, added or removed, queues added and removed with the config. Returns
    the profile and the dotted keys kept as the user's own. Order: ``old``'s, then what is new."""
    old = old if isinstance(old, dict) else {}
    produced = _PRODUCED.get(_level(path))
    queues = path == ("scheduler", "partitions")
    out: dict[str, Any] = {}
    kept: list[str] = []
    for k, v in old.items():
        here = path + (str(k),)
        if queues:
            if k in new:
                out[k], more = merged(v, new[k] if isinstance(new[k], dict) else {}, here)
                kept += more
            continue  # a queue the config no longer has goes, with what was added to it
        if produced is None or k not in produced:
            out[k] = v
            kept.append(".".join(here))
        elif here in _UNION and isinstance(v, list):
            theirs = [b for b in v if b not in (new.get(k) or [])]
            if theirs or k in new:
                out[k] = list(new.get(k) or []) + theirs
            kept += [f"{'.'.join(here)}: {b} (not from the config; remove it if its storage is gone)" for b in theirs]
        elif k not in new:
            if _level(path) + (k,) in _OWN_WHEN_ABSENT:
                out[k] = v
                kept.append(".".join(here))
            continue  # else the config no longer gives it
        elif here in _SUGGESTED and _still_valid(here, v, new):
            out[k] = v
            if v != new[k]:
                kept.append(f"{'.'.join(here)} (the config suggests {new[k]})")
        elif isinstance(new[k], dict) and (_level(here) in _PRODUCED or here == ("scheduler", "partitions")):
            out[k], more = merged(v, new[k], here)
            kept += more
        else:
            out[k] = new[k]
    for k, v in new.items():
        if k not in out:
            out[k] = v
    return out, kept


def _still_valid(path: tuple, value: Any, new: dict) -> bool:
    """A suggested value the user may have changed by hand still fits the new profile: a default partition that
    still exists; any other suggestion always does."""
    if path[0] == "scheduler":
        return value in (new.get("partitions") or {})
    return True


def existing(registry_text: str, fname: str, name: str) -> dict:
    """``clusters.NAME`` as registry.yaml has it (``--update NAME``); one line when there is none."""
    data, _ = loader.parse_yaml(registry_text, fname)
    clusters = data.get("clusters") if isinstance(data, dict) else None
    if not isinstance(clusters, dict) or name not in clusters:
        known = ", ".join(map(str, clusters or {})) if isinstance(clusters, dict) else "none"
        raise ShipyardError(f"--update {name!r}: {fname} has no clusters.{name} (known: {known}); "
                            "import without --update to add it")
    prof = clusters[name]
    if not isinstance(prof, dict):
        raise ShipyardError(f"{fname}: clusters.{name} is not a mapping; cannot update it")
    return prof


def replaced(registry_text: str, fname: str, name: str, prof: dict) -> str:
    """registry.yaml's text with the block of ``clusters.NAME`` replaced by ``prof``; every other line byte for byte
    (comments before the entry and after it stay where they are)."""
    node = _clusters_node(registry_text)
    if node is None or not isinstance(node, yaml.MappingNode) or node.flow_style:
        raise ShipyardError(f"{fname}: clusters: --update rewrites a profile of a block-style 'clusters:' mapping; "
                            "write it in block style, then update again")
    pair = next(((k, v) for k, v in node.value if k.value == name), None)
    if pair is None:
        raise ShipyardError(f"--update {name!r}: {fname} has no clusters.{name}")
    key, value = pair
    text_lines = registry_text.splitlines(keepends=True)
    if text_lines and not text_lines[-1].endswith("\n"):
        text_lines[-1] += "\n"
    start = key.start_mark.line
    if registry_text.splitlines()[start][:key.start_mark.column].strip():
        raise ShipyardError(f"{fname}:{start + 1}: clusters.{name} does not start its own line; cannot update it "
                            "as text (write the clusters in block style)")
    end = value.end_mark.line + (1 if value.end_mark.column else 0)
    while end > start + 1 and (not text_lines[end - 1].strip() or text_lines[end - 1].lstrip().startswith("#")):
        end -= 1  # the next entry's leading comments and blank lines stay with it
    return "".join(text_lines[:start]) + _dump(name, prof, key.start_mark.column) + "".join(text_lines[end:])


def updated(registry_text: str, rpath: Path, name: str, prof: dict) -> tuple[str, list[str]]:
    """The registry text with ``clusters.NAME`` re-read from the config (:func:`merged`), validated as a whole
    registry before anyone writes it, and the keys kept as the user's own."""
    new, kept = merged(existing(registry_text, str(rpath), name), prof)
    after = _carried(registry_text, replaced(registry_text, str(rpath), name, new), str(rpath), name)
    loader.load_text(after, str(rpath), rpath)
    return after, [f"clusters.{name}.{k}" for k in kept]


def _at_path(data: Any, path: tuple) -> Any:
    for p in path:
        data = data[p]
    return data


def _carried(before: str, after: str, fname: str, name: str) -> str:
    """``after`` (the profile re-dumped) with the user's own text carried over from ``before``: the comment lines
    right above each key that is still there, and the very line of each scalar whose value did not change (its
    quoting and trailing comment). Why: the profile is rewritten as a whole, but a re-import should change only
    what the config changed."""
    old, old_lines = loader.parse_yaml(before, fname)
    new, new_lines = loader.parse_yaml(after, fname)
    src, dst = before.splitlines(keepends=True), after.splitlines(keepends=True)

    def single(lines: Mapping) -> dict[int, tuple]:  # line -> the one key path on it (block style only)
        seen: dict[int, list] = {}
        for path, ln in lines.items():
            if path[:2] == ("clusters", name) and len(path) > 2:
                seen.setdefault(ln, []).append(path)
        return {ln: ps[0] for ln, ps in seen.items() if len(ps) == 1}

    old_single, new_single = single(old_lines), single(new_lines)
    out = list(dst)
    above: dict[int, list[str]] = {}
    for path, ln in new_lines.items():
        if path[:2] != ("clusters", name) or len(path) < 3 or path not in old_lines:
            continue
        o = old_lines[path]
        indent = dst[ln - 1][:len(dst[ln - 1]) - len(dst[ln - 1].lstrip(" "))]
        k, comments = o - 1, []
        while k > 0 and src[k - 1].lstrip().startswith("#"):
            comments.insert(0, indent + src[k - 1].lstrip())
            k -= 1
        if comments:
            above[ln - 1] = comments
        ov, nv = _at_path(old, path), _at_path(new, path)
        line = src[o - 1].lstrip(" ")
        if (old_single.get(o) == path and new_single.get(ln) == path and not isinstance(ov, (dict, list))
                and type(ov) is type(nv) and ov == nv and line.startswith(f"{path[-1]}:")
                and line.split(":", 1)[1].strip()[:1] not in ("", "|", ">", "#")):
            out[ln - 1] = indent + line
    return "".join("".join(above.get(i, [])) + line for i, line in enumerate(out))
