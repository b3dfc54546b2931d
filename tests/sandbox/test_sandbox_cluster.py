"""The sandbox against real Slurm 22.05 + munge: nodes, hostnames and IPs, fake GPUs, a 2-node torchrun job,
idempotent up, crash recovery, and a down that leaves no process, namespace or mount (each checked)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers_registry import ROOT

from shipyard import procs, registry
from shipyard import sandbox as sb
from shipyard.commands import demo
from shipyard.errors import ShipyardError
from shipyard.sandbox import start as sandbox_start

pytestmark = pytest.mark.slurm
CLUSTER = registry.load(ROOT / "registry.yaml").cluster("sandbox")  # not the current directory's registry


def test_two_idle_nodes(sandbox):
    """Both nodes idle (the session's sandbox is shared: wait out jobs other areas' tests may still be ending)."""
    deadline = time.monotonic() + 120
    while True:
        res = sandbox.run(["sinfo", "-h", "-N", "-o", "%N %P %t %G"])
        assert res.returncode == 0, res.stderr
        rows = sorted(res.stdout.split("\n")[:-1])
        if rows == ["node1 debug* idle gpu:2", "node2 debug* idle gpu:2"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rows == ["node1 debug* idle gpu:2", "node2 debug* idle gpu:2"], sandbox.run(["squeue"]).stdout
    assert sandbox.nodes == ["node1", "node2"]


def test_srun_two_hostnames_and_two_ips(sandbox):
    res = sandbox.run(["srun", "-N2", "-l", "bash", "-c", "echo $(hostname) $(hostname -I)"])
    assert res.returncode == 0, res.stderr
    seen = dict(line.split(": ", 1) for line in res.stdout.splitlines())
    hosts = sorted(v.split()[0] for v in seen.values())
    ips = sorted(v.split()[1] for v in seen.values())
    assert hosts == ["node1", "node2"]
    assert ips == sorted(n["ip"] for n in sandbox.info["nodes"]) and len(set(ips)) == 2
    assert all(ip.startswith("10.77.") and ip.endswith((".11", ".12")) for ip in ips)  # a /24 of the data's range


def test_nodes_resolve_each_other_and_see_this_python(sandbox):
    res = sandbox.run(["srun", "-N1", "-w", "node1", "bash", "-c", "getent hosts node2; command -v python"])
    assert res.returncode == 0, res.stderr
    node2 = next(n["ip"] for n in sandbox.info["nodes"] if n["name"] == "node2")
    assert res.stdout.split()[:2] == [node2, "node2"]
    assert res.stdout.split()[-1] == str(Path(sys.executable).parent / "python")


def test_a_jobs_own_srun_finds_slurm_conf_without_slurm_conf(sandbox, tmp_path):
    """On a node, Slurm's default configuration path (/etc/slurm) holds the sandbox's files, as on a real compute
    node: a job step started with $SLURM_CONF dropped (Snakemake's jobstep plugin drops it) still reaches the
    controller. The host's /etc/slurm is untouched (the bind exists only in the nodes' mount namespaces)."""
    host_before = sorted(os.listdir("/etc/slurm"))
    out = tmp_path / "job.out"
    res = sandbox.run(["sbatch", "--wait", "-N1", "-w", "node2", "-o", str(out), "--wrap",
                       'env -u SLURM_CONF srun -n1 hostname && cmp /etc/slurm/slurm.conf "$SLURM_CONF"'],
                      client_timeout=120)
    assert res.returncode == 0, (res.stderr, out.read_text() if out.exists() else "")
    assert out.read_text().split() == ["node2"]
    assert sorted(os.listdir("/etc/slurm")) == host_before


def test_fake_gpus_accepted_and_bounded(sandbox):
    ok = sandbox.run(["srun", "-N2", "--gpus-per-node=2", "bash", "-c", "echo $CUDA_VISIBLE_DEVICES"])
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["0,1", "0,1"]
    bad = sandbox.run(["srun", "-N2", "--gpus-per-node=3", "true"])
    assert bad.returncode != 0 and "Requested node configuration is not available" in bad.stderr


@pytest.mark.slow
def test_two_node_torchrun_job_world_size_four(sandbox, tmp_path):
    """The demo's job (shipyard.launch's host-runtime launcher): sbatch, c10d rendezvous on the first node, gloo
    all-reduce, world size 4, exit 0. The project is a copy in tmp_path, so launch/ is written there."""
    shutil.copy(ROOT / "registry.yaml", tmp_path / "registry.yaml")
    (tmp_path / "definitions").mkdir()  # the environment's hash lock: render refuses an environment without one
    shutil.copy(ROOT / "definitions" / "pytorch-2.3.lock", tmp_path / "definitions" / "pytorch-2.3.lock")
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "train.py", tmp_path / "examples" / "train.py")
    reg = registry.load(tmp_path / "registry.yaml")
    job = demo.run_job(reg, sandbox.info, steps=10, timeout=300)
    assert Path(job["script"]).parent == tmp_path / "launch"
    log = Path(job["log"]).read_text()
    assert job["state"] == "COMPLETED" and job["exit"] == "0:0", log[-3000:]
    assert "--rdzv_backend=c10d" in Path(job["script"]).read_text()
    r = job["result"]
    assert r["world_size"] == 4 and r["ranks"] == [0, 1, 2, 3]
    assert r["last_loss"] < r["first_loss"]
    text, ok = demo.report(job, 2, 2)
    assert ok, text


@pytest.mark.slow
def test_invoke_demo_end_to_end(sandbox, tmp_path, invoke):
    """The README's main command, as a user runs it: renders, reuses the running sandbox, trains, prints."""
    shutil.copy(ROOT / "registry.yaml", tmp_path / "registry.yaml")
    (tmp_path / "definitions").mkdir()  # the environment's hash lock: render refuses an environment without one
    shutil.copy(ROOT / "definitions" / "pytorch-2.3.lock", tmp_path / "definitions" / "pytorch-2.3.lock")
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "train.py", tmp_path / "examples" / "train.py")
    env = dict(os.environ, SHIPYARD_REGISTRY=str(tmp_path / "registry.yaml"),
               SHIPYARD_SANDBOX_DIR=str(sandbox.directory))
    res = invoke("demo", "--steps", "20", cwd=ROOT, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert (tmp_path / "definitions" / "pytorch-2.3.def").exists()
    assert "already running" in out
    assert re.search(r"^job \d+: COMPLETED \(exit 0:0\)", out, re.M), out
    assert re.search(r"^training: world size 4 \(ranks 0, 1, 2, 3 reported\), steps 0->20, loss .* \(going down\)$",
                     out, re.M), out
    log = re.search(r"^log: (.*)$", out, re.M)[1]
    assert Path(log).parent == tmp_path / "launch" / "logs" and "result: world_size=4" in Path(log).read_text()
    assert out.rstrip().splitlines()[-1] == demo.STAYS_UP  # the sandbox outlives the demo, and it says how to stop it


def test_up_twice_is_idempotent(sandbox):
    before = json.loads((sandbox.directory / "state.json").read_text())["processes"]
    info = sb.up(directory=sandbox.directory, cluster=CLUSTER)
    assert info["already_running"] is True and info["nodes"] == sandbox.info["nodes"]
    after = json.loads((sandbox.directory / "state.json").read_text())["processes"]
    assert after == before
    with pytest.raises(ShipyardError, match="already runs with 2 nodes x 2 GPUs"):
        sb.up(nodes=3, directory=sandbox.directory, cluster=CLUSTER)


def test_status_env_file_and_exec_cli(sandbox, invoke):
    text = sb.status(sandbox.directory)
    assert "up since" in text and re.search(r"^node1 debug\* \w+ 2 4000 gpu:2$", text, re.M) and "JOBID" in text
    res = subprocess.run(["bash", "-c", '. "$1" && sinfo -h -N -o "%N %P"', "bash",
                          str(sandbox.directory / "env.sh")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.split() == ["node1", "debug*", "node2", "debug*"], res.stderr
    res = invoke("sandbox.exec", "-d", str(sandbox.directory), "--",
                 "srun", "-N1", "bash", "-c", 'printf "[%s]\\n" "$1"', "x", "a  b $(id)", cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "[a  b $(id)]\n"


def test_two_users_use_the_sandbox_as_themselves_with_slurm_conf_alone(sandbox):
    """Two real unprivileged accounts submit, watch, cancel and srun with Slurm's own clients and SLURM_CONF, as on
    a login node: no nsenter, no root. Each job runs under its submitter's uid and writes into its submitter's own
    folder; one user cannot cancel the other's job."""
    import uuid

    from fixtures_launch import as_user, make_user, wait_job

    assert sandbox.info.get("host_access") is True, sandbox.info.get("host_access")
    base = Path(tempfile.mkdtemp(prefix="shipyard-users-"))
    base.chmod(0o755)
    tag = uuid.uuid4().hex[:6]
    names = [f"sy-usr-a{tag}", f"sy-usr-b{tag}"]
    # what a student's own login shell has: no shipyard, no root's PATH, only the line STUDENTS.md gives
    plain = {"PATH": "/usr/local/bin:/usr/bin:/bin", "SLURM_CONF": str(sandbox.directory / "etc" / "slurm.conf"),
             "LANG": "C.UTF-8"}

    def as_(u, script: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([*as_user(u), "bash", "-c", f"cd && {script}"], env=plain, capture_output=True,
                              text=True, timeout=timeout)

    try:
        users = [make_user(n, base / n) for n in names]
        done, held = {}, {}
        for u in users:
            Path(u.pw_dir).chmod(0o700)
            res = as_(u, "printf '#!/bin/sh\\nid -u\\nhostname\\n' > job.sh && "
                         "sbatch --parsable -N1 -o 'out-%j.txt' job.sh && sbatch --parsable -N1 -o /dev/null "
                         "--wrap 'sleep 300'")
            assert res.returncode == 0, res.stderr
            done[u.pw_name], held[u.pw_name] = res.stdout.split()
        a, b = users
        mine = as_(a, "squeue --me -h -o %i")
        assert mine.returncode == 0, mine.stderr
        assert held[a.pw_name] in mine.stdout.split() and held[b.pw_name] not in mine.stdout.split()
        theirs = as_(a, f"scancel {held[b.pw_name]}")
        assert theirs.returncode != 0 and "ermission" in theirs.stderr, theirs
        for u in users:
            own = as_(u, f"scancel {held[u.pw_name]}")
            assert own.returncode == 0, own.stderr
            fields = wait_job(sandbox, done[u.pw_name], timeout=120)
            assert fields.get("JobState") == "COMPLETED" and fields["UserId"].startswith(u.pw_name), fields
            out = Path(u.pw_dir) / f"out-{done[u.pw_name]}.txt"
            assert out.read_text().split()[0] == str(u.pw_uid) and out.stat().st_uid == u.pw_uid
            show = as_(u, f"scontrol show job {done[u.pw_name]}")
            assert show.returncode == 0 and "JobState=COMPLETED" in show.stdout, show.stderr
            # an srun from the host: the nodes connect back to it on the host's leg of the sandbox network
            step = as_(u, "srun -N1 id -u", timeout=120)
            assert step.returncode == 0 and step.stdout.split() == [str(u.pw_uid)], step.stderr
    finally:
        for name in names:
            subprocess.run(["userdel", "--remove", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ a throwaway sandbox


def _netns_members(inodes: set[int]) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino in inodes:
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def _suspect_mounts(directory: Path, inodes: set[int] = frozenset()) -> list[str]:
    """Mounts a sandbox could leave behind: anything under its directory, /etc/hosts binds, and a bind of one of its
    network namespaces (``inodes``; nsfs, as `ip netns` makes). Only its own namespaces: the other test runs of
    `invoke test` go on beside this one, and their dockerd mounts namespaces of its own meanwhile."""
    ours = tuple(f" net:[{i}] " for i in inodes)
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(directory) in line or " /etc/hosts " in line or (" nsfs " in line and any(o in line for o in ours))]


@pytest.fixture
def throwaway():
    """A second sandbox, 2 nodes, in its own directory (separate namespaces, so it coexists with `sandbox`)."""
    if sb.cannot_run_reason():
        pytest.skip(sb.cannot_run_reason())
    d = Path(tempfile.mkdtemp(prefix="shipyard-sandbox-t-"))
    d.chmod(0o755)
    yield d
    sb.down(d)
    subprocess.run(["rm", "-rf", str(d)])


def test_crash_recovery_and_down_leaves_nothing(throwaway):
    mounts_before = _suspect_mounts(throwaway)
    sb.up(directory=throwaway, cluster=CLUSTER)
    state = json.loads((throwaway / "state.json").read_text())
    by_role = {p["role"]: p for p in state["processes"]}
    assert set(by_role) == {"munged", "ns:ctl", "ns:node1", "ns:node2", "slurmctld", "slurmd-node1", "slurmd-node2"}

    # A daemon dies: the sandbox is no longer up, status and the start check name it and its log; up recovers.
    os.kill(by_role["slurmd-node2"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while sb.is_up(throwaway) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sb.is_up(throwaway)
    assert "stopped: slurmd-node2" in sb.status(throwaway)
    err = sandbox_start._dead_daemon_error(sb.make_plan(throwaway, cluster=CLUSTER), state)
    assert "slurmd-node2 exited" in str(err) and str(throwaway / "log" / "slurmd-node2.log") in str(err)
    info = sb.up(directory=throwaway, cluster=CLUSTER)
    assert info["already_running"] is False and sb.is_up(throwaway)

    # A running job, so that down must also end job processes inside the namespaces.
    state = json.loads((throwaway / "state.json").read_text())
    res = sb.run_client(["sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap", "srun sleep 300"],
                        throwaway,
                        capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        q = sb.run_client(["squeue", "-h", "-j", job, "-o", "%T"], throwaway, capture_output=True, text=True)
        if q.stdout.strip() == "RUNNING":
            break
        time.sleep(0.1)
    assert q.stdout.strip() == "RUNNING"
    holders = [p["pid"] for p in state["processes"] if p["role"].startswith("ns:")]
    inodes = {os.stat(f"/proc/{pid}/ns/net").st_ino for pid in holders}
    members = _netns_members(inodes)
    deadline = time.monotonic() + 10
    while not any(Path(f"/proc/{p}/comm").read_text().strip() == "sleep" for p in members if p not in holders) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
        members = _netns_members(inodes)
    assert len(members) > len(state["processes"]) - 1  # daemons, holders and the job's processes

    assert "stopped" in sb.down(throwaway)

    for p in state["processes"]:  # each recorded process is gone (or its PID belongs to a new process)
        assert not procs.alive(p), p
    assert _netns_members(inodes) == []  # no process in any of the namespaces: they no longer exist
    assert _suspect_mounts(throwaway, inodes) == mounts_before
    assert not (throwaway / "state.json").exists() and not (throwaway / "etc").exists()
    assert not throwaway.exists()  # nothing else was in it
    assert not sb.is_up(throwaway)


def test_down_keep_keeps_logs(throwaway):
    sb.up(nodes=1, gpus_per_node=1, directory=throwaway, cluster=CLUSTER)
    assert "files kept" in sb.down(throwaway, keep=True)
    assert (throwaway / "log" / "slurmctld.log").exists() and not sb.is_up(throwaway)
    assert json.loads((throwaway / "state.json").read_text())["status"] == "down"


def test_occupied_port_is_named(throwaway):
    """A real listener inside a real namespace: the port check names the port and the process holding it."""
    listener = subprocess.Popen(
        ["unshare", "--net", "--", sys.executable, "-c",
         "import socket,subprocess,time\n"
         "subprocess.run(['ip','link','set','lo','up'],check=True)\n"
         "s=socket.socket(); s.bind(('127.0.0.1',6817)); s.listen(); print('ready',flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "ready"
        with pytest.raises(ShipyardError) as exc:
            sandbox_start.check_port_free(listener.pid, "127.0.0.1", 6817, "ctl")
        msg = str(exc.value)
        assert "port 6817/tcp" in msg and "in namespace ctl" in msg and f"pid {listener.pid}" in msg
        sandbox_start.check_port_free(listener.pid, "127.0.0.1", 6818, "ctl")  # a free port passes
    finally:
        listener.kill()
        listener.wait()


def test_unreachable_directory_is_refused(tmp_path):
    """pytest's tmp dirs are 0700: munged (user munge) could not reach its socket there; say so before starting."""
    if sb.cannot_run_reason():
        pytest.skip(sb.cannot_run_reason())
    os.chmod(tmp_path, 0o700)
    with pytest.raises(ShipyardError, match="not searchable by others"):
        sb.up(directory=tmp_path / "sb", install=False, cluster=CLUSTER)
    assert not sb.is_up(tmp_path / "sb")


def test_socket_of_localhost_untouched(sandbox):
    """The sandbox's ports exist only inside its namespaces: nothing listens on the host's 6817/6818."""
    for port in (6817, 6818):
        with socket.socket() as s:
            s.settimeout(1)
            assert s.connect_ex(("127.0.0.1", port)) != 0


def test_fixture_tears_down_after_a_failing_test(tmp_path):
    """A session whose test fails still stops the sandbox its fixture started: no process of it, no directory."""
    if sb.cannot_run_reason():
        pytest.skip(sb.cannot_run_reason())
    record = tmp_path / "seen.json"
    (tmp_path / "test_inner.py").write_text(
        "import json, pathlib\n"
        "def test_fails(sandbox):\n"
        "    state = json.loads((sandbox.directory / 'state.json').read_text())\n"
        f"    pathlib.Path({str(record)!r}).write_text(json.dumps({{'dir': str(sandbox.directory), "
        "'procs': state['processes']}))\n"
        "    assert sandbox.run(['sinfo', '-h']).returncode == 0\n"
        "    assert False, 'this test fails on purpose'\n")
    env = {k: v for k, v in os.environ.items() if k != sb.DIR_ENV}
    env["PYTHONPATH"] = str(ROOT / "tests") + os.pathsep + str(ROOT)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "fixtures_sandbox", "-p", "no:cacheprovider",
                          str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 1 and "1 failed" in res.stdout, res.stdout + res.stderr
    seen = json.loads(record.read_text())
    assert len(seen["procs"]) == 7
    for p in seen["procs"]:
        assert not procs.alive(p), p
    assert not Path(seen["dir"]).exists()


def test_wait_for_idle_names_the_failing_daemon_and_its_log(throwaway, monkeypatch):
    """The idle wait's two timeouts, provoked for real: a node that is not idle, and a controller that is stopped."""
    sb.up(directory=throwaway, cluster=CLUSTER)
    state = json.loads((throwaway / "state.json").read_text())
    pids = {p["role"]: p["pid"] for p in state["processes"]}
    plan = sb.make_plan(throwaway, cluster=CLUSTER)
    facts = json.loads(json.dumps(sb.facts()))
    facts["timeouts"]["idle_s"] = 1
    monkeypatch.setattr(sandbox_start, "facts", lambda: facts)  # start.py reads the idle timeout

    res = sb.run_client(["scontrol", "update", "nodename=node2", "state=drain", "reason=test"], throwaway,
                        capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    with pytest.raises(ShipyardError) as exc:
        sandbox_start._wait_idle(plan, state, pids["ns:ctl"])
    msg = str(exc.value)
    assert "node node2 is 'drain', not idle" in msg and str(throwaway / "log" / "slurmd-node2.log") in msg

    os.kill(pids["slurmctld"], signal.SIGSTOP)
    try:
        with pytest.raises(ShipyardError) as exc:
            sandbox_start._wait_idle(plan, state, pids["ns:ctl"])
    finally:
        os.kill(pids["slurmctld"], signal.SIGCONT)
    msg = str(exc.value)
    assert "slurmctld did not answer within 1 s" in msg and str(throwaway / "log" / "slurmctld.log") in msg
