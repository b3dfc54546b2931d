"""`invoke doctor --time-start`: how long the runtime takes to start the staged image on one node, cold and warm,
beside the start mode the node's configuration gives (what the doctor's node probe read).

One allocation of one node per runtime (``salloc``), three steps in it, each timed on the login node: ``srun true``
with no container (Slurm's own step start, subtracted from the others), then the same container start twice. The
first is the cold start: a pyxis container of a fresh name is unpacked or mounted, an image that no job read on the
node since its page cache was dropped is read from storage. The second is the warm one: the named container is
reused, the image's pages are cached. A start is what a launcher's step does: ``srun`` with pyxis's
``--container-image`` and a ``--container-name`` (reused by requeued and chained segments), ``apptainer exec``,
``ch-run``; the command in the container is ``/bin/sh -c "exit 0"``.

The shell lives in ``templates/start_time.sh``; values reach it as arguments. Parsing and the report are pure
functions (:func:`parse`, :func:`render`), tested without Slurm; bench/container_start.py measures the same starts
on the sandbox's two nodes against each other.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from shipyard import facts as data
from shipyard import runtimes, slurm
from shipyard.registry.model import Cluster, Registry

MARK = "@start-time"
CONTAINER_RUNTIMES = ("pyxis", "apptainer", "charliecloud")


@dataclass(frozen=True)
class Timing:
    runtime: str
    mode: str  # how the runtime starts the image here, from the node's configuration
    cold: float | None = None  # seconds over the plain step; None: not timed (``note`` says why)
    warm: float | None = None
    node: str = ""
    baseline: float | None = None  # seconds of the plain `srun true` step
    note: str = ""
    failed: bool = False  # a start was tried and failed (not merely skipped)


def facts() -> dict:
    return data.load("doctor")["start_time"]


def script() -> str:
    return resources.files("shipyard.jobs").joinpath("templates/start_time.sh").read_text()


def runtimes_to_time(cluster: Cluster) -> tuple[str, ...]:
    """The cluster's container runtime; on the local sandbox, which has them all installed, every one of them."""
    if getattr(cluster, "local_sandbox", False):
        return CONTAINER_RUNTIMES
    return (cluster.runtime,) if cluster.runtime in CONTAINER_RUNTIMES else ()


def _yes(value: str) -> str:
    return "yes" if value.strip().lower() in ("1", "true", "yes", "y") else "no"


def pyxis_mode(probe: dict) -> tuple[str, str]:
    """``use_squashfuse=no, container_scope=job`` from the plugstack arguments the node probe read (pyxis's own
    defaults, doctor.yaml, for an argument not given); and the scope."""
    defaults = facts()["pyxis_defaults"]
    said = dict(a.split("=", 1) for a in probe.get("pyxis_arg", []) if "=" in a)
    fuse = _yes(said.get("use_squashfuse", str(defaults["use_squashfuse"])))
    scope = said.get("container_scope", defaults["container_scope"])
    return f"use_squashfuse={fuse}, container_scope={scope}", scope


def apptainer_mode(probe: dict) -> str:
    """Setuid starter with the kernel's SquashFS mount, or squashfuse (setuid or user namespaces), as doctor's start
    path finding says it."""
    conf = {c.split("=", 1)[0].strip(): c.split("=", 1)[1].strip() for c in probe.get("apptainer_conf", []) if "=" in c}
    if not probe.get("apptainer_suid"):
        return "mode not read: no apptainer on the node's PATH"
    suid = probe["apptainer_suid"][0] == "yes" and conf.get("allow setuid", "yes") == "yes"
    if suid and conf.get("allow setuid-mount squashfs", "yes") == "yes":
        return "setuid, kernel SquashFS mount"
    fuse = ", ".join(probe.get("squashfuse", [])) or "no squashfuse found"
    return f"{'setuid' if suid else 'user namespaces'}, squashfuse {fuse}"


def charliecloud_mode(probe: dict) -> str:
    version = (probe.get("ch-run") or ["missing"])[0]
    if version == "missing":
        return "mode not read: no ch-run on the node's PATH"
    return f"ch-run {version}, SquashFS through libsquashfuse"


def missing(runtime: str, probe: dict | None) -> str:
    """Why ``runtime`` cannot start anything on the probed node ("" when it can): the probe saw no pyxis on the
    plugstack line, no apptainer or no ch-run."""
    if probe is None:
        return "the node probe did not run"
    if runtime == "pyxis" and not probe.get("pyxis_plugin"):
        return "no pyxis in the node's plugstack.conf"
    if runtime == "apptainer" and not probe.get("apptainer_suid"):
        return "no apptainer on the node's PATH"
    if runtime == "charliecloud" and (probe.get("ch-run") or ["missing"])[0] == "missing":
        return "no ch-run on the node's PATH"
    return ""


