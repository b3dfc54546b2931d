"""The launcher model in parts, and the sbatch template's blocks that hold logic, each rendered and run alone.

The whole launchers are compared byte for byte by the goldens (test_launch.py); here each block's shell runs in
bash with a stand-in scontrol, so a block's decision is checked where it is made."""

from __future__ import annotations

import re
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
from fixtures_launch import build_launcher

from shipyard import templating
from shipyard.launch import launcher as launch
from shipyard.launch import options

CMD = ["train.py"]
TEMPLATES = Path(launch.__file__).parent / "templates"


def _block(name: str, **context) -> str:
    return templating.render("shipyard.launch", name, trim_blocks=True, **context)


def _run(tmp_path: Path, script: str, scontrol: str, **env) -> subprocess.CompletedProcess:
    """``script`` in bash with ``scontrol`` as a stand-in that also records its arguments in ``calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {tmp_path / "calls"}\n{scontrol}\n')
    fake.chmod(0o755)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env})


def test_each_field_is_in_one_place_and_reads_flat(launch_registry):
    own = {f.name for f in fields(launch.Launcher)}
    per_part = [{f.name for f in fields(cls)} for cls in launch.PARTS.values()]
    everything = [n for names in per_part for n in names]
    assert len(everything) == len(set(everything)) and not own & set(everything)
    # a part's name is no flag's: the "regenerate with" line reads flags by name from the launcher
    assert not set(launch.PARTS) & {f.name for f in fields(options.Options)}
    l = build_launcher(launch_registry, cluster="lab-efa", nodes=2, requeue=True, command=CMD)
    assert l.nodes == l.resources.nodes == 2 and l.requeue is l.checkpoint.requeue is True
    with pytest.raises(AttributeError, match="no_such_field"):
        l.no_such_field


def test_replace_changes_the_part_that_holds_a_field(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-efa", nodes=2, command=CMD)
    moved = l.replace(nodes=1, root="/elsewhere")
    assert (moved.nodes, moved.root, moved.gpus_per_node) == (1, "/elsewhere", l.gpus_per_node)
    assert moved.nccl == l.nccl and l.nodes == 2
    assert launch.Launcher.of(**{f: getattr(l, f) for f in launch._PART_OF}
                              | {f.name: getattr(l, f.name) for f in fields(launch.Launcher)
                                 if f.name not in launch.PARTS}) == l
    with pytest.raises(TypeError):
        l.replace(no_such_field=1)


def test_the_main_template_includes_every_block_once():
    main = (TEMPLATES / "sbatch.sh.j2").read_text()
    included = re.findall(r'{% include "(sbatch_[a-z_]+\.sh\.j2)" %}', main)
    assert sorted(included) == sorted(p.name for p in TEMPLATES.glob("sbatch_*.sh.j2"))
    assert len(included) == len(set(included))
    longest = max(len(p.read_text().splitlines()) for p in TEMPLATES.glob("sbatch*.sh.j2"))
    assert longest <= 50, "a block of the launcher should read at once: split it"


@pytest.mark.parametrize(("restarts", "requeued"), [(0, True), (1, True), (2, False)])
def test_requeue_block_requeues_below_max_restarts(tmp_path, restarts, requeued):
    block = _block("sbatch_requeue.sh.j2", checkpoint=launch.Checkpoint(signal="USR1", chain=1, requeue=True,
                                                                        max_restarts=2, signal_before=120))
    r = _run(tmp_path, f"signalled=1\n{block}\necho fell-through", "",
             SLURM_JOB_ID="41", SLURM_RESTART_COUNT=str(restarts))
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    assert r.returncode == 0, r.stderr
    assert (calls == "requeue 41\n") is requeued
    assert ("fell-through" in r.stdout) is not requeued
    assert ("not requeueing: 2 restarts reached" in r.stdout) is not requeued


def test_requeue_block_without_requeue_stops(tmp_path):
    block = _block("sbatch_requeue.sh.j2", checkpoint=launch.Checkpoint(signal="USR1", chain=3, signal_before=120))
    r = _run(tmp_path, f"signalled=1\n{block}", "", SLURM_JOB_ID="41")
    assert "no --requeue" in r.stdout and not (tmp_path / "calls").exists()


def test_rendezvous_block_takes_the_first_node_and_a_port_per_job(tmp_path):
    part = launch.TorchrunStep(rdzv_port=29500, rdzv_ports=100)
    block = _block("sbatch_rendezvous.sh.j2", torchrun_step=part)
    scontrol = ('case "$1 $2" in "show hostnames") printf "n7\\nn8\\n";; '
                '"show node") echo "NodeName=$3 NodeAddr=10.0.0.${3#n} NodeHostName=$3";; esac')
    r = _run(tmp_path, block, scontrol, SLURM_JOB_ID="12345", SLURM_JOB_NODELIST="n[7-8]")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "shipyard: c10d rendezvous at n7 (10.0.0.7):29545, id 12345"


def test_rendezvous_block_stops_without_a_head_address(tmp_path):
    block = _block("sbatch_rendezvous.sh.j2", torchrun_step=launch.TorchrunStep(rdzv_port=29500, rdzv_ports=100))
    r = _run(tmp_path, block, 'case "$1 $2" in "show hostnames") echo n7;; esac', SLURM_JOB_ID="1",
             SLURM_JOB_NODELIST="n7")
    assert r.returncode == 1 and "cannot resolve the head node of n7" in r.stderr


NO_TORCHRUN = ("shipyard: error: node 1 (n8): torchrun is not on the PATH inside the image (/usr/bin); the "
               "environment needs torch installed\n")


@pytest.mark.parametrize(("torchrun", "step_rc", "earlier_only", "job_rc"), [
    (True, 143, False, 127),  # a bystander's 143: the cause is the node without torchrun
    (True, 143, True, 143),  # the line is from before this run's start in the log: not this run's cause
    (True, 0, False, 0),
    (False, 143, False, 143),  # nccl-test runs no torchrun: its code stands
])
def test_verdict_block_reports_the_causes_exit_code(tmp_path, launch_registry, torchrun, step_rc, earlier_only,
                                                    job_rc):
    l = build_launcher(launch_registry, cluster="lab-socket", command=CMD)
    block = _block("sbatch_verdict.sh.j2", torchrun=torchrun, nccl=l.nccl, torchrun_step=l.torchrun_step)
    log = tmp_path / "job.out"
    earlier = NO_TORCHRUN if earlier_only else "an earlier run's line\n"  # the log is appended to across requeues
    log.write_text(earlier + ("" if earlier_only else NO_TORCHRUN))
    start = len(earlier)
    script = f'log={log}\nlog_start={start}\n(exit {step_rc}) &\n{block}\necho "rc=$rc"'
    r = _run(tmp_path, script, "")
    assert r.returncode == 0, r.stderr
    assert f"shipyard: job step exit code {job_rc}\n" in r.stdout and r.stdout.endswith(f"rc={job_rc}\n")
