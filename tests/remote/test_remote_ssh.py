"""From a "laptop" to the sandbox through two real sshd (tests/remote/conftest.py): one one-time-code login for the
whole run, the project synced, a 2-node job with hostile arguments submitted, followed and listed over the shared
connection, and a clean one-line refusal once the connection is gone (docs/remote.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures_launch import HOSTILE_ARGS, PROBE

from shipyard import slurm
from shipyard.remote import transport

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent.parent
# the words the job gets: a space, $(...), ';' and a newline among them (the launch tests' hostile set)
ARGS = HOSTILE_ARGS


def remote_block(root: Path, sandbox_dir: Path) -> str:
    """clusters.sandbox's login and remote keys: the login host runs this checkout's shipyard in this Python, and
    reaches Slurm through the sandbox's env.sh (as a site's `module load slurm` would)."""
    bindir = Path(sys.executable).parent
    prelude = (f"export PATH={bindir}:$PATH PYTHONPATH={REPO}\n"
               f". {sandbox_dir}/env.sh")
    body = "\n".join("        " + line for line in prelude.splitlines())
    return (f"    login: cluster-login\n    remote:\n      root: {root}\n"
            f"      invoke: {sys.executable} -m invoke -r {REPO}\n      prelude: |\n{body}\n")


@pytest.fixture
def laptop(sandbox, ssh_hosts, make_project, tmp_path):
    """A git project whose registry.yaml's sandbox cluster is reached over ssh; returns its directory."""
    reg = make_project("repo", name="laptop-proj")
    root = reg.root
    text = (root / "registry.yaml").read_text()
    remote_root = ssh_hosts.directory / "cluster-storage"
    text = text.replace("  sandbox:\n", "  sandbox:\n" + remote_block(remote_root, sandbox.directory), 1)
    (root / "registry.yaml").write_text(text)
    (root / "probe.py").write_text(PROBE)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "laptop"], check=True)
    return root


def test_from_a_laptop_one_otp_login_for_the_whole_run(laptop, ssh_hosts, invoke, monkeypatch):
    env = ssh_hosts.env()
    env.pop("SHIPYARD_SANDBOX_DIR", None)  # the laptop has no sandbox: Slurm is reached only over ssh
    run = lambda *a, **k: invoke(*a, env=env, cwd=laptop, **k)  # noqa: E731

    res = run("remote.login", "sandbox", timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    dest_cfg = ["-F", str(ssh_hosts.config)]
    check = subprocess.run(["ssh", *dest_cfg, "-o", f"ControlPath={ssh_hosts.directory}/cache/shipyard/ssh/%C",
                            "-O", "check", "cluster-login"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert check.returncode == 0, check.stderr

    res = run("remote.sync", "sandbox")
    assert res.returncode == 0 and "synced" in res.stdout, res.stdout + res.stderr
    again = run("remote.sync", "sandbox")
    assert again.returncode == 0 and again.stdout.startswith("nothing to transfer"), again.stdout + again.stderr
    shipped = ssh_hosts.directory / "cluster-storage" / "laptop-proj"
    record = json.loads((shipped / ".shipyard-shipped.json").read_text())
    head = subprocess.run(["git", "-C", str(laptop), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert record["commit"] == head.strip() and record["dirty"] is False

    res = run("launch", "--cluster", "sandbox", "--nodes", "2", "--name", "remote", "--submit", "--", "probe.py",
              *ARGS)
    assert res.returncode == 0, res.stdout + res.stderr
    job = re.search(r"submitted job (\d+)", res.stdout).group(1)

    follow = run("logs", job, "-f", "--cluster", "sandbox", timeout=300)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert "probe rank 0 done" in follow.stdout and "probe rank 1 done" in follow.stdout, follow.stdout[-2000:]
    header = (shipped / "launch" / "remote.sbatch").read_text()
    assert f"# code: commit {head.strip()}\n" in header, header[:800]
    # the laptop's own Slurm client over the transport: scontrol through the master
    monkeypatch.setenv("SHIPYARD_SSH_CONFIG", str(ssh_hosts.config))
    monkeypatch.setenv("XDG_CACHE_HOME", str(ssh_hosts.directory / "cache"))
    from shipyard import registry

    cluster = registry.load(laptop / "registry.yaml").cluster("sandbox")
    j = slurm.Job(cluster, job)
    assert j.state() == "COMPLETED"
    ranks = sorted((json.loads(p.read_text()) for p in (shipped / "probe-out").glob(f"{job}-*.json")),
                   key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["node"] for r in ranks} == {"node1", "node2"}
    for r in ranks:
        assert r["argv"] == list(ARGS)
        assert r["env"]["SHIPYARD_COMMIT"] == head.strip() and r["env"]["SHIPYARD_DIRTY"] == "0"

    status = run("status", "--cluster", "sandbox")
    assert status.returncode == 0 and job in status.stdout, status.stdout + status.stderr

    doctor = run("doctor", "--cluster", "sandbox", timeout=180)  # forwarded: the login node and one compute node
    assert doctor.returncode in (0, 1) and "storage" in doctor.stdout, doctor.stdout + doctor.stderr

    login_log = ssh_hosts.login_log.read_text(errors="replace")
    assert len(re.findall(r"Accepted keyboard-interactive/pam for root", login_log)) == 1, login_log[-3000:]
    assert f"port {ssh_hosts.login_port}" in ssh_hosts.jump_log.read_text(errors="replace")

    # the tar way (a laptop without rsync): nothing changed is nothing sent; an edit goes, and is recorded as dirty
    from shipyard.remote import sync as sync_stage

    assert sync_stage.sync(cluster, laptop, method="tar").changed == 0
    (laptop / "probe.py").write_text(PROBE + "# edited, not committed\n")
    tar = sync_stage.sync(cluster, laptop, method="tar")
    assert tar.changed and tar.dirty and (shipped / "probe.py").read_text().endswith("# edited, not committed\n")
    assert json.loads((shipped / ".shipyard-shipped.json").read_text())["dirty"] is True

    subprocess.run(["ssh", *dest_cfg, "-o", f"ControlPath={ssh_hosts.directory}/cache/shipyard/ssh/%C", "-O", "exit",
                    "cluster-login"], capture_output=True, stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    gone = run("status", "--cluster", "sandbox", timeout=30)
    took = time.monotonic() - t0
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1, gone.stderr
    assert "invoke remote.login sandbox" in gone.stderr and "Traceback" not in gone.stderr
    # no wait beyond the two bounded local steps (ssh -G, then ssh -O check): never the login's minutes
    ssh_policy = transport.policy()["ssh"]
    assert took < ssh_policy["resolve_timeout_s"] + ssh_policy["check_timeout_s"], took
    assert len(re.findall(r"Accepted keyboard-interactive/pam", ssh_hosts.login_log.read_text())) == 1
