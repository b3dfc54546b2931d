"""`invoke doctor`: a preflight report of a cluster, on the login node and on one compute node (through srun).

Split in three so each part can be tested on its own:

* the probe, ``shipyard/jobs/templates/doctor_probe.sh``: one shell script that only *looks* (versions, GPUs,
  storage) and prints ``@doctor<TAB>KEY<TAB>VALUE`` lines. The same script runs on the login node and in a one-task
  srun step, so both places are judged by the same facts. Values reach it as arguments, never pasted into its text.
* :func:`evaluate`, a pure function from the probe results, the cluster profile and the environment to findings
  (PASS/WARN/FAIL, each with its fix). GPU, driver and arch are judged by :func:`shipyard.registry.compat.check_on_cluster`
  run on the cluster profile *as observed* (the node's driver and GPUs), so doctor and `invoke check` cannot disagree.
* :func:`run_probes`, the only part with side effects: it runs the probe (through the sandbox's client wrapper on
  ``--cluster sandbox``) and leaves a marker file in the storage directory so the node can say whether it sees
  the same storage (shared) or only a directory of the same name.

Thresholds (minimum Slurm and ch-run, free space) are data: ``shipyard/data/doctor.yaml``. What the cluster's runtime
needs (pyxis and enroot, apptainer and fakeroot, or Charliecloud's ch-run), where its images live and which modules it
loads are asked of the runtime object (:mod:`shipyard.runtimes`), the one the launchers use.
"""

from __future__ import annotations

import getpass
import os
import pwd
import re
import shlex
import stat
import subprocess
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from shipyard import facts as data
from shipyard import slurm
from shipyard import runtimes
from shipyard.staging import record as staged
from shipyard.staging import versions
from shipyard.registry import compat
from shipyard.registry.model import Cluster, Environment, Gpu, Registry

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
LOGIN = "login"
JOB_NAME = "shipyard-doctor"
Probe = dict  # key -> list of values (a key such as "gpu" repeats)


@dataclass(frozen=True)
class Finding:
    status: str  # PASS | WARN | FAIL
    where: str  # "login" or the compute node's hostname
    check: str
    detail: str
    fix: str = ""


def facts() -> dict:
    return data.load("doctor")


def probe_script() -> str:
    return resources.files("shipyard.jobs").joinpath("templates/doctor_probe.sh").read_text()


def parse_probe(text: str) -> Probe:
    """Collect the probe's ``@doctor`` lines; anything else (profile noise, srun messages) is ignored."""
    out: Probe = defaultdict(list)
    for line in text.splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3 and parts[0] == "@doctor":
            out[parts[1]].append(parts[2].strip())
    return dict(out)


def _one(p: Probe, key: str) -> str | None:
    vals = p.get(key)
    return vals[0] if vals else None


def _version(text: str | None) -> str | None:
    m = re.search(r"(\d+\.\d+(?:\.\d+)*)", text or "")
    return m[1] if m else None


def storage_dir(reg: Registry, cluster: Cluster) -> str:
    """The cluster's image storage as the nodes see it ('' when the profile has none); relative = under the project."""
    storage = runtimes.storage_dir(reg.root, cluster)
    return str(storage) if storage else ""


def _needs(cluster: Cluster, tool: str) -> bool:
    """Whether the cluster's runtime needs ``tool`` (pyxis, enroot, apptainer, fakeroot, ch-run) on the cluster."""
    return tool in runtimes.get(cluster.runtime, f"clusters.{cluster.name}.runtime").needs


# ------------------------------------------------------------------------------------------------ evaluation (pure)


def _slurm(cluster: Cluster, p: Probe) -> Finding:
    v = _one(p, "slurm")
    if v is None or v == "missing":
        return Finding(FAIL, LOGIN, "slurm", "srun not found on PATH",
                       f"run doctor on a login node of {cluster.name} (or load the site's slurm module)")
    ver = _version(v) if v.lower().startswith("slurm") else None
    if ver is None:
        return Finding(FAIL, LOGIN, "slurm", f"srun --version failed: {v}",
                       "check SLURM_CONF and that the controller is reachable from this host")
    need = facts()["slurm_min"]
    if compat.vtuple(ver) < compat.vtuple(need):
        return Finding(WARN, LOGIN, "slurm", f"Slurm {ver}: older than {need} (--gpus-per-node needs cons_tres)",
                       "ask the admins which GPU request syntax this Slurm takes; launchers may need --gres=gpu:N")
    return Finding(PASS, LOGIN, "slurm", f"Slurm {ver} (>= {need})")


