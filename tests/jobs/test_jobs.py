"""invoke status / invoke logs: parsing squeue, sacct and scontrol output, following a file, and both tasks
against the real sandbox Slurm."""

from __future__ import annotations

import io
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
from fixtures_tools import write_tools_registry
from helpers_registry import GOLDEN, golden

from shipyard import slurm
from shipyard.commands import jobs as commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.jobs import status as jobs

S = jobs.SEP


def test_squeue_fields_survive_names_with_separators():
    text = S.join(["17", "shipyard-a|b c", "PENDING", "0:00", "10:00", "2", "(Resources)", "made by shipyard"]) + "\n"
    text += S.join(["18", "other", "RUNNING", "1:02", "10:00", "1", "node1", "(null)"]) + "\n"
    a, b = jobs.parse_squeue(text)
    assert (a.jobid, a.name, a.where, a.comment) == ("17", "shipyard-a|b c", "(Resources)", "made by shipyard")
    assert (b.name, b.comment) == ("other", "")


def test_sacct_skips_steps_and_keeps_exit_codes():
    text = "\n".join([S.join(["20", "train", "CANCELLED by 0", "00:01:00", "2", "node[1-2]", "0:15"]),
                      S.join(["20.batch", "batch", "CANCELLED", "00:01:00", "1", "node1", "0:15"]),
                      S.join(["21_3", "shipyard-shell", "COMPLETED", "00:00:02", "1", "node2", "0:0"])])
    a, b = jobs.parse_sacct(text)
    assert (a.jobid, a.state, a.exit_code, a.where) == ("20", "CANCELLED", "0:15", "node[1-2]")
    assert b.jobid == "21_3"


def test_merge_prefers_squeue_state_and_adds_exit_code():
    live = [jobs.Job("5", "train", "RUNNING", "0:10", "10:00", "2", "node[1-2]")]
    done = [jobs.Job("5", "train", "RUNNING", "00:00:10", "", "2", "node[1-2]", "0:0"),
            jobs.Job("3", "shipyard-doctor", "COMPLETED", "00:00:01", "", "1", "node1", "0:0"),
            jobs.Job("10", "x", "FAILED", "00:00:01", "", "1", "node1", "1:0")]
    merged = jobs.merge(live, done)
    assert [j.jobid for j in merged] == ["3", "5", "10"]
    assert merged[1].state == "RUNNING" and merged[1].exit_code == "0:0" and merged[1].time_limit == "10:00"


def test_which_jobs_are_shipyards():
    assert jobs.is_shipyard(jobs.Job("1", "shipyard-shell", "R", ""), set())
    assert jobs.is_shipyard(jobs.Job("1", "x", "R", "", comment="Shipyard launcher"), set())
    assert jobs.is_shipyard(jobs.Job("1", "train", "R", ""), {"train"})
    assert not jobs.is_shipyard(jobs.Job("1", "train", "R", ""), set())


def test_status_table_golden(tmp_path):
    (tmp_path / "launch" / "logs").mkdir(parents=True)
    (tmp_path / "launch" / "logs" / "train-5.out").write_text("x\n")
    rows = [jobs.Job("5", "train", "RUNNING", "0:10", "10:00", "2", "node[1-2]", "0:0"),
            jobs.Job("6", "shipyard-shell", "PENDING", "0:00", "10:00", "1", "(Resources)")]
    golden(GOLDEN / "jobs" / "status.txt", jobs.render_status("sandbox", rows, tmp_path))
    golden(GOLDEN / "jobs" / "status-empty.txt", jobs.render_status("grete", [], tmp_path, "(sacct unavailable: x)"))


@pytest.mark.parametrize(
    "line,path",
    [
        ("JobId=7 JobName=t StdErr=/a/b-7.out StdIn=/dev/null StdOut=/a/b-7.out Power=", "/a/b-7.out"),
        ("JobId=7 StdOut=/my dir/with spaces/t-7.out", "/my dir/with spaces/t-7.out"),
        ("JobId=7 StdOut=(null) Power=", None),
        ("JobId=7 JobName=t", None),
    ],
)
def test_stdout_from_scontrol(line, path):
    assert jobs.stdout_from_scontrol(line) == path


