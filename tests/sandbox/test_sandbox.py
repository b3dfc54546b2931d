"""The sandbox's generated files and checks that need no running cluster: golden files, real shellcheck, real bash
sourcing of the env file, flag and package checks, the demo's requirement and result parsing."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers_registry import GOLDEN, ROOT, golden

from shipyard import registry, sandbox
from shipyard.commands import demo
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError

GOLD = GOLDEN / "sandbox"
HOSTILE = "/tmp/it's a $(touch PWNED) dir;x"


@pytest.fixture(scope="module")
def reg():
    return registry.load(ROOT / "registry.yaml")


@pytest.fixture(scope="module")
def plan(reg):
    return sandbox.make_plan("/SANDBOX", cluster=reg.cluster("sandbox"))


def test_plan_follows_the_registry_cluster(reg, plan):
    c = reg.cluster("sandbox")
    assert [n.name for n in plan.nodes] == ["node1", "node2"] and len(plan.nodes) == c.nodes
    assert plan.gpus_per_node == c.gpus_per_node and plan.partition == c.partition
    assert len({n.ip for n in plan.nodes} | {plan.controller.ip}) == 3


@pytest.mark.parametrize("name", ["slurm.conf", "gres.conf", "hosts", "resolv.conf"])
def test_configs_golden(plan, name):
    golden(GOLD / name, sandbox.render_configs(plan)[name])


def test_config_never_points_at_etc_slurm(plan):
    for text in sandbox.render_configs(plan).values():
        assert not re.search(r"(^|[\s=(,])/etc/slurm", text, re.M)
    conf = sandbox.render_configs(plan)["slurm.conf"]
    assert "AuthInfo=socket=/SANDBOX/run/munge/munge.socket" in conf
    assert "Gres=gpu:2" in conf and "NodeAddr=10.77.0.12" in conf


def test_env_sh_golden_and_shellcheck(plan, tmp_path):
    text = sandbox.render_env_sh(plan, "/proc/4242/ns/net", "/opt/py/bin")
    golden(GOLD / "env.sh", text)
    (tmp_path / "env.sh").write_text(text)
    subprocess.run(["shellcheck", "-S", "warning", str(tmp_path / "env.sh")], check=True)


def test_env_sh_without_the_hosts_leg_enters_the_namespace(plan, tmp_path):
    """Where the host could not join the sandbox's network the clients keep root's route into the namespace."""
    text = sandbox.render_env_sh(plan, "/proc/4242/ns/net", "/opt/py/bin", host_access=False)
    (tmp_path / "env.sh").write_text(text)
    subprocess.run(["shellcheck", "-S", "warning", str(tmp_path / "env.sh")], check=True)
    assert "nsenter --net=/proc/4242/ns/net -- env SLURM_CONF=/SANDBOX/etc/slurm.conf" in text
    assert "nsenter" not in sandbox.render_env_sh(plan, "/proc/4242/ns/net", "/opt/py/bin")


@pytest.mark.parametrize(("addresses", "routes", "taken"), [
    (["2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0"],
     ["default via 192.0.2.1 dev eth0", "192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2"], None),
    (["5: shipyard-sb0    inet 10.77.0.254/24 scope global shipyard-sb0"], [], "address 10.77.0.254/24 on shipyard-sb0"),
    ([], ["10.0.0.0/8 via 192.0.2.1 dev eth0"], "route 10.0.0.0/8 via 192.0.2.1 dev eth0"),
    ([], ["10.77.0.128/25 dev wg0"], "route 10.77.0.128/25 dev wg0"),
])
def test_host_leg_only_where_the_network_is_free(plan, addresses, routes, taken):
    """The default route does not claim the sandbox's network (it is why a client without the leg reached a stranger);
    an address or a narrower or wider route into it does."""
    from shipyard.sandbox.plan import host_overlap

    assert host_overlap(plan, addresses, routes) == taken


def test_env_sh_quotes_a_hostile_directory(reg, tmp_path):
    """Sourced by real bash, the exported paths are exactly the hostile directory's, and nothing ran."""
    hostile = sandbox.make_plan(HOSTILE, cluster=reg.cluster("sandbox"))
    env_sh = tmp_path / "env.sh"
    env_sh.write_text(sandbox.render_env_sh(hostile, "/proc/1/ns/net", "/opt/p y/bin"))
    subprocess.run(["shellcheck", "-S", "warning", str(env_sh)], check=True)
    out = subprocess.run(["bash", "-c", '. "$1" && printf "%s\\n" "$SLURM_CONF" "$SHIPYARD_SANDBOX_DIR" && '
                          'type -t sbatch', "bash", str(env_sh)], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == [f"{HOSTILE}/etc/slurm.conf", HOSTILE, "function"]
    assert not list(tmp_path.glob("PWNED*"))


@pytest.mark.parametrize("value", ["x", "0", "65", "-1", "1.5", ""])
def test_bad_node_count_is_one_clear_error(reg, value):
    with pytest.raises(ShipyardError, match=r"^--nodes .*integer from 1 to 64"):
        sandbox.make_plan("/S", nodes=value, cluster=reg.cluster("sandbox"))


def test_flag_strings_become_counts(reg):
    p = sandbox.make_plan("/S", nodes="3", gpus_per_node="1", cluster=reg.cluster("sandbox"))
    assert [n.ip for n in p.nodes] == ["10.77.0.11", "10.77.0.12", "10.77.0.13"] and p.gpus_per_node == 1


def test_missing_packages_are_named_with_the_apt_command(tmp_path, monkeypatch):
    """With an empty PATH every binary is missing: --no-install refuses naming binaries and packages."""
    assert set(sandbox.missing_packages(path=str(tmp_path))) == set(sandbox.facts()["packages"])
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ShipyardError) as exc:
        sandbox.ensure_packages(install=False)
    msg = str(exc.value)
    assert "missing" in msg and "slurmctld" in msg and "apt-get install -y" in msg and "munge" in msg
    assert "\n" not in msg
    if not sandbox.cannot_run_reason():  # the whole `sandbox.up --no-install` path refuses the same way
        with pytest.raises(ShipyardError, match="missing .*slurmctld.*apt-get install -y"):
            sandbox.up(directory=tmp_path / "sb", install=False,
                       cluster=registry.load(ROOT / "registry.yaml").cluster("sandbox"))
        assert not sandbox.is_up(tmp_path / "sb")