def _pyxis(cluster: Cluster, p: Probe) -> Finding:
    have = _one(p, "pyxis") == "yes"
    seen = "srun --help lists --container-image" if have else "srun --help does not list --container-image"
    if not _needs(cluster, "pyxis"):
        return Finding(PASS, LOGIN, "pyxis", f"not needed (runtime {cluster.runtime}); {seen}")
    if have:
        return Finding(PASS, LOGIN, "pyxis", f"present: {seen}")
    return Finding(FAIL, LOGIN, "pyxis", f"runtime pyxis, but {seen} (the pyxis SPANK plugin is not loaded)",
                   f"ask the admins to enable pyxis in plugstack.conf, or set clusters.{cluster.name}.runtime: apptainer")


def _apptainer(cluster: Cluster, env: Environment, where: str, p: Probe) -> Finding:
    v = _one(p, "apptainer") or "missing"
    if not _needs(cluster, "apptainer"):
        return Finding(PASS, where, "apptainer", f"not needed (runtime {cluster.runtime}); "
                       f"{'not installed' if v == 'missing' else v}")
    if v == "missing":
        loads = ", ".join(cluster.modules) or "none listed"
        return Finding(FAIL, where, "apptainer", f"apptainer/singularity not found (clusters.{cluster.name}.modules: "
                       f"{loads})", f"add the site's apptainer module to clusters.{cluster.name}.modules, or ask "
                       "the admins where apptainer is installed")
    ver = _version(v)
    need = facts()["apptainer_build_args_min"]
    if env.build_args and ver and compat.vtuple(ver) < compat.vtuple(need):
        return Finding(WARN, where, "apptainer", f"{v}: environment {env.name} sets build_args, which need "
                       f"Apptainer >= {need}", f"build {env.name} elsewhere, or drop its build_args")
    return Finding(PASS, where, "apptainer", v)


def _not_needed(cluster: Cluster, where: str, tool: str, v: str) -> Finding:
    """A tool this cluster's runtime does not use: PASS, saying whether it is there anyway."""
    return Finding(PASS, where, tool, f"not needed (runtime {cluster.runtime}); "
                   f"{'not installed' if v == 'missing' else 'version ' + v}")


def _enroot(cluster: Cluster, where: str, p: Probe) -> Finding:
    v = _one(p, "enroot") or "missing"
    if not _needs(cluster, "enroot"):
        return _not_needed(cluster, where, "enroot", v)
    if v == "missing":
        status = FAIL if where != LOGIN else WARN
        why = "pyxis needs enroot on every compute node" if where != LOGIN else \
            "`enroot import` of images to .sqsh on the login node will not work"
        return Finding(status, where, "enroot", f"enroot not found: {why}",
                       "ask the admins to install enroot" if where != LOGIN else
                       f"import images on a node of partition {cluster.build_partition} instead")
    return Finding(PASS, where, "enroot", f"version {v}")


def _ch_run(cluster: Cluster, where: str, p: Probe) -> Finding:
    """Charliecloud's ch-run runs the job on every compute node; on the login node it only matters for tries."""
    v = _one(p, "ch-run") or "missing"
    if not _needs(cluster, "ch-run"):
        return _not_needed(cluster, where, "ch-run", v)
    if v == "missing":
        status = FAIL if where != LOGIN else WARN
        why = "runtime charliecloud runs every job step through ch-run" if where != LOGIN else \
            "not on the login node (only the compute nodes need it)"
        return Finding(status, where, "ch-run", f"ch-run not found: {why}",
                       f"load the site's Charliecloud module (clusters.{cluster.name}.modules) or ask the admins to "
                       f"install Charliecloud >= {facts()['ch_run_min']}")
    need = facts()["ch_run_min"]
    if _version(v) and tuple(map(int, _version(v).split("."))) < tuple(map(int, need.split("."))):
        return Finding(WARN, where, "ch-run", f"version {v}: older than {need} (SquashFS images need ch-run's "
                       "internal squashfuse mount)", f"ask the admins for Charliecloud >= {need}")
    return Finding(PASS, where, "ch-run", f"version {v}")