def test_tail_reads_from_the_end(tmp_path):
    p = tmp_path / "x.out"
    p.write_text("".join(f"line {i}\n" for i in range(100000)))
    last, size = jobs.tail(p, 3, block=1000)
    assert last == ["line 99997\n", "line 99998\n", "line 99999\n"] and size == p.stat().st_size
    assert jobs.tail(p, 0)[0] == []
    p.write_text("no newline")
    assert jobs.tail(p, 5)[0] == ["no newline"]


def test_follow_prints_appended_lines_until_the_job_ends(tmp_path):
    p = tmp_path / "x.out"
    p.write_text("old\n")
    state = {"alive": True}

    def writer():
        with open(p, "a") as fh:
            for i in range(5):
                fh.write(f"new {i}\n")
                fh.flush()
                time.sleep(0.05)
            fh.write("partial")
        state["alive"] = False

    class Job(slurm.Job):  # the scheduler's answer, without a scheduler
        def state(self):
            return "RUNNING" if state["alive"] else "COMPLETED"

    out = io.StringIO()
    t = threading.Thread(target=writer)
    t.start()
    assert Job("nowhere", "1").follow(p, out, offset=4, poll=0.01, check_every=0.02) == "COMPLETED"
    t.join()
    assert out.getvalue() == "".join(f"new {i}\n" for i in range(5)) + "partial"


def test_follow_waits_for_a_log_that_does_not_exist_yet(tmp_path):
    """A pending job has no output file yet: following waits for it instead of failing."""
    p = tmp_path / "later.out"
    asked = []

    class Job(slurm.Job):
        def state(self):
            asked.append(1)
            if len(asked) == 2:
                p.write_text("hello\n")
            return "PENDING" if len(asked) < 3 else "FAILED"

    out = io.StringIO()
    assert Job("nowhere", "1").follow(p, out, poll=0.01, check_every=0.01) == "FAILED"
    assert out.getvalue() == "hello\n"


def test_job_states_come_from_the_data_file():
    """The success state is a fact of shipyard/data/slurm.yaml, and it is one of the final states."""
    success = slurm.policy()["success_state"]
    assert slurm.succeeded(success) and success in slurm.final_states()
    assert not slurm.succeeded("FAILED") and not slurm.succeeded(None)
    assert slurm.Job.ended(None) and slurm.Job.ended("TIMEOUT") and not slurm.Job.ended("RUNNING")


# ------------------------------------------------------------------------------------------------ real Slurm


@pytest.fixture
def project(tmp_path, sandbox, monkeypatch):
    """A temporary project (registry, launch/logs) whose sandbox is the session's."""
    from shipyard import sandbox as sb

    reg = write_tools_registry(tmp_path)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(reg))
    monkeypatch.setenv(sb.DIR_ENV, str(sandbox.directory))
    (tmp_path / "launch" / "logs").mkdir(parents=True)
    return tmp_path


def _sbatch(sandbox, *args: str) -> str:
    res = sandbox.run(["sbatch", "--parsable", *args])
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _wait_done(sandbox, jobid: str, seconds: float = 60) -> None:
    job = slurm.Job(slurm.SANDBOX, jobid, sandbox.directory)
    if not job.ended(job.wait(seconds, poll=0.2)):
        raise AssertionError(f"job {jobid} did not finish")


@pytest.mark.slurm
def test_status_lists_only_shipyard_jobs(sandbox, project):
    tag = uuid.uuid4().hex[:8]
    launcher = f"train{tag}"
    (project / "launch" / f"{launcher}.sbatch").write_text("#!/bin/bash\n")
    out = project / "launch" / "logs"
    ids = {
        "prefixed": _sbatch(sandbox, f"--job-name=shipyard-t{tag}", f"--output={out}/a-%j.out", "--wrap", "true"),
        "launcher": _sbatch(sandbox, f"--job-name={launcher}", f"--output={out}/{launcher}-%j.out", "--wrap",
                            "sleep 30"),
        "comment": _sbatch(sandbox, f"--job-name=c{tag}", "--comment=shipyard nccl", f"--output={out}/c-%j.out",
                           "--wrap", "true"),
        "foreign": _sbatch(sandbox, f"--job-name=foreign{tag}", f"--output={out}/f-%j.out", "--wrap", "true"),
    }
    _wait_done(sandbox, ids["prefixed"])
    # the launcher's job must have started (a busy CI machine once showed it still PENDING here: no log yet)
    job = slurm.Job(slurm.SANDBOX, ids["launcher"], sandbox.directory)
    deadline = time.monotonic() + 60
    while job.state() == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.state() != "PENDING", f"job {ids['launcher']} did not start within 60 s"
    buf = io.StringIO()
    assert commands.status(Context.load(out=buf), "sandbox") == 0
    text = buf.getvalue()
    rows = {line.split()[0]: line for line in text.splitlines()[2:] if line.strip()}
    assert ids["prefixed"] in rows and "COMPLETED" in rows[ids["prefixed"]]
    assert ids["launcher"] in rows and f"launch/logs/{launcher}-{ids['launcher']}.out" in rows[ids["launcher"]]
    assert ids["comment"] in rows
    assert ids["foreign"] not in rows
    sandbox.run(["scancel", ids["launcher"]])


