"""Helpers of the launcher tests: a fixed test registry (one cluster per fabric, the ``launch`` preset of
make_project), the probe job, and the pyxis double shared with the jobs tests.

The registry is fixed here (not the project's registry.yaml) so that golden files change only when the launcher
changes, and its root is a fixed fake path so that absolute paths in the goldens are stable.
"""

from __future__ import annotations

import io
import os
import re
import shutil
from pathlib import Path

import pytest

from shipyard.commands import launch as launch_commands
from shipyard.commands.context import Context
from shipyard.launch import launcher
from shipyard.launch.options import TORCHRUN, Options
from shipyard import slurm

LAUNCH_REGISTRY = """\
environments:
  pytorch-2.3:
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: ubuntu22.04
    env:
      OMP_NUM_THREADS: "1"
clusters:
  lab-efa:
    runtime: pyxis
    fabric: efa
    gpus_per_node: 8
    cpus_per_node: 192
    scheduler: {partition: gpu, partitions: [cpu, gpu], time: "04:00:00"}
    binds: [/fsx:/fsx]
    storage: /fsx/images
    fabric_options: {efa_installer: "1.43.0", aws_ofi_nccl: "1.16.1", line_rate_gbps: 3200}
  lab-efa-old:
    runtime: pyxis
    fabric: efa
    gpus_per_node: 8
    scheduler: {partition: gpu}
    storage: /fsx/images
    fabric_options: {aws_ofi_nccl: "1.5.0"}
  lab-ib:
    runtime: apptainer
    fabric: ib
    gpus_per_node: 4
    cpus_per_node: 64
    scheduler: {partition: grete, partitions: [grete, grete-interactive], account: proj1, time: "02:00:00"}
    modules: [apptainer]
    binds: [/scratch, "/mnt/data:/data:ro"]
    storage: /scratch/images
    fabric_options: {ib_hca: mlx5}
    env: {NCCL_SOCKET_IFNAME: ib0}
  lab-socket:
    runtime: host
    fabric: socket
    nodes: 2
    gpus_per_node: 2
    cpus_per_node: 2
    scheduler: {partition: debug, time: "00:10:00"}
    storage: images
defaults:
  environment: pytorch-2.3
  cluster: lab-socket
"""

FAKE_ROOT = Path("/srv/shipyard-project")
# A training command with the kinds of words that break naive quoting.
HOSTILE_ARGS = ("--epochs", "3", "two words", "it's \"quoted\"", "$(touch /tmp/pwned)", "a;b", "line1\nline2",
                "grüße 日本", "{{ not_jinja }}", "$HOME", "`id`", "*", "")


def build_launcher(reg, *, kind: str = TORCHRUN, command=(), workdir=None, forced=(), model: type = Options,
                   **flags) -> launcher.Launcher:
    """``launcher.build`` as the launch command calls it: the flags as one ``Options`` (or ``model``, a class derived
    from it), the environment and cluster they name resolved to objects first."""
    opts = model(**flags)
    return launcher.build(reg, reg.environment(opts.environment), reg.cluster(opts.cluster), opts, command, workdir,
                          forced, kind=kind)


def run_launch(command=(), *, registry_path=None, kind: str = TORCHRUN, **flags) -> str:
    """`invoke launch [FLAGS] -- COMMAND` through its command, run from the working directory; returns what it
    printed (an error raises, as the command does)."""
    ctx = Context.load(registry_path, out=io.StringIO())
    assert launch_commands.launch(ctx, Options(**flags), command, kind=kind) == 0
    return ctx.out.getvalue().rstrip("\n")


def fake_build_manifest(root: Path, env: str, fmt: str, sha256: str = "a" * 64, input_hash: str = "b" * 64) -> Path:
    """``containers/ENV.json`` as `invoke build` leaves it after a successful build (only the fields a launcher
    binds to), so that launchers of a container runtime can be written without building an image."""
    from shipyard.containers import manifest as mf

    path = root / "containers" / f"{env}.json"
    artifact = mf.Artifact(f"containers/{env}.{fmt}", sha256, size=0, mtime_ns=0)  # no file: never "intact"
    mf.update_manifest(path, environment=env, status="ok", input_hash=input_hash, artifacts={fmt: artifact})
    return path