def _fakeroot(cluster: Cluster, where: str, p: Probe) -> Finding:
    if not _needs(cluster, "fakeroot"):
        return Finding(PASS, where, "fakeroot", f"not needed (runtime {cluster.runtime} does not build with fakeroot)")
    user = _one(p, "user") or "this user"
    if _one(p, "subuid") == "yes":
        return Finding(PASS, where, "fakeroot", f"/etc/subuid has a range for {user}: apptainer build --fakeroot works")
    tool = _one(p, "fakeroot")
    if tool and tool != "missing":
        return Finding(PASS, where, "fakeroot", f"no /etc/subuid range for {user}, but {tool} exists "
                       "(apptainer >= 1.1 falls back to it; some %post steps may still fail)")
    return Finding(WARN, where, "fakeroot", f"no /etc/subuid range for {user} and no fakeroot command: "
                   "apptainer build --fakeroot will fail",
                   "ask the admins for a subuid/subgid range, or build the image elsewhere and push it")


def _gpu_groups(lines: list[str]) -> list[tuple[str, str, int | None, int]]:
    """nvidia-smi CSV lines 'name, driver, compute_cap' -> [(model, driver, sm or None, count)]."""
    out = Counter()
    for line in lines:
        parts = [x.strip() for x in line.rsplit(",", 2)]
        if len(parts) != 3:
            out[(line.strip(), "", None)] += 1
            continue
        model, driver, cap = parts
        sm = int(cap.replace(".", "")) if re.fullmatch(r"\d+\.\d", cap) else None
        out[(model, driver, sm)] += 1
    return [(m, d, sm, n) for (m, d, sm), n in out.items()]


def _gpus(cluster: Cluster, env: Environment, where: str, p: Probe) -> list[Finding]:
    lines = p.get("gpu", [])
    if _one(p, "gpu_error"):
        return [Finding(FAIL, where, "gpu", f"nvidia-smi failed: {_one(p, 'gpu_error')}",
                        "the driver is not loaded or the GPU is in a bad state: report the node to the admins")]
    if not lines or lines == ["missing"]:
        if cluster.gpus:
            return [Finding(FAIL, where, "gpu", "nvidia-smi not found: no NVIDIA driver on this node",
                            f"check that partition {cluster.partition} has GPU nodes")]
        return [Finding(WARN, where, "gpu", f"no GPU: nvidia-smi not found (the profile lists no GPU models; "
                        f"{cluster.gpus_per_node} GPUs per node are scheduler resources only), so training runs "
                        "on CPUs", "" if slurm.is_sandbox(cluster) else
                        f"list the GPU models in clusters.{cluster.name}.gpus, or use a GPU partition")]
    out = []
    for model, driver, sm, count in _gpu_groups(lines):
        observed = replace(cluster, driver=driver or None,
                           gpus=(Gpu(model, f"sm_{sm}"),) if sm is not None else ())
        problems = [pr for pr in compat.check_on_cluster(env, observed)
                    if pr.key.endswith((".driver", ".gpus"))]
        arch = f"sm_{sm}" if sm is not None else "arch unknown"
        seen = f"{count} x {model}, driver {driver}, {arch}"
        if any(pr.severity == compat.ERROR for pr in problems):
            msg = "; ".join(pr.message for pr in problems if pr.severity == compat.ERROR)
            out.append(Finding(FAIL, where, "gpu", f"{seen}: {msg}",
                               f"pick an environment whose CUDA/arch fit (invoke check --cluster {cluster.name}), "
                               "or a partition with other GPUs"))
        elif problems:
            out.append(Finding(WARN, where, "gpu", f"{seen}: " + "; ".join(pr.message for pr in problems)))
        else:
            cf = compat.cuda_facts(env.cuda.value or "") or {}
            need = f" (CUDA {env.cuda.value} needs >= {cf['driver_min']})" if cf.get("driver_min") else ""
            out.append(Finding(PASS, where, "gpu", f"{seen}: runs {env.name}{need}"))
        if cluster.driver and driver and driver != cluster.driver:
            out.append(Finding(WARN, where, "driver", f"registry says driver {cluster.driver}, the node has {driver}",
                               f'set clusters.{cluster.name}.driver: "{driver}" so that invoke check judges the '
                               "real driver"))
    return out