def mode(runtime: str, probe: dict) -> str:
    if runtime == "pyxis":
        return pyxis_mode(probe)[0]
    return apptainer_mode(probe) if runtime == "apptainer" else charliecloud_mode(probe)


def start_words(runtime: str, image: str, name: str) -> list[str]:
    """What comes between ``srun`` and the command for one container start (pyxis: named ``name``, "" for none)."""
    if runtime == "pyxis":
        return [f"--container-image={image}", *([f"--container-name={name}"] if name else []),
                "--no-container-mount-home"]
    if runtime == "apptainer":
        return ["apptainer", "exec", "--no-home", image]
    return ["ch-run", image, "--"]


def salloc_argv(cluster: Cluster, runtime: str, image: str, name: str) -> list[str]:
    """One node for the three timed steps; the script's arguments: the cleanup name (pyxis), the modules to load,
    ``--``, then the start words."""
    f = facts()
    argv = ["salloc", f"--partition={cluster.partition}", "--nodes=1", f"--time={f['time']}",
            f"--immediate={f['wait_s']}", "--job-name=shipyard-doctor-start"]
    if cluster.account:
        argv.append(f"--account={cluster.account}")
    mods = runtimes.get(runtime).modules(cluster)
    return [*argv, "bash", "-c", script(), "shipyard-start-time", name if runtime == "pyxis" else "", *mods, "--",
            *start_words(runtime, image, name)]


def parse(text: str) -> dict:
    """The script's ``@start-time KEY VALUE`` lines: node, and the four clock readings t0..t3 (seconds)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == MARK:
            out[parts[1]] = parts[2]
    return out


def timing(runtime: str, mode_text: str, clocks: dict) -> Timing:
    """Cold and warm start from the clock readings: each container step's time less the plain step's."""
    t = [float(clocks[f"t{i}"]) for i in range(4)]
    base = t[1] - t[0]
    return Timing(runtime, mode_text, cold=max(t[2] - t[1] - base, 0.0), warm=max(t[3] - t[2] - base, 0.0),
                  node=clocks.get("node", ""), baseline=base)


def render(timings: list[Timing], env_name: str) -> str:
    """One line per runtime, ``pyxis (use_squashfuse=no, container_scope=job): cold 1.6 s, warm 1.0 s``, under a
    heading that says what was started where."""
    if not timings:
        return "Container start: not timed (the cluster runs no container runtime)\n"
    nodes = sorted({t.node for t in timings if t.node})
    bases = [t.baseline for t in timings if t.baseline is not None]
    head = (f"Container start of the staged {env_name} image on {', '.join(nodes) or 'one node'} "
            "(seconds over a plain `srun true` step")
    head += f" of {min(bases):.1f}-{max(bases):.1f} s):" if bases else "):"
    lines = [head]
    for t in timings:
        if t.cold is None:
            lines.append(f"{t.runtime} ({t.mode}): not timed: {t.note}")
        else:
            lines.append(f"{t.runtime} ({t.mode}): cold {t.cold:.1f} s, warm {t.warm:.1f} s"
                         + (f" ({t.note})" if t.note else ""))
    return "\n".join(lines) + "\n"


def time_starts(reg: Registry, cluster: Cluster, env_name: str, probe: dict | None) -> list[Timing]:
    """Start the staged image of ``env_name`` under each runtime of :func:`runtimes_to_time`, on one node each."""
    out = []
    for name in runtimes_to_time(cluster):
        rt = runtimes.get(name)
        how = mode(name, probe or {})
        image = rt.image(reg.root, env_name, cluster)
        absent = missing(name, probe)
        if absent:
            out.append(Timing(name, how, note=absent))
            continue
        if not image or not Path(image).is_file():
            out.append(Timing(name, how, note=f"no staged image at {image} "
                                              f"(invoke stage {env_name} --cluster {cluster.name})"))
            continue
        container = f"shipyard-doctor-{uuid.uuid4().hex[:8]}"
        res = slurm.run(cluster, salloc_argv(cluster, name, image, container),
                        timeout=int(facts()["wait_s"]) + 600)
        clocks = parse(res.stdout)
        if res.returncode != 0 or not all(f"t{i}" in clocks for i in range(4)):
            said = [line for line in res.stderr.splitlines() if line.strip() and not line.startswith("salloc: ")]
            why = (said or [f"exit {res.returncode}"])[-1]  # salloc's own lines say only that it ended
            out.append(Timing(name, how, note=f"the start failed: {why}", failed=True, node=clocks.get("node", "")))
            continue
        out.append(timing(name, how, clocks))
    return out