# ------------------------------------------------------------------------------------------------ sandbox fixtures

REPO = Path(__file__).resolve().parents[1]
DOUBLES = Path(__file__).resolve().parent / "doubles"

# A training stand-in for the plumbing tests: what each rank received (argv, identity, selected environment).
PROBE = '''\
import json, os, socket, sys
keys = [k for k in os.environ if k.startswith(("SHIPYARD_", "NCCL_", "APPTAINER")) or k == "FOO"]
rec = {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]), "node": os.environ.get("SLURMD_NODENAME"),
       "host": socket.gethostname(), "cwd": os.getcwd(), "argv": sys.argv[1:], "env": {k: os.environ[k] for k in keys}}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe-out")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"{os.environ['SLURM_JOB_ID']}-{rec['rank']}.json"), "w") as fh:
    json.dump(rec, fh)
print(f"probe rank {rec['rank']} done", flush=True)
'''


@pytest.fixture(scope="session")
def pyxis_double(sandbox):
    """The pyxis SPANK test double (tests/doubles/pyxis-spank), compiled and listed in the sandbox's plugstack.conf
    for this session; removed again at the end so other areas' jobs never see it."""
    import subprocess
    import tempfile

    from shipyard import sandbox as sb

    if shutil.which("gcc") is None or not Path("/usr/include/slurm/spank.h").exists():
        pytest.skip("gcc and libslurm-dev (slurm/spank.h) are needed to build the pyxis test double")
    # Not under pytest's basetemp (pytest-of-root is 0700): every user's srun loads the plugin, and a student's job
    # (the two-student handout test) would log "Permission denied" for it; set_plugstack refuses such a path.
    d = Path(tempfile.mkdtemp(prefix="shipyard-pyxis-double-"))
    d.chmod(0o755)
    out = d / "pyxis_double.so"
    src = DOUBLES / "pyxis-spank" / "pyxis_double.c"
    try:
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(out), str(src)], check=True)
        sb.set_plugstack([out], sandbox.directory)
        try:
            yield out
        finally:
            sb.set_plugstack([], sandbox.directory)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def wait_job(sandbox, job_id: str, timeout: float = 240, log: Path | None = None) -> dict:
    """Wait for the job's end (shipyard's own :class:`~shipyard.slurm.Job`); its scontrol fields (JobState,
    ExitCode, ...). A job that does not end in time is cancelled, and the end of its ``log`` (when given) is in the
    error: where it hung."""
    job = slurm.Job(slurm.SANDBOX, job_id, sandbox.directory)
    state = job.wait(timeout, poll=0.5)
    if job.fields.get("JobState") not in slurm.final_states():
        job.cancel()
        tail = log.read_text(errors="replace")[-3000:] if log is not None and log.is_file() else ""
        raise AssertionError(f"job {job_id} did not finish in {timeout} s: {state}" + (f"\n--- {log}:\n{tail}"
                                                                                        if tail else ""))
    return job.fields


# The launchers' end-of-job programs (the NCCL transport line, the failure hints) must run the same under mawk, gawk
# and busybox awk, whichever a compute node has. A fixed list, not "the awks found here": `invoke test` installs all
# three (shipyard/data/test-packages.txt), so which tests run never depends on the machine or on what another test
# run installed meanwhile (a fresh machine's CI once collected its tests before the real-runtime run's gawk arrived).
AWKS = [["mawk"], ["gawk"], ["busybox", "awk"]]

_STEP_LINE = re.compile(r"^rank \d+/\d+ step \d+ loss ")