def _storage(cluster: Cluster, where: str, p: Probe, path: str) -> list[Finding]:
    state = _one(p, "storage")
    key = f"clusters.{cluster.name}.storage"
    if state in (None, "unset"):
        return [Finding(WARN, where, "storage", f"{key} is not set: images have no shared home",
                        f"set {key} to a directory on the shared filesystem")]
    if state == "missing":
        # The host runtime runs without images: storage matters only for a --runtime pyxis/apptainer launch.
        status = FAIL if runtimes.get(cluster.runtime).containerised else WARN
        return [Finding(status, where, "storage", f"{path} does not exist",
                        f"mkdir -p {shlex.quote(path)} (on the shared filesystem), or fix {key}")]
    out = []
    if _one(p, "storage_writable") == "yes":
        out.append(Finding(PASS, where, "storage", f"{path} is writable"))
    else:
        # a student on read-only course storage only reads the images the instructor staged: not a failure
        out.append(Finding(WARN, where, "storage", f"{path} is read-only for {_one(p, 'user') or 'this user'}: "
                           "enough to run images staged there, not to stage them",
                           f"nothing to do if you only run staged images; to stage (invoke stage), use the account "
                           f"that owns it or point {key} at a writable directory"))
    shared = _one(p, "storage_shared")
    if shared == "no":
        out.append(Finding(FAIL, where, "storage", f"{path} here is not the login node's {path}: not shared",
                           f"set {key} to a path on a filesystem mounted on all nodes"))
    elif shared == "yes":
        out.append(Finding(PASS, where, "storage", "shared with the login node (sees the file the login node wrote)"))
    free = _one(p, "storage_free_kb")
    if free and free.isdigit():
        gib = int(free) / 1024 / 1024
        f = facts()
        fix = "free space (old images: containers/*.sif, .sqsh) or move the storage"
        if gib < f["free_space_fail_gib"]:
            out.append(Finding(FAIL, where, "free space", f"{gib:.1f} GiB free in {path} "
                               f"(< {f['free_space_fail_gib']} GiB)", fix))
        elif gib < f["free_space_warn_gib"]:
            out.append(Finding(WARN, where, "free space", f"{gib:.1f} GiB free in {path} "
                               f"(< {f['free_space_warn_gib']} GiB)", fix))
        else:
            out.append(Finding(PASS, where, "free space", f"{gib:.1f} GiB free in {path}"))
    return out


def _start_path(cluster: Cluster, where: str, p: Probe) -> list[Finding]:
    """How the cluster's runtime starts a staged image on this node, from the configuration the probe read (nothing
    when the probe read none of it): pyxis's plugstack arguments, enroot's system config, Apptainer's setuid and
    SquashFS mount settings and the squashfuse it would use. Informational, except a pyxis that unpacks every step."""
    meaning = facts()["start_path"]["pyxis_args"]
    out = []
    if cluster.runtime == "pyxis" and p.get("pyxis_plugin"):
        args = p.get("pyxis_arg", [])
        said = dict(a.split("=", 1) for a in args if "=" in a)
        notes = [f"{a} ({meaning[a.split('=', 1)[0]]})" if a.split("=", 1)[0] in meaning else f"{a} (not known here)"
                 for a in args]
        detail = f"plugstack: {', '.join(p['pyxis_plugin'])} " + ("; ".join(notes) if notes else "with no arguments")
        fuse = said.get("use_squashfuse", "").lower() in ("1", "true", "yes")
        out.append(Finding(PASS if fuse else WARN, where, "start path", detail,
                           "" if fuse else "each step unpacks the staged .sqsh on every node: for a large image ask "
                           "the site for use_squashfuse, or reuse a named container within a job"))
    if cluster.runtime == "pyxis" and p.get("enroot_conf"):
        out.append(Finding(PASS, where, "start path", "enroot: " + "; ".join(p["enroot_conf"])))
    if cluster.runtime == "apptainer" and (p.get("apptainer_conf") or p.get("apptainer_suid")):
        conf = {c.split("=", 1)[0].strip(): c.split("=", 1)[1].strip() for c in p.get("apptainer_conf", []) if "=" in c}
        suid = _one(p, "apptainer_suid") == "yes" and conf.get("allow setuid", "yes") == "yes"
        kernel = suid and conf.get("allow setuid-mount squashfs", "yes") == "yes"
        fuse = ", ".join(p.get("squashfuse", [])) or "no squashfuse found"
        mode = ("setuid starter, the kernel mounts the SIF's SquashFS" if kernel else
                f"{'setuid starter' if suid else 'user namespaces'}, SquashFS through squashfuse ({fuse})")
        out.append(Finding(PASS, where, "start path", f"apptainer: {mode}; "
                           + ("; ".join(p.get("apptainer_conf", [])) or "no allow setuid lines in apptainer.conf")))
    return out