def test_nothing_missing_here():
    assert sandbox.missing_packages() == {}


def test_client_argv_refuses_when_not_running(tmp_path):
    with pytest.raises(ShipyardError, match="not running .*invoke sandbox.up"):
        sandbox.client_argv(["sinfo"], tmp_path)
    assert not sandbox.is_up(tmp_path)
    assert "down" in sandbox.status(tmp_path)


def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.setenv(sandbox.DIR_ENV, str(tmp_path / "sb"))
    assert sandbox.default_directory() == tmp_path / "sb"
    monkeypatch.delenv(sandbox.DIR_ENV)
    # one sandbox per machine: the same directory whichever registry or working directory is in use
    seen = set()
    for reg, cwd in ((ROOT / "registry.yaml", ROOT), (ROOT / "examples" / "course" / "registry.yaml", tmp_path)):
        monkeypatch.setenv("SHIPYARD_REGISTRY", str(reg))
        monkeypatch.chdir(cwd)
        seen.add(sandbox.default_directory())
    assert seen == {Path("/var/tmp/shipyard-sandbox")}


def test_cannot_run_reason_names_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in sandbox.cannot_run_reason()
    with pytest.raises(ShipyardError, match="needs root"):
        sandbox.up(directory="/nonexistent-sandbox", cluster=registry.load(ROOT / "registry.yaml").cluster("sandbox"))


def test_client_env_puts_this_python_first(tmp_path):
    env = sandbox.client_env(tmp_path)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(os.sys.executable).parent)
    assert env["SLURM_CONF"] == str(tmp_path / "etc" / "slurm.conf")


# ------------------------------------------------------------------------------------------------ demo pieces


def test_unsatisfied_requirements():
    assert demo.unsatisfied(["torch==2.13.0"]) == []  # the local build is 2.13.0+cpu
    assert demo.unsatisfied(["torch==0.0.1", "no-such-package-shipyard==1.0"]) == ["torch==0.0.1",
                                                                                  "no-such-package-shipyard==1.0"]
    with pytest.raises(ShipyardError, match="host_requirements"):
        demo.unsatisfied(["torch=="])


LOG = """job 7: nodes node[1-2], rendezvous node1:29500
rank 0/4 step 1 loss 15.0000
rank 2/4 step 1 loss 14.0000rank 1/4 step 1 loss 13.0000
rank 3/4 step 1 loss 12.0000
result: world_size=4 start_step=0 end_step=60 first_loss=15.0226 last_loss=0.0814 checkpoint=/x/demo.pt
"""


def test_parse_result_and_report():
    r = demo.parse_result(LOG)
    assert r == {"world_size": 4, "start_step": 0, "end_step": 60, "first_loss": 15.0226, "last_loss": 0.0814,
                 "ranks": [0, 1, 2, 3]}
    job = {"job": "7", "state": "COMPLETED", "exit": "0:0", "seconds": 9.5, "script": "/s", "log": "/l", "result": r}
    text, ok = demo.report(job, 2, 2)
    assert ok and "world size 4" in text and "going down" in text and "job 7" in text and "log: /l" in text
    assert not demo.report(job, 3, 2)[1]  # wrong world size
    assert not demo.report(dict(job, state="FAILED"), 2, 2)[1]
    assert not demo.report(dict(job, result=None), 2, 2)[1]
    assert demo.parse_result("no result here") is None


