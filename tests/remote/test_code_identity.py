"""Jobs record which code ran: the commit and dirty flag in the launcher header and the job's
environment, from the project's own git checkout or the record `invoke remote.sync` shipped."""

from __future__ import annotations

import json
import subprocess

from fixtures_launch import run_launch

from shipyard.remote.sync import code_identity

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _launcher(project) -> str:
    (project / "t.py").write_text("")
    run_launch(["t.py"], cluster="lab-socket", nodes=2)
    return (project / "launch" / "train-lab-socket.sbatch").read_text()


def test_the_shipped_record_names_the_code_in_header_and_environment(make_project):
    project = make_project("launch", name="synced").root
    (project / ".shipyard-shipped.json").write_text(json.dumps({"commit": COMMIT, "dirty": True}))
    text = _launcher(project)
    assert f"# code: commit {COMMIT} with uncommitted changes (dirty)\n" in text
    assert f"export SHIPYARD_COMMIT={COMMIT}  # the project's commit\n" in text
    assert "export SHIPYARD_DIRTY=1  # 1: uncommitted changes were part of it\n" in text
    subprocess.run(["bash", "-n", str(project / "launch" / "train-lab-socket.sbatch")], check=True)


def test_an_own_git_checkout_clean_and_no_record_at_all(make_project):
    project = make_project("launch", name="own").root
    assert "# code:" not in _launcher(project) and code_identity(project) == ("unknown", None)
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "registry.yaml"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    text = _launcher(project)
    assert f"# code: commit {head}\n" in text and "export SHIPYARD_DIRTY=0" in text


def test_a_record_that_is_not_a_commit_is_ignored(make_project):
    project = make_project("launch", name="bad").root
    (project / ".shipyard-shipped.json").write_text(json.dumps({"commit": "$(id)\nx", "dirty": False}))
    assert code_identity(project) == ("unknown", None)