def _modules(cluster: Cluster, where: str, p: Probe) -> list[Finding]:
    return [Finding(WARN, where, "modules", f"module load {m} failed" if m != "no module command" else
                    "no `module` command (Lmod/Environment Modules) to load " + ", ".join(cluster.modules),
                    f"check clusters.{cluster.name}.modules against `module avail`")
            for m in p.get("module_failed", [])]


def evaluate(cluster: Cluster, env: Environment, storage: str, login: Probe, node: Probe | None,
             node_error: str | None = None) -> list[Finding]:
    """Findings from the probes. ``node`` is None when the srun step failed (``node_error`` says why)."""
    out = [_slurm(cluster, login), _pyxis(cluster, login)]
    out += _modules(cluster, LOGIN, login)
    out += [_apptainer(cluster, env, LOGIN, login), _enroot(cluster, LOGIN, login), _ch_run(cluster, LOGIN, login),
            _fakeroot(cluster, LOGIN, login)]
    out += _storage(cluster, LOGIN, login, storage)
    if node is None:
        out.append(Finding(FAIL, "compute", "srun", f"no step ran on partition {cluster.partition}: {node_error}",
                           f"check the partition, account and time limit (clusters.{cluster.name}.scheduler), "
                           "and that nodes are up (sinfo)"))
        return out
    where = _one(node, "hostname") or "compute"
    out.append(Finding(PASS, where, "srun", f"a one-task step ran on {where} (partition {cluster.partition})"))
    out += _modules(cluster, where, node)
    out += [_apptainer(cluster, env, where, node), _enroot(cluster, where, node), _ch_run(cluster, where, node)]
    out += _start_path(cluster, where, node)
    out += _gpus(cluster, env, where, node)
    out += _storage(cluster, where, node, storage)
    return out


def render(cluster: Cluster, env: Environment, findings: list[Finding]) -> str:
    """One line per finding, its fix indented below; a count at the end."""
    w_where = max(len(f.where) for f in findings)
    w_check = max(len(f.check) for f in findings)
    out = [f"shipyard doctor: cluster {cluster.name} (runtime {cluster.runtime}), environment {env.name}"]
    for f in findings:
        out.append(f"{f.status}  {f.where:<{w_where}}  {f.check:<{w_check}}  {f.detail}")
        if f.fix and f.status != PASS:
            out.append(f"{'':4}  {'':<{w_where}}  {'':<{w_check}}  fix: {f.fix}")
    n = Counter(f.status for f in findings)
    out.append(f"{n[PASS]} PASS, {n[WARN]} WARN, {n[FAIL]} FAIL")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ running the probes


# sinfo's compact node states (%t) end in a flag: "~" powered off, "#" powering up, "!" pending power down, "%"
# powering down (sinfo(1), NODE STATE CODES). Such nodes take the ResumeTimeout to boot (ParallelCluster: minutes).
_POWER_FLAGS = ("~", "#", "!", "%")
_RESUME = re.compile(r"^\s*ResumeTimeout\s*=\s*(\d+)\s*sec", re.M)


def powered_down(sinfo_states: str) -> bool:
    """True when ``sinfo -h -o %t`` lists nodes that are powered down or powering up, and no plain idle or mixed
    node could take the probe at once."""
    states = [s.strip() for s in sinfo_states.split() if s.strip()]
    ready = [s for s in states if s.rstrip("*") in ("idle", "mix")]
    return bool(states) and not ready and any(s.rstrip("*").endswith(_POWER_FLAGS) for s in states)


def resume_timeout(config_text: str) -> int | None:
    """Seconds of ``ResumeTimeout`` in ``scontrol show config`` (None when absent)."""
    m = _RESUME.search(config_text)
    return int(m[1]) if m else None


