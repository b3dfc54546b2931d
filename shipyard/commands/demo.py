"""``invoke demo``: the README's main command. Registry -> definition -> a real 2-node Slurm job, on this machine.

It brings up the local Slurm sandbox (:mod:`shipyard.sandbox`), renders the default environment's definition,
makes sure the cluster's ``host_requirements`` (torch) are importable by this Python, writes a 2-node torchrun
launcher for the sandbox with the host runtime, submits it, waits, and prints the training result (world size, loss
going down), the job id and the log path. Where the sandbox cannot run (no root, not Debian/Ubuntu) it says why in
one line and only renders.

Each step is its own function; the launcher step (:func:`write_launcher`) is ``shipyard.launch.launcher`` itself, so the demo
submits exactly what ``invoke launch --cluster sandbox --runtime host`` writes.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import time
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from shipyard import sandbox, slurm
from shipyard.commands import definitions
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.launch import launcher as launch
from shipyard.launch.options import Options

JOB_NAME = "shipyard-demo"
TRAIN = Path("examples") / "train.py"
_RESULT = re.compile(r"result: world_size=(\d+) start_step=(\d+) end_step=(\d+) first_loss=([0-9.]+) "
                     r"last_loss=([0-9.]+)")


def unsatisfied(requirements, version_of=importlib.metadata.version, key: str = "host_requirements") -> list[str]:
    """The requirements (``NAME==VERSION`` strings) this Python does not satisfy.

    Why ``packaging``: its specifiers know that ``==2.13.0`` is met by a local build such as ``2.13.0+cpu``.
    """
    missing = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise ShipyardError(f"{key}: {text!r} is not a pip requirement ({exc})") from None
        try:
            have = version_of(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            missing.append(text)
    return missing


def ensure_host_requirements(cluster) -> list[str]:
    """pip-install the cluster's ``host_requirements`` into this Python when missing; returns what was installed."""
    todo = unsatisfied(cluster.host_requirements, key=f"clusters.{cluster.name}.host_requirements")
    if todo:
        print(f"demo: installing {' '.join(todo)} into {sys.executable}", flush=True)
        res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *todo], capture_output=True, text=True)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise ShipyardError(f"demo: pip install {' '.join(todo)} failed: {last}")
    return todo


def write_launcher(reg, info: dict, steps: int) -> tuple[Path, str, Path]:
    """Write the 2-node torchrun launcher for the sandbox with the host runtime, through ``shipyard.launch.launcher`` (the
    code path of ``invoke launch --cluster sandbox --runtime host``), so the demo runs the launcher users get.

    Returns (script, log path with ``%j`` for the job id, checkpoint). This is the one step that knows about launch.
    """

    train = reg.root / TRAIN
    if not train.is_file():
        raise ShipyardError(f"demo: {train} is missing (the demo trains with the project's examples/train.py)")
    ckpt = Path(info["directory"]) / "jobs" / "demo.pt"
    opts = Options(cluster=reg.sandbox_cluster().name, nodes=len(info["nodes"]), gpus_per_node=info["gpus_per_node"],
                   runtime="host", name=JOB_NAME)
    spec = launch.build(reg, reg.environment(None), reg.cluster(opts.cluster), opts,
                        [str(train), "--steps", str(steps), "--checkpoint", str(ckpt)])
    script = launch.write(spec)
    return script, f"{spec.log_dir}/{spec.name}-%j.out", ckpt


def wait(job: slurm.Job, timeout: float = 600) -> dict:
    """Wait for the job's end (:meth:`shipyard.slurm.Job.wait`); its state, ExitCode and the seconds waited. A job
    still running after ``timeout`` seconds is cancelled and is exit 1."""
    t0 = time.monotonic()
    state = job.wait(timeout)
    stuck = job.stuck()
    if stuck:
        job.cancel()
        raise ShipyardError(f"demo: job {job.id} cannot start ({stuck}); cancelled it", exit_code=1)
    if not job.ended(state):
        job.cancel()
        raise ShipyardError(f"demo: job {job.id} did not finish within {timeout:.0f} s (state {state or 'unknown'}); "
                            "cancelled it", exit_code=1)
    return {"state": state or "unknown", "exit": job.fields.get("ExitCode", "?"), "seconds": round(time.monotonic() - t0, 2)}


