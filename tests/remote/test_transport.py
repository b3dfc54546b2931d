"""The ssh transport without a network: the remote command string (each word quoted once), the words a forwarded
command sends, and the refusal without a shared connection (one line, exit 2, well under 5 s)."""

from __future__ import annotations

import subprocess
import time

import pytest

from shipyard import registry, slurm
from shipyard.commands.remote import task_words
from shipyard.errors import ShipyardError
from shipyard.remote import transport

CLUSTER = """\
environments:
  e: {torch: "2.5.1", cuda: "12.4", python: "3.11", os: ubuntu22.04}
clusters:
  far:
    runtime: host
    fabric: socket
    gpus_per_node: 0
    scheduler: {partition: p}
    login: far-login
    remote:
      root: /scratch/me
      prelude: |
        module load slurm
defaults: {environment: e, cluster: far}
"""
WORDS = ["probe.py", "two words", "$(touch /tmp/pwned)", "a;b", "line1\nline2", "it's", ""]


@pytest.fixture
def far(tmp_path, monkeypatch):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host far-login\n  HostName 127.0.0.1\n  Port 1\n  User nobody\n")
    monkeypatch.setenv("SHIPYARD_SSH_CONFIG", str(cfg))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SHIPYARD_ON_CLUSTER", raising=False)
    return registry.load_text(CLUSTER, "registry.yaml", path=tmp_path / "registry.yaml").cluster("far")


def test_the_remote_script_quotes_each_word_once_and_bash_gets_them_back(far):
    script = transport.remote_script(far, ["printf", "%s\\0", *WORDS], cwd="/")
    assert script.startswith("set -e\nmodule load slurm\ncd -- /\nset +e\n")
    body = script.split("set +e\n", 1)[1]
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True).stdout
    assert out.split("\0")[:-1] == WORDS


def test_ssh_never_prompts_and_sends_the_script_as_one_argument(far):
    dest = transport.resolve(far)
    assert dest.hostname == "127.0.0.1" and dest.own_control_path
    argv = transport.ssh_argv(dest, "true")
    assert argv[-3:] == ["--", "far-login", "true"]
    assert "BatchMode=yes" in argv and "ControlMaster=no" in argv and f"ControlPath={dest.control_path}" in argv


def test_without_the_shared_connection_every_remote_command_is_one_line_naming_remote_login(far):
    t0 = time.monotonic()
    with pytest.raises(ShipyardError) as err:
        slurm.query(far, ["squeue", "--me"])
    assert time.monotonic() - t0 < 5
    assert "invoke remote.login far" in str(err.value) and "\n" not in str(err.value) and err.value.exit_code == 2


def test_on_the_login_node_the_cluster_is_local(far, monkeypatch):
    monkeypatch.setenv("SHIPYARD_ON_CLUSTER", "far")
    assert not transport.is_remote(far)
    assert slurm.route(far, ["squeue"])[0] == ["squeue"]


def test_forwarded_words_drop_only_invokes_own_flags_before_the_task():
    argv = ["/venv/bin/invoke", "-r", "/src/shipyard", "logs", "12", "-f", "--cluster", "far"]
    assert task_words(argv) == ["logs", "12", "-f", "--cluster", "far"]
    assert task_words(["invoke", "launch", "--", "x", "-r", "y"]) == ["launch", "--", "x", "-r", "y"]


def test_remote_needs_login():
    with pytest.raises(ShipyardError, match="login"):
        registry.load_text(CLUSTER.replace("    login: far-login\n", ""), "registry.yaml")


def test_a_forwarded_command_runs_the_shipyard_command_there_by_default(far, monkeypatch):
    """The synced folder is a course folder as often as a checkout, and only the console command `shipyard` finds the
    tasks in a folder without tasks.py (`invoke` there: "Can't find any collection named 'tasks'")."""
    from types import SimpleNamespace

    from shipyard.commands import remote

    seen = {}

    def script(cl, argv, *, cwd, raw, env):
        seen["raw"] = raw
        raise SystemExit(0)

    monkeypatch.setattr(transport, "require_master", lambda cl: None)
    monkeypatch.setattr(transport, "remote_script", script)
    ctx = SimpleNamespace(root=SimpleNamespace(name="dl-course"), out=SimpleNamespace(flush=lambda: None),
                          registry=SimpleNamespace(path=SimpleNamespace(name="registry.yaml")))
    with pytest.raises(SystemExit):
        remote.forward(ctx, far, ["shipyard", "logs", "12", "--cluster", "far"])
    assert seen["raw"] == "shipyard logs 12 --cluster far"