def probe_wait(cluster: Cluster) -> tuple[int, str | None]:
    """How long the node probe waits for an allocation: doctor.yaml's ``probe_wait_s``, or the controller's
    ResumeTimeout when the partition's nodes are powered down (they boot first). The second value says why, for
    the report."""
    wait = int(facts()["probe_wait_s"])
    states = slurm.query(cluster, ["sinfo", "-h", "-p", cluster.partition, "-o", "%t"])
    if states.returncode != 0 or not powered_down(states.stdout):
        return wait, None
    conf = slurm.query(cluster, ["scontrol", "show", "config"])
    resume = resume_timeout(conf.stdout) if conf.returncode == 0 else None
    if resume and resume > wait:
        return resume, (f"partition {cluster.partition}'s nodes are powered down: waited up to {resume} s "
                        "(ResumeTimeout) for one to boot")
    return wait, None


def probe_argv(reg: Registry, cluster: Cluster, storage: str, marker: str, on_node: bool,
               wait_s: int | None = None) -> list[str]:
    """The login probe is ``bash -c SCRIPT``; the node probe is the same inside a one-task srun step that waits
    ``wait_s`` (default: doctor.yaml's ``probe_wait_s``) for its allocation."""
    mods = list(runtimes.get(cluster.runtime).modules(cluster))
    probe = ["bash", "-c", probe_script(), JOB_NAME, storage, marker, *mods]
    if not on_node:
        return probe
    f = facts()
    srun = ["srun", f"--partition={cluster.partition}"]
    if cluster.account:
        srun.append(f"--account={cluster.account}")
    srun += ["--nodes=1", "--ntasks=1", f"--job-name={JOB_NAME}", f"--time={f['probe_time']}",
             f"--immediate={wait_s or f['probe_wait_s']}"]
    if cluster.gpus_per_node > 0:
        srun.append("--gpus-per-node=1")
    return srun + probe


def run_probes(reg: Registry, cluster: Cluster) -> tuple[str, Probe, Probe | None, str | None]:
    """Run the probe here and on one compute node. Returns (storage, login, node or None, node error)."""
    storage = storage_dir(reg, cluster)
    marker_path = None
    if storage and Path(storage).is_dir():
        candidate = Path(storage) / f".shipyard-doctor-{uuid.uuid4().hex}"
        try:
            candidate.write_text("written by invoke doctor on the login node; removed when it ends\n")
            marker_path = candidate
        except OSError:
            pass  # the probe reports the directory as not writable
    marker = marker_path.name if marker_path else "-"
    try:
        login = parse_probe(slurm.run(cluster, probe_argv(reg, cluster, storage, "-", False), timeout=60).stdout)
        wait_s, _ = probe_wait(cluster)
        res = slurm.run(cluster, probe_argv(reg, cluster, storage, marker, True, wait_s), timeout=wait_s + 300)
    finally:
        if marker_path:
            marker_path.unlink(missing_ok=True)
    node = parse_probe(res.stdout)
    if res.returncode != 0 or "hostname" not in node:
        err = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        return storage, login, None, err
    return storage, login, node, None


def _reader(mode: int, gid: int) -> tuple[int, int, str] | None:
    """(uid, gid, who) of a student the recorded ``mode`` was staged for: someone else entirely when it gives the world
    read access, a member of the file's group (``gid``) when only the group; None for a private stage."""
    name = facts()["student_probe_user"]
    try:
        entry = pwd.getpwnam(name)
        uid, own_gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid, own_gid = 65534, 65534
    if mode & 0o004:
        return uid, own_gid, f"other users (tried uid {uid} {name})"
    if mode & 0o040:
        return uid, gid, f"its group (tried uid {uid} {name} with gid {gid})"
    return None