def job_story(sandbox, job_id: str, log: Path, lines: int = 60) -> str:
    """What a failed job said, for an assertion message that CI keeps only the start of: its log without the
    per-step ``rank R/W step S loss L`` lines (the last ``lines`` of the rest: torchrun's and the launcher's own),
    then what each node's slurmd logged about the job (a step killed, a signal, a node's error)."""
    text = log.read_text(errors="replace") if log.is_file() else f"(no log at {log})"
    kept = [ln for ln in text.splitlines() if not _STEP_LINE.match(ln)]
    parts = [f"--- job {job_id}, {log.name} without its step lines (last {lines} of {len(kept)}):",
             *kept[-lines:]]
    for node in sandbox.nodes:
        slurmd = Path(sandbox.directory) / "log" / f"slurmd-{node}.log"
        about = [ln for ln in (slurmd.read_text(errors="replace").splitlines() if slurmd.is_file() else [])
                 if re.search(rf"\b(JobId|StepId|job|step)[= ]?{job_id}\b", ln)]
        parts += [f"--- slurmd on {node} about job {job_id} (last 15):", *about[-15:]]
    return "\n".join(parts)


def wait_for_text(path: Path, needle: str, timeout: float = 180) -> str:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in (text := path.read_text(errors="replace")):
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} did not appear in {path} within {timeout} s")


def probes(project: Path, job_id: str) -> list[dict]:
    """What each rank of a probe job recorded (one JSON file per rank, so interleaved output cannot garble it)."""
    import json

    files = sorted((project / "probe-out").glob(f"{job_id}-*.json"))
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])


def stage_record(image: Path, input_hash: str = "b" * 64) -> Path:
    """The record `invoke stage` writes beside an image (real sha256 and identity stamp of ``image``), for launcher tests
    whose cluster runtime stages nothing itself; launchers of a container runtime bind to it."""
    from shipyard import identity
    from shipyard.files import sha256_file
    from shipyard.staging import record

    st = identity.stamp(image)
    return record.write_record(image, record.StageRecord(sha256_file(image), input_hash, st.size, st.mtime_ns, st.ino,
                                                         st.ctime_ns))


def replace_staged_image(image: Path) -> None:
    """What someone who can write the storage does to a staged image: other content of the same size and mtime, and
    a record rewritten for the new file's stamp that still names the old sha256 (only the content hash tells)."""
    from shipyard.files import sha256_file

    old = sha256_file(image)
    st = image.stat()
    data = image.read_bytes()
    image.write_bytes(bytes(b ^ 0xFF for b in data[:64]) + data[64:])
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    rec = stage_record(image)
    rec.write_text(rec.read_text().replace(sha256_file(image), old))


def make_user(name: str, home: Path):
    """A Unix user ``name`` with its home at ``home`` (created here, as `useradd` does; the caller removes it with
    `userdel --remove`): the pwd entry."""
    import pwd
    import subprocess

    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--home-dir", str(home), "--create-home", "--shell", "/bin/bash", name],
                       check=True, capture_output=True)
        return pwd.getpwnam(name)


def as_user(u) -> list[str]:
    """The argv prefix that runs a command as user ``u`` (a pwd entry), with its own HOME/USER/LOGNAME."""
    return ["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--init-groups", "env", f"HOME={u.pw_dir}",
            f"USER={u.pw_name}", f"LOGNAME={u.pw_name}"]


def searchable_for_others(paths) -> list[tuple[Path, int]]:
    """Add o+x to every ancestor of ``paths`` that lacks it; returns (dir, old mode) to restore."""
    changed = []
    for p in paths:
        for d in [*reversed(Path(p).parents)]:
            mode = d.stat().st_mode & 0o7777
            if not mode & 0o001 and d not in [c[0] for c in changed]:
                changed.append((d, mode))
                d.chmod(mode | 0o001)
    return changed


def make_sif(path: Path) -> Path:
    """A real SIF file that holds only a definition (siftool), as the apptainer double requires. With no root
    filesystem partition the double runs the command on the host: these are tests of the launcher's plumbing with
    the host's Python, not of an image (a SIF with a partition runs inside it, which an empty one cannot)."""
    import subprocess
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        deffile = Path(d) / "image.def"
        deffile.write_text("Bootstrap: docker\nFrom: debian:12-slim\n")
        subprocess.run(["siftool", "new", str(path)], check=True, capture_output=True)
        subprocess.run(["siftool", "add", str(path), str(deffile), "--datatype", "1"], check=True,
                       capture_output=True)
    return path
