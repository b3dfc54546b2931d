"""Every shell command of README.md and examples/course/README.md runs as printed, or is listed here with the
reason it cannot run in this test: the walk runs the offline ones in order, in a home folder and a copy of the
examples under tmp_path, through the `shipyard` command the package installs. A command a README gains that is in
neither table fails the test, and so does a table entry no README prints any more: the docs and this test change
together.

The commands that need the Slurm sandbox are not run here (a sandbox costs minutes); the instructor's path on the
sandbox (check, render, build as a job, a 2-node launch and its log, the handout, a student's sbatch from its copy)
runs end to end in tests/test_course_path.py, from a course folder outside the checkout."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "examples/course/README.md")
# the reader's own ParallelCluster config: a published one (its source in tests/data/pcluster/SOURCES.md)
PCLUSTER_SAMPLE = ROOT / "tests" / "data" / "pcluster" / "awsome-p5-base.yaml"

IMPORT = "shipyard cluster.import-pcluster cluster-config.yaml --name pcluster"

# Run by the walk, in each README's order. The value is what runs instead when the command as printed holds a
# placeholder for the reader's own value (None: exactly as printed).
RUN: dict[str, str | None] = {
    "mkdir ~/dl-course && cp examples/course/registry.yaml examples/train.py ~/dl-course/ && cd ~/dl-course": None,
    "mkdir ~/dl-course && cd ~/dl-course": None,
    "CHECKOUT=/path/to/shipyard": 'CHECKOUT="$WALK_CHECKOUT"',  # where you cloned shipyard: the test's copy
    "cp $CHECKOUT/examples/course/registry.yaml $CHECKOUT/examples/train.py .": None,
    "cp -r $CHECKOUT/examples/course/definitions .": None,
    IMPORT: None,
    "shipyard cluster.import-pcluster cluster-config.yaml --update pcluster": None,
    "shipyard cluster.import-pcluster cluster-config.yaml --update pcluster --yes": None,
    "shipyard check": None,
    "shipyard show course": None,
    "shipyard render --all": None,
    "shipyard shell --cluster gwdg --dry-run": None,
}

# What the walk does first, for a command that reads a file the reader brings: the ParallelCluster config.
BEFORE = {IMPORT: 'cp "$WALK_PCLUSTER" cluster-config.yaml'}

NETWORK = "reads PyPI with uv (the network); the walk copies the committed locks it writes instead"
SANDBOX = "needs the Slurm sandbox (tests/test_course_path.py runs this path on it)"
SANDBOX_JOB = "needs the Slurm sandbox and a job on it (not run in tests: the sandbox path runs in test_course_path.py)"
CLUSTER = "runs on a real cluster's login node (its Slurm, storage, runtime): not here"
STUDENT = "a student on a real cluster, in a handout staged there: not here"
# Not run here, and why. The value is (reason, what the walk runs in its place: None for nothing, so that the
# commands after it find what it would have left).
LISTED: dict[str, tuple[str, str | None]] = {
    # not commands: the pipeline drawing and an example of an error line
    "registry.yaml -> definitions/ENV.def + ENV.lock -> containers/ENV.sif|.sqsh -> <storage>/ENV.* -> "
    "launch/*.sbatch": ("not a command: the pipeline, drawn", None),
    "(what you want) (recipe, hash-pinned) (built, verified) (staged) (1..N nodes)":
        ("not a command: the pipeline, drawn", None),
    "registry.yaml:4: environments.e.cudaa: unknown key 'cudaa' (did you mean 'cuda'?)":
        ("not a command: what a refusal prints (tests/registry test it)", None),
    # the install step and the test suite
    "pip install -e . && invoke demo": ("the install step, then the sandbox demo (root, minutes)", None),
    "pip install -e '.[test]' && invoke test": ("the install step, then the whole test suite", None),
    # the network
    "shipyard lock course && shipyard lock course-dev":
        (NETWORK, 'cp -r "$WALK_CHECKOUT/examples/course/definitions" .'),
    "shipyard lock course": (NETWORK, None),
    "shipyard lock course-dev": (NETWORK, None),
    # a real cluster
    "shipyard doctor --cluster gwdg": (CLUSTER, None),
    "shipyard doctor --cluster aws": (CLUSTER, None),
    "shipyard build course --slurm --cluster gwdg --wait": (CLUSTER, None),
    "shipyard stage course --cluster gwdg --mode world": (CLUSTER, None),
    "shipyard build course --slurm --cluster aws --wait": (CLUSTER, None),
    "shipyard stage course --cluster aws --mode world": (CLUSTER, None),
    "shipyard launch course --cluster gwdg --nodes 2 --submit -- train.py --steps 200": (CLUSTER, None),
    "shipyard launch --cluster gwdg --nodes 2 --submit -- train.py --steps 200": (CLUSTER, None),
    "shipyard launch --cluster aws --nodes 2 --submit -- train.py --steps 200": (CLUSTER, None),
    "shipyard logs JOBID --cluster gwdg --follow": (CLUSTER + "; JOBID is the job launch printed", None),
    "shipyard course.handout course --cluster gwdg --nodes 2 --out /scratch/projects/gpu-course/handout -- train.py "
    "--steps 200": (CLUSTER + " (the image staged on gwdg)", None),
    "shipyard modules --cluster gwdg --prefix /sw/courses/gpu-course": (CLUSTER + " (the image staged on gwdg)", None),
    "shipyard nccl-test --cluster gwdg --nodes 2 --image /scratch/projects/gpu-course/images/nccl-tests.sif "
    "--image-has-nccl-tests --submit": (CLUSTER + " (GPUs, InfiniBand)", None),
    "shipyard nccl-test --cluster aws --nodes 2 --image /fsx/gpu-course/images/nccl-tests.sqsh "
    "--image-has-nccl-tests --submit": (CLUSTER + " (GPUs, EFA)", None),
    "shipyard nccl-report --cluster aws launch/logs/nccl-test-aws-JOBID.out":
        (CLUSTER + "; reads the log of that nccl-test job (tests/jobs test the report on real logs)", None),
    # signing: the user's own keyring and passphrase, and a built image
    "apptainer key newpair": ("asks for a passphrase on a terminal; the user's own keyring", None),
    "shipyard sign course": ("needs a built image and the user's keyring (tests/containers sign for real)", None),
    "shipyard verify course": ("needs a built, signed image (tests/containers verify for real)", None),
    "shipyard push course": ("needs a built, signed image and an OCI registry (docker tests push for real)", None),
    # a student on a real cluster
    "mkdir -p ~/gpu-course && cp -r /scratch/projects/gpu-course/handout/. ~/gpu-course/ && cd ~/gpu-course":
        (STUDENT, None),
    "cat STUDENTS.md": (STUDENT, None),
    "sbatch train-gwdg.sbatch": (STUDENT, None),
    "sbatch train-gwdg.sbatch --steps 400": (STUDENT, None),
    "squeue --me": (STUDENT, None),
    "module use /sw/courses/gpu-course/modulefiles": (STUDENT + " (Lmod)", None),
    "module load shipyard/course": (STUDENT + " (Lmod)", None),
    "python -c 'import torch; print(torch.cuda.is_available())'": (STUDENT + " (a GPU node, the course image)", None),
    "torchrun --nproc-per-node=gpu train.py": (STUDENT + " (a GPU node, the course image)", None),
    # the sandbox
    "shipyard sandbox.up": (SANDBOX, None),
    "shipyard sandbox.down": (SANDBOX, None),
    "shipyard launch course --cluster sandbox --nodes 2 --submit -- train.py --steps 20": (SANDBOX, None),
    "shipyard launch --cluster sandbox --nodes 2 --submit -- train.py --steps 20": (SANDBOX, None),
    "shipyard logs JOBID --cluster sandbox --follow": (SANDBOX + "; JOBID is the job launch printed", None),
    "shipyard status --cluster sandbox": (SANDBOX_JOB, None),
    "shipyard launch --cluster sandbox --nodes 2 --monitor --monitor-interval 1 --submit -- train.py --steps 200":
        (SANDBOX_JOB, None),
    "shipyard usage JOBID --cluster sandbox": (SANDBOX_JOB, None),
    "shipyard shell --cluster sandbox --command hostname": (SANDBOX_JOB, None),
    "shipyard course.handout course --cluster sandbox --nodes 2 --out /tmp/handout -- train.py --steps 20":
        (SANDBOX, None),
    "cp -r /tmp/handout /tmp/student && cd /tmp/student": (SANDBOX + " (the handout above)", None),
    "export SLURM_CONF=/var/tmp/shipyard-sandbox/etc/slurm.conf": (SANDBOX, None),
    "sbatch train-sandbox.sbatch && squeue --me": (SANDBOX, None),
    "ls logs checkpoints": (SANDBOX + " (what the student's job wrote)", None),
}


def code_blocks(text: str) -> list[list[str]]:
    """The Markdown code blocks of ``text`` as the READMEs write them: indented by four spaces after a blank line."""
    out: list[list[str]] = []
    cur: list[str] | None = None
    prev_blank = True
    for line in text.splitlines():
        if cur is not None:
            if line.startswith("    ") or not line.strip():
                cur.append(line)
                continue
            out.append(cur)
            cur = None
        if prev_blank and line.startswith("    ") and line.strip():
            cur = [line]
        prev_blank = not line.strip()
    if cur is not None:
        out.append(cur)
    return out


def commands(text: str) -> list[str]:
    """Each command line of the code blocks: continuation lines joined, comments and repeated spaces dropped."""
    cmds: list[str] = []
    for block in code_blocks(text):
        joined: list[str] = []
        for line in block:
            s = line[4:].rstrip()
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1].rstrip() + " " + s.strip()
            else:
                joined.append(s)
        for s in joined:
            s = re.sub(r"(^|\s)#(\s.*)?$", "", s).strip()
            if s:
                cmds.append(re.sub(r"\s+", " ", s))
    return cmds


def doc_commands(doc: str) -> list[str]:
    return commands((ROOT / doc).read_text())


def test_the_extraction_reads_blocks_continuations_and_comments():
    text = ("Intro:\n\n    a --x  # why\n    # a whole-line comment\n    b \\\n        --y\n\ntext\n    not code\n\n"
            "- a list item\n  continued\n")
    assert commands(text) == ["a --x", "b --y"]


def test_every_readme_command_is_run_or_listed():
    printed = {doc: doc_commands(doc) for doc in DOCS}
    assert all(len(cmds) > 10 for cmds in printed.values()), printed
    neither = [f"{doc}: {c}" for doc, cmds in printed.items() for c in cmds if c not in RUN and c not in LISTED]
    assert neither == [], "run it in the walk (RUN) or say why it cannot run here (LISTED)"
    everywhere = {c for cmds in printed.values() for c in cmds}
    assert sorted(set(RUN) - everywhere) == [] and sorted(set(LISTED) - everywhere) == [], "no README prints these"
    assert not set(RUN) & set(LISTED)


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_the_readme_walk_runs_as_printed(doc, tmp_path):
    """The runnable commands in the README's order, in one shell (its `cd`s hold), stopping at the first that
    fails; a listed command's stand-in runs in its place."""
    checkout = tmp_path / "shipyard"
    shutil.copytree(ROOT / "examples", checkout / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    shim = bin_dir / "shipyard"  # what `pip install -e .` installs, run by the interpreter under test
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m shipyard "$@"\n')
    shim.chmod(0o755)
    script = ["set -euo pipefail"]
    ran = []
    for cmd in doc_commands(doc):
        if cmd in LISTED:
            standin = LISTED[cmd][1]
            if standin:
                script += [f"echo {shlex.quote('+++ instead of: ' + cmd)}", standin]
            continue
        if cmd in BEFORE:
            script.append(BEFORE[cmd])
        script += [f"echo {shlex.quote('+++ ' + cmd)}", RUN[cmd] or cmd]
        ran.append(cmd)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHIPYARD_")}
    env |= {"HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "WALK_CHECKOUT": str(checkout),
            "WALK_PCLUSTER": str(PCLUSTER_SAMPLE)}
    res = subprocess.run(["bash", "-c", "\n".join(script)], cwd=checkout, env=env, capture_output=True, text=True,
                         timeout=600)
    last = [ln for ln in res.stdout.splitlines() if ln.startswith("+++ ")][-1:]
    assert res.returncode == 0, \
        f"{doc}: {last} failed (exit {res.returncode})\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert {IMPORT, "shipyard check", "shipyard render --all"} <= set(ran)
    course = home / "dl-course"
    assert "\n  pcluster:\n" in (course / "registry.yaml").read_text()
    assert (course / "definitions" / "course.def").is_file() and (course / "definitions" / "course.lock").is_file()
    assert "wrote clusters.pcluster into registry.yaml" in res.stdout