def _read_as(path: Path, uid: int, gid: int) -> str | None:
    """Why ``path`` cannot be opened and read by ``uid``:``gid`` (no other groups), or None when it can: a child
    process that has dropped to that uid reads one byte, so the folders above and the file's own mode both count,
    as they do for a student's job."""
    try:
        res = subprocess.run(["head", "-c", "1", "--", str(path)], user=uid, group=gid, extra_groups=[], cwd="/",
                             env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if res.returncode == 0:
        return None
    return (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1].rpartition(": ")[2]


def unreadable_by_readers(image: Path) -> tuple[str, str] | None:
    """Whether the students the stage was meant for (its record's mode) can read the staged version and its record:
    as root, tried as one of them (:func:`_reader`), since root reads every file and so says nothing about a
    student's job; as anyone else, who cannot become another uid, by the files' read bits against the recorded
    mode. (why not, the recorded mode), or None when they can, when the stage was private, or when the record is
    unreadable (the record's own check says so next)."""
    version = versions.current(image)
    rec, _ = staged.read_record(version)
    if not rec or not rec.mode:
        return None
    try:
        mode, gid = int(rec.mode, 8), version.stat().st_gid
    except (ValueError, OSError):
        return None
    reader = _reader(mode, gid)
    if reader is None:
        return None
    uid, gid, who = reader
    as_root = os.geteuid() == 0
    if not as_root:  # nobody was tried: the read bits are judged
        who = who.partition(" (tried")[0]
    for path in (version, staged.record_path(version)):
        if as_root:
            why = _read_as(path, uid, gid)
        else:
            try:
                have = stat.S_IMODE(path.stat().st_mode)
            except OSError as exc:
                why = exc.strerror or str(exc)
            else:
                why = f"mode {have:04o}" if mode & 0o044 & ~have else None
        if why:
            return f"{path} is not readable by {who}: {why} (staged for them with mode {rec.mode})", rec.mode
    return None


def images(reg: Registry, cluster: Cluster, env: Environment) -> list[Finding]:
    """Per environment used on the cluster: is its image in the storage, readable, and the one its stage record
    names, by the job's own rule (:func:`shipyard.staging.record.job_check`: content hashed once per image file)?
    Missing or not matching is a FAIL for ``env`` (the one launched) and a WARN for the others. Checked on the login
    node, which sees the same storage as the nodes (the storage check says whether it does)."""
    rt = runtimes.get(cluster.runtime, f"clusters.{cluster.name}.runtime")
    if not rt.containerised or not cluster.storage:
        return []
    out = []
    names = [e.name for e in reg.environments.values() if e.clusters is None or cluster.name in e.clusters]
    for name in names:
        bad = FAIL if name == env.name else WARN
        image = Path(rt.image(reg.root, name, cluster))
        stage = f"invoke stage {name} --cluster {cluster.name}"
        if not image.exists():
            out.append(Finding(bad, LOGIN, "image", f"{name}: {image} is not there", f"run `{stage}`"))
            continue
        unread = unreadable_by_readers(image)
        if unread:
            out.append(Finding(bad, LOGIN, "image", f"{name}: {unread[0]}",
                               f"ask whoever staged it to run `{stage} --mode {unread[1]}` and to let those readers "
                               f"search every folder above it"))
            continue
        if not os.access(image, os.R_OK):
            out.append(Finding(bad, LOGIN, "image", f"{name}: {image} is not readable by {getpass.getuser()}",
                               f"ask whoever staged it to run `{stage} --mode group` (or world)"))
            continue
        rec, changed = staged.job_check(image)  # the job's own rule: what a job refuses is never a PASS
        if not rec:
            out.append(Finding(bad, LOGIN, "image", f"{name}: {changed}", f"run `{stage}` again"))
            continue
        built = staged.binding(reg.root, name, None, rt.suffix)  # the build manifest's image
        detail = f"{name}: {image} present, readable, matches its stage record (sha256 {rec.sha256[:12]})"
        if built and built.sha256 != rec.sha256:
            out.append(Finding(WARN, LOGIN, "image", detail + f"; the build in containers/ is sha256 "
                               f"{built.sha256[:12]}", f"run `{stage}` to publish the newer build"))
        else:
            out.append(Finding(PASS, LOGIN, "image", detail))
    return out


def diagnose(reg: Registry, cluster: Cluster, env: Environment) -> tuple[list[Finding], Probe | None]:
    """Probe the login node and a compute node of ``cluster`` (its partition chosen with :meth:`Cluster.on`) and
    judge them, and the staged image, for ``env``. Returns the findings and the node's probe (None when no step ran),
    whose start-path facts `doctor --time-start` reports beside its timings."""
    storage, login, node, err = run_probes(reg, cluster)
    return evaluate(cluster, env, storage, login, node, err) + images(reg, cluster, env), node