@pytest.mark.slurm
def test_status_task_through_invoke(sandbox, project, invoke):
    tag = uuid.uuid4().hex[:8]
    jid = _sbatch(sandbox, f"--job-name=shipyard-{tag}", f"--output={project}/launch/logs/x-%j.out", "--wrap", "true")
    _wait_done(sandbox, jid)
    proc = invoke("status", "--cluster", "sandbox", cwd=project, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("JOBID  NAME")
    assert any(line.split()[:3] == [jid, f"shipyard-{tag}", "COMPLETED"] for line in proc.stdout.splitlines())


@pytest.mark.slurm
def test_logs_follows_a_running_job_to_its_end(sandbox, project):
    out = project / "launch" / "logs"
    script = "for i in 1 2 3 4 5 6; do echo \"step $i $(hostname)\"; sleep 0.5; done; echo 'done: ü'"
    jid = _sbatch(sandbox, "--job-name=follow", f"--output={out}/follow-%j.out", "--wrap", script)
    buf = io.StringIO()
    ctx = Context.load(out=buf)
    assert commands.logs(ctx, jid, follow=True, lines=2, cluster="sandbox") == 0
    assert jobs.find_log(ctx.registry, ctx.cluster("sandbox"), jid) == out / f"follow-{jid}.out"
    text = buf.getvalue()
    lines = text.splitlines()
    assert lines[-1] == "done: ü"
    assert [l.split()[1] for l in lines if l.startswith("step")][-1] == "6"
    assert len([l for l in lines if l.startswith("step")]) >= 2
    # After the job: the last 3 lines, no following.
    buf = io.StringIO()
    commands.logs(Context.load(out=buf), jid, lines=3, cluster="sandbox")
    host = lines[-2].split()[2]
    assert buf.getvalue().splitlines() == [f"step 5 {host}", f"step 6 {host}", "done: ü"]
    assert host in sandbox.nodes


@pytest.mark.slurm
def test_logs_follow_of_a_failed_job_exits_1(sandbox, project, invoke):
    """`logs -f` on a job that FAILED prints its output and exits 1 (a failed job), not 0."""
    out = project / "launch" / "logs"
    jid = _sbatch(sandbox, "--job-name=fails", f"--output={out}/fails-%j.out", "--wrap", "echo before; exit 3")
    proc = invoke("logs", jid, "--follow", "--cluster", "sandbox", cwd=project, env=dict(os.environ))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "before" in proc.stdout and f"job {jid} ended FAILED" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slurm
def test_logs_falls_back_to_launch_logs_and_errors_are_one_line(sandbox, project, invoke):
    (project / "launch" / "logs" / "old-987654.out").write_text("a\nb\n")
    buf = io.StringIO()
    ctx = Context.load(out=buf)
    assert commands.logs(ctx, "987654", lines=1, cluster="sandbox") == 0
    assert jobs.find_log(ctx.registry, ctx.cluster("sandbox"), "987654").name == "old-987654.out"
    assert buf.getvalue() == "b\n"
    with pytest.raises(ShipyardError, match=r"job 987655: no output file .*launch/logs/\*-987655.out"):
        commands.logs(ctx, "987655", cluster="sandbox")
    (project / "launch" / "train-grete.sbatch").write_text("#!/bin/bash\n# x\n# environment e, cluster grete, "
                                                           "runtime apptainer, fabric ib: 1\n")
    (project / "launch" / "logs" / "train-grete-987655.out").write_text("grete's\n")
    with pytest.raises(ShipyardError, match=r"job 987655: not known to cluster sandbox's Slurm, and .*"
                                            r"train-grete-987655.out is the log of a job 987655 on cluster grete"):
        commands.logs(ctx, "987655", cluster="sandbox")
    tag = uuid.uuid4().hex[:8]
    res = sandbox.run(["srun", f"--job-name=shipyard-{tag}", "true"])
    assert res.returncode == 0, res.stderr
    jid = sandbox.run(["squeue", "--noheader", "--states=all", f"--name=shipyard-{tag}", "--format=%i"]).stdout.split()[-1]
    with pytest.raises(ShipyardError, match="interactive srun/salloc job"):
        commands.logs(ctx, jid, cluster="sandbox")
    proc = invoke("logs", "12;x", "--cluster", "sandbox", cwd=project, env=dict(os.environ))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "expected a Slurm job id" in proc.stderr


def test_unreachable_cluster_client_is_one_line(monkeypatch, tmp_path):
    """On a real cluster name with no Slurm clients on PATH, the error says where to run it."""
    reg = write_tools_registry(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ShipyardError, match="squeue is not on PATH: run this on a login node of cluster grete"):
        commands.status(Context.load(reg), "grete")
    assert Path(reg).exists()


def test_a_log_belongs_to_the_cluster_its_launcher_was_written_for(make_project):
    """Job ids repeat across clusters: launch/logs/NAME-JOBID.out is a cluster's log only when launch/NAME.sbatch
    was written for that cluster (or is gone: then nothing says otherwise)."""
    reg = make_project("launch")
    logs = reg.root / "launch" / "logs"
    logs.mkdir(parents=True)
    for name, cluster in (("train-grete", "grete"), ("train-sandbox", "sandbox")):
        (reg.root / "launch" / f"{name}.sbatch").write_text(
            f"#!/bin/bash\n# Generated by shipyard\n# environment e, cluster {cluster}, runtime host, fabric socket: x\n")
        (logs / f"{name}-77.out").write_text(name)
    (logs / "orphan-77.out").write_text("orphan")
    mine, other = jobs.logs_for(reg, "sandbox", "77")
    assert [p.name for p in mine] == ["orphan-77.out", "train-sandbox-77.out"]
    assert [(p.name, c) for p, c in other] == [("train-grete-77.out", "grete")]
    (logs / "orphan-77.out").unlink()
    (logs / "train-sandbox-77.out").unlink()
    assert jobs.logs_for(reg, "sandbox", "77") == ([], [(logs / "train-grete-77.out", "grete")])


def test_a_job_that_cannot_start_is_stuck_by_the_data_files_reasons():
    """PENDING with a reason of ``never_start_reasons`` (slurm.yaml) is stuck; waiting for Resources is not."""
    class Job(slurm.Job):  # the scheduler's answer, without a scheduler
        def __init__(self, reason):
            super().__init__("nowhere", "7")
            self.reason = reason

        def state(self):
            self.fields = {"JobState": "PENDING", "Reason": self.reason}
            return "PENDING"

    stuck = Job("PartitionTimeLimit")
    assert stuck.wait(timeout=5, poll=0.01) == "PENDING"
    assert stuck.stuck() == "PartitionTimeLimit: the job's time limit exceeds the partition's"
    waiting = Job("Resources")
    assert waiting.wait(timeout=0.05, poll=0.01) == "PENDING" and waiting.stuck() is None


@pytest.mark.slurm
def test_a_job_over_the_partitions_time_limit_stops_the_wait_in_one_line(sandbox, project):
    """Found on the sandbox: an enroot import job asking for an hour on a 10-minute partition stayed PENDING
    (PartitionTimeLimit) and `stage` waited for it. The wait stops, the job is cancelled, one line says why."""
    import io

    from shipyard.containers import on_slurm
    from shipyard.errors import ShipyardError

    jobid = _sbatch(sandbox, "--time=10:00:00", "--wrap=true", f"--output={project}/stuck-%j.out")
    job = slurm.Job(slurm.SANDBOX, jobid, sandbox.directory)
    with pytest.raises(ShipyardError, match=rf"import job {jobid} cannot start on cluster sandbox \(PartitionTimeLimit"
                                            r": the job's time limit exceeds the partition's\); cancelled it") as e:
        on_slurm.ended(job, project / f"stuck-{jobid}.out", io.StringIO(), what="import job", poll=0.2)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert job.ended(job.wait(30, poll=0.2)), "the stuck job was not cancelled"