def parse_result(log_text: str) -> dict | None:
    """The ``result:`` line examples/train.py's rank 0 prints, plus which ranks reported, or None."""
    m = _RESULT.search(log_text)
    if not m:
        return None
    ranks = sorted({int(r) for r in re.findall(r"rank (\d+)/\d+ step", log_text)})
    return {"world_size": int(m[1]), "start_step": int(m[2]), "end_step": int(m[3]),
            "first_loss": float(m[4]), "last_loss": float(m[5]), "ranks": ranks}


def run_job(reg, info: dict, steps: int = 60, timeout: float = 600) -> dict:
    """Write, submit and wait for the demo job; everything the report needs (also used by bench/)."""
    script, log_pattern, ckpt = write_launcher(reg, info, steps)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.unlink(missing_ok=True)  # the demo trains from scratch each time, so the loss visibly goes down
    job = slurm.Job(slurm.SANDBOX, slurm.submit(slurm.SANDBOX, script, directory=info["directory"]),
                    info["directory"])
    done = wait(job, timeout)
    log = Path(log_pattern.replace("%j", job.id))
    text = log.read_text(errors="replace") if log.exists() else ""
    return {"job": job.id, "script": str(script), "log": str(log), **done, "result": parse_result(text)}


def report(job: dict, nodes: int, gpus_per_node: int) -> tuple[str, bool]:
    """The lines to print and whether the demo succeeded (exit 0, world size nodes x GPUs, loss went down)."""
    r = job["result"]
    lines = [f"job {job['job']}: {job['state']} (exit {job['exit']}) after {job['seconds']:.1f} s",
             f"launcher: {job['script']}", f"log: {job['log']}"]
    want = nodes * gpus_per_node
    if r is None:
        lines.append("training: no result line in the log (see the log above)")
        return "\n".join(lines), False
    down = r["last_loss"] < r["first_loss"]
    lines.append(f"training: world size {r['world_size']} (ranks {', '.join(map(str, r['ranks']))} reported), "
                 f"steps {r['start_step']}->{r['end_step']}, loss {r['first_loss']:.4f} -> {r['last_loss']:.4f} "
                 f"({'going down' if down else 'NOT going down'})")
    ok = slurm.succeeded(job["state"]) and r["world_size"] == want and down
    if r["world_size"] != want:
        lines.append(f"demo: expected world size {want} ({nodes} nodes x {gpus_per_node} GPUs)")
    return "\n".join(lines), ok


def demo(ctx: Context, steps: int = 60, timeout: float = 600, install: bool = True) -> int:
    """``invoke demo``; returns the exit code (0: the job ran and trained; 1: it did not)."""
    code = definitions.render(ctx)  # the default environment, through the gate as `invoke render` does it
    if code:
        return code
    reason = sandbox.cannot_run_reason()
    if reason:
        ctx.say(f"demo: rendered only; not starting the local Slurm sandbox: {reason}")
        return 0
    cluster = ctx.registry.sandbox_cluster()
    info = sandbox.up(install=install, cluster=cluster)
    print(sandbox.info_line(info), file=ctx.out, flush=True)
    ensure_host_requirements(cluster)
    job = run_job(ctx.registry, info, steps, timeout)
    text, ok = report(job, len(info["nodes"]), info["gpus_per_node"])
    ctx.say(text)
    ctx.say(STAYS_UP)
    return 0 if ok else 1


STAYS_UP = ("demo: the sandbox stays up for your own jobs (invoke sandbox.status; invoke launch --cluster sandbox "
            "...); stop it with: invoke sandbox.down")