def test_demo_falls_back_to_rendering_only(tmp_path, monkeypatch, capsys):
    """Where the sandbox cannot run, the demo renders, says why in one line, and exits 0."""
    shutil.copy(ROOT / "registry.yaml", tmp_path / "registry.yaml")
    (tmp_path / "definitions").mkdir()  # a clone has the lock render checks the environment against
    shutil.copy(ROOT / "definitions" / "pytorch-2.3.lock", tmp_path / "definitions")
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(tmp_path / "registry.yaml"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert demo.demo(Context.load()) == 0
    out = capsys.readouterr().out
    assert list((tmp_path / "definitions").glob("pytorch-2.3.def"))
    last = out.strip().splitlines()[-1]
    assert last.startswith("demo: rendered only") and "needs root" in last
    assert not (tmp_path / ".sandbox").exists()


def test_stop_also_ends_what_starts_inside_while_the_first_ones_stop(tmp_path):
    """``sandbox.down`` leaves no process in the sandbox's namespaces, including one started there *while* the first
    ones stop (slurmd runs the epilog of a job it kills, and one was found left). Real processes in a real network
    namespace: a holder, and a "daemon" in its namespace that starts a new process when it gets SIGTERM."""
    import time

    from shipyard import procs
    from shipyard.sandbox import state as sandbox_state

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("needs root, unshare and nsenter (a network namespace)")
    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "600"])
    late = tmp_path / "late.pid"
    daemon = None
    try:
        deadline = time.monotonic() + 10
        while procs.netns_inode(holder.pid) == procs.netns_inode(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.02)  # unshare has not made its namespace yet
        inode = procs.netns_inode(holder.pid)
        assert inode != procs.netns_inode(os.getpid())
        ready = tmp_path / "ready"
        daemon = subprocess.Popen(["nsenter", f"--net=/proc/{holder.pid}/ns/net", "--", "sh", "-c",
                                   f"trap 'sleep 600 & echo $! > {late}; exit 0' TERM; : > {ready}; "
                                   "while :; do sleep 0.1; done"])
        # in the namespace with its trap set (a SIGTERM before the trap would end it quietly on a busy machine)
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists() and procs.netns_inode(daemon.pid) == inode

        def rec(role, pid):
            return {"role": role, "pid": pid, "start": procs.proc_stat(pid)[1]}

        state = {"processes": [rec("ns:node1", holder.pid), rec("slurmd-node1", daemon.pid)]}
        sandbox_state.stop(state, tmp_path)
        assert late.is_file(), "the daemon did not start its process on SIGTERM"
        pid = int(late.read_text())
        assert procs.proc_stat(pid) is None or procs.proc_stat(pid)[0] in ("Z", "X"), "the late process lives on"
        assert procs.netns_inode(holder.pid) is None and state["status"] == "down"
    finally:
        for p in (holder, daemon):
            if p is not None:
                p.kill()
                p.wait()
        if late.is_file():  # the late process, when stop missed it
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(late.read_text()), 9)


def test_info_line_says_how_other_users_reach_it():
    info = {"directory": "/S", "already_running": True, "partition": "debug", "gpus_per_node": 2,
            "nodes": [{"hostname": "node1", "ip": "10.77.0.11"}], "env_file": "/S/env.sh", "conf": "/S/etc/slurm.conf"}
    assert sandbox.info_line(dict(info, host_access=True)).endswith(
        "\n  any local user, as themselves: export SLURM_CONF=/S/etc/slurm.conf")
    assert sandbox.info_line(dict(info, host_access="the host already has route 10.0.0.0/8")).endswith(
        "\n  other users cannot reach it: the host already has route 10.0.0.0/8")
    assert "SLURM_CONF" not in sandbox.info_line(info)


def test_a_second_sandbox_gets_the_next_network_and_a_link_of_its_own(plan):
    """Several sandboxes on one machine (each test process starts its own): the next one is planned on the next
    /24, host numbers kept, its host leg named with the network's number, so each can give the host its own leg."""
    from shipyard.sandbox.plan import shifted

    q = shifted(plan, 3)
    assert q.controller.ip == "10.77.3.1" and [n.ip for n in q.nodes] == ["10.77.3.11", "10.77.3.12"]
    assert q.host_ip == "10.77.3.254" and q.host_link == "shipyard-sb3" and shifted(plan, 0) == plan
