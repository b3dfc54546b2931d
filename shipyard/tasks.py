"""shipyard's command line: thin invoke tasks. Each parses flags and calls the package; no logic lives here.

Installed with the package: `invoke TASK` in the checkout (the checkout's tasks.py adds `invoke test`, which runs the
suite and so exists only there), and `shipyard TASK` (or `python -m shipyard TASK`) from any folder, such as a course
folder outside the checkout.

Every task is wrapped in ``task_guard``: a user error prints one line and exits 2, never a traceback.
The registry is ./registry.yaml unless $SHIPYARD_REGISTRY names another file.

Conventions: an optional environment argument is declared ``@task(positional=["env"])`` with ``env=None``; it may be
omitted on the command line (see ``install_parser_hooks``), and then arrives as "" or None: both mean
``defaults.environment``. `invoke TASK --help`, `invoke TASK -h` and `invoke --help TASK` all print a task's help,
with its positionals in the usage line as the README writes them (same hooks).
"""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Collection, Program, task

from shipyard import __version__, runtimes
from shipyard.cli import argv_after_dashdash, install_parser_hooks, set_program, task_guard

# the launch/nccl-test flags: invoke needs their help before any task runs (the module loads no registry)
from shipyard.launch import options as launch_options

install_parser_hooks()

# every help that lists the runtimes lists them from their registry (shipyard/runtimes/), as the launch options do
RUNTIME_CHOICES = " | ".join(runtimes.NAMES)

# ----------------------------------------------------------------------------------------------- registry, check, render


@task(name="list")
@task_guard
def list_(c):
    """List environments and clusters as tables."""
    from shipyard.commands import registry as registry_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(registry_commands.list_(Context.load()))


@task(positional=["env"], help={"env": "environment name (default: defaults.environment)",
                                 "contents": "instead: what the last build's image holds (Python and apt packages, "
                                             "CUDA/cuDNN/NCCL libraries, labels), read from the image"})
@task_guard
def show(c, env=None, contents=False):
    """Show an environment's fully resolved pins and where each came from."""
    from shipyard.commands import registry as registry_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(registry_commands.show(Context.load(), env, contents))


@task(positional=["env"], help={"env": "only this environment (default: all)", "cluster": "only this cluster (default: all it is used on)"})
@task_guard
def check(c, env=None, cluster=None):
    """Check every environment against the compatibility data, its clusters and its lock; exit 1 on any ERROR."""
    from shipyard.commands import registry as registry_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(registry_commands.check(Context.load(), env, cluster))


@task(
    positional=["env"],
    help={
        "env": "environment to render (default: defaults.environment)",
        "all": "render every environment",
        "check": "do not write; exit 1 and name the stale files if definitions/ differs from what the registry renders",
        "force": "write even when `invoke check ENV` finds an ERROR (a stale or missing lock, no such wheel); warns",
    }
)
@task_guard
def render(c, env=None, all=False, check=False, force=False):
    """Render definitions/<env>.def (and .Dockerfile) from registry.yaml; refuses what `invoke check` refuses."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import definitions as definitions_commands  # lazy: start-up of every task

    raise SystemExit(definitions_commands.render(Context.load(), env, all_envs=all, check=check, force=force))


@task(
    name="refresh",
    help={
        "torch": "comma-separated torch releases to refresh (default: every release in compat.yaml)",
        "write": "write compat.yaml after showing the diff (default: show the diff only, exit 1 if it differs)",
        "no_companions": "skip the torchvision/torchaudio look-ups (faster)",
    },
)
@task_guard
def compat_refresh(c, torch="", write=False, no_companions=False):
    """Derive compat.yaml's wheel facts from PyPI metadata (uv, metadata only) and show them as a diff."""
    from shipyard.commands import registry as registry_commands  # lazy: start-up of every task
    raise SystemExit(registry_commands.compat_refresh(torch or None, write=write, companions=not no_companions))


compat_tasks = Collection("compat", compat_refresh)


# ----------------------------------------------------------------------------------------------- cluster-facing tools
# nccl-report, usage, status, logs, doctor: shipyard/commands/jobs.py; shell: shipyard/commands/launch.py


@task(
    name="nccl-report",
    positional=["log"],
    help={
        "log": "nccl-tests output file (e.g. launch/logs/NAME-JOBID.out)",
        "out": "PNG to write (default: LOG with .png suffix)",
        "cluster": "cluster whose nominal line rate is drawn (default: defaults.cluster)",
        "partition": "partition the job ran on: its line rate (default: the cluster's scheduler.partition)",
    },
)
@task_guard
def nccl_report(c, log, out=None, cluster=None, partition=None):
    """Parse nccl-tests output into a bus-bandwidth table and a PNG plot against message size."""
    from shipyard.commands import jobs as jobs_commands  # lazy: start-up of every task

    raise SystemExit(jobs_commands.nccl_report(log, out, cluster, partition=partition))


@task(
    positional=["jobid"],
    help={
        "jobid": "Slurm job id whose --monitor samples to summarise",
        "out": "PNG to write (default: launch/logs/NAME-JOBID.usage.png)",
        "cluster": "cluster the job ran on (default: defaults.cluster); only its launchers' samples are read",
    },
)
@task_guard
def usage(c, jobid, out=None, cluster=None):
    """Summarise a job's --monitor CSVs per node (CPU, RAM, GPU) and plot them over time."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import jobs as jobs_commands  # lazy: start-up of every task

    raise SystemExit(jobs_commands.usage(Context.load(), jobid, out, cluster=cluster))


@task(
    help={
        "cluster": "cluster whose Slurm to ask (default: defaults.cluster; sandbox talks to the local sandbox)",
        "since": "sacct start time for finished jobs (Slurm time syntax, default now-2days)",
    }
)
@task_guard
def status(c, cluster=None, since="now-2days"):
    """Table of your shipyard jobs: queued/running (squeue) and finished (sacct)."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import jobs as jobs_commands  # lazy: start-up of every task

    raise SystemExit(jobs_commands.status(Context.load(), cluster, since))


@task(
    positional=["jobid"],
    help={
        "jobid": "Slurm job id",
        "follow": "keep printing new output until the job ends (Ctrl-C stops)",
        "num_lines": "how many last lines to print first (default 20)",
        "cluster": "cluster whose Slurm to ask (default: defaults.cluster)",
    },
)
@task_guard
def logs(c, jobid, follow=False, num_lines=20, cluster=None):
    """Print the tail of a job's output file (found via scontrol show job, else launch/logs/*-JOBID.out)."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import jobs as jobs_commands  # lazy: start-up of every task

    raise SystemExit(jobs_commands.logs(Context.load(), jobid, follow=follow, lines=num_lines, cluster=cluster))


@task(
    positional=["env"],
    help={
        "env": "environment whose image to enter (default: defaults.environment)",
        "cluster": "cluster to run on (default: defaults.cluster); uses its interactive partition",
        "dry_run": "print the exact command and the ssh config snippet, run nothing",
        "command": "run this shell command line (bash -c, e.g. 'hostname; nproc') in the container on the node instead "
                   "of an interactive shell",
        "gpus": "GPUs to request on the node (default: 1 if the cluster has GPUs, else 0)",
        "time": "time limit (default: 01:00:00 (launch.yaml shell_time), or the cluster's scheduler.time or the "
                "partition's max_time when shorter)",
        "runtime": f"{RUNTIME_CHOICES} (default: the cluster's runtime)",
        "force": "open the shell even when `invoke check` finds an ERROR for ENV on the cluster (warns)",
        "partition": "partition to run on (default: the cluster's interactive partition)",
        "sbatch": "extra Slurm option KEY=VALUE for srun (repeatable; the keys --sbatch of invoke launch allows)",
    },
    iterable=["sbatch"],
)
@task_guard
def shell(c, env=None, cluster=None, dry_run=False, command=None, gpus=None, time=None, runtime=None, force=False,
          partition=None, sbatch=None):
    """Interactive srun --pty shell inside the environment's container on the cluster's interactive partition."""
    from shipyard.commands import launch as launch_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(launch_commands.shell(Context.load(), env, cluster, dry_run=dry_run, command=command, gpus=gpus,
                                           time=time, runtime=runtime, force=force, partition=partition,
                                           sbatch=sbatch))


@task(
    help={
        "cluster": "cluster to check (default: defaults.cluster)",
        "env": "environment whose CUDA/arch needs are checked against the GPUs (default: defaults.environment)",
        "partition": "partition whose node is probed and whose GPUs are expected (default: scheduler.partition)",
        "time-start": "also start the staged image on one node, twice, and report the cold and warm start in seconds "
                      "with the runtime's start mode (every container runtime on the sandbox)",
    }
)
@task_guard
def doctor(c, cluster=None, env=None, partition=None, time_start=False):
    """Preflight: Slurm, pyxis, apptainer/enroot, fakeroot, GPUs and driver, shared storage; PASS/WARN/FAIL + fix."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import jobs as jobs_commands  # lazy: start-up of every task

    raise SystemExit(jobs_commands.doctor(Context.load(), cluster, env, partition=partition, time_start=time_start))


# ----------------------------------------------------------------------------------------------- launchers

# Both tasks' help, repeatable flags and optional positional come from the one options model
# (shipyard/launch/options.py, imported at the top). A task's parameters are its flags: they become one
# ``Options(**params)`` as they are, which the command passes down (to the checks, the launcher and its
# "regenerate with" line). A new flag is a field there plus a parameter here.


def _options(params: dict) -> launch_options.Options:
    """A launcher task's parameters (its ``locals()`` before anything else runs), less invoke's context."""
    return launch_options.Options(**{k: v for k, v in params.items() if k != "c"})


@task(**launch_options.task_kwargs(launch_options.TORCHRUN))
@task_guard
def launch(c, environment=None, cluster=None, nodes=None, gpus_per_node=None, runtime=None, partition=None,
           cpus_per_task=None, mem=None, exclusive=False, name=None, registry=None, account=None, time=None, image=None,
           mounts=None, env=None, nccl_debug=False, allow_transport_fallback=False,
           monitor=False, monitor_interval=None, chain=None, requeue=False, max_restarts=None, signal_before=None,
           preflight=None, force=False,
           sbatch=None, validate=False, sweep=None, sweep_file=None, max_concurrent=None,
           submit=False, dry_run=False):
    """Write launch/<name>.sbatch for torchrun on 1..N nodes; the training script and its arguments follow `--`."""
    opts = _options(locals())
    from shipyard.commands import launch as launch_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(launch_commands.launch(Context.load(registry), opts, argv_after_dashdash(sys.argv)))


@task(name="nccl-test", **launch_options.task_kwargs(launch_options.NCCL_TEST))
@task_guard
def nccl_test(c, environment=None, cluster=None, nodes=None, gpus_per_node=None, runtime=None, partition=None,
              mem=None, exclusive=False, name=None, registry=None, account=None, time=None, image=None,
              binary=None, sizes=None, iters=None, check=None, image_has_nccl_tests=False, mounts=None, env=None,
              nccl_debug=False, allow_transport_fallback=False, force=False,
              sbatch=None, validate=False,
              submit=False, dry_run=False):
    """Write launch/<name>.sbatch running all_reduce_perf with one rank per GPU (read it with nccl-report)."""
    opts = _options(locals())
    from shipyard.commands import launch as launch_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(launch_commands.launch(Context.load(registry), opts, argv_after_dashdash(sys.argv),
                                            kind=launch_options.NCCL_TEST))


@task(
    name="handout",
    positional=["environment"],
    help={
        "environment": "the course environment (default: defaults.environment)",
        "cluster": "cluster the students run on (default: defaults.cluster)",
        "out": "folder to write the handout into (students copy it from there); must be empty unless --replace",
        "nodes": "nodes per student job (default: 1)",
        "gpus_per_node": "GPUs per node (default: the partition's)",
        "partition": "Slurm partition (default: the cluster's scheduler.partition)",
        "time": "time limit of a student job [D-]HH[:MM[:SS]] (default: the cluster's scheduler.time)",
        "name": "launcher name: writes OUT/<name>.sbatch (default: train-<cluster>)",
        "account": "Slurm account the students' jobs use (default: the cluster's scheduler.account)",
        "registry": "registry file (default: $SHIPYARD_REGISTRY or ./registry.yaml)",
        "replace": "replace the handout's files in a non-empty --out (a new handout over an old one)",
        "force": "go on despite `invoke check` ERRORs (named in the launcher's header)",
        "dry_run": "print the launcher and STUDENTS.md instead of writing them (also before the image is staged)",
    },
)
@task_guard
def course_handout(c, environment=None, cluster=None, out="", nodes=None, gpus_per_node=None, partition=None,
                   time=None, name=None, account=None, registry=None, replace=False, force=False, dry_run=False):
    """Write a student folder: a launcher with no instructor path (per-user logs, checkpoints), STUDENTS.md."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import course as course_commands  # lazy: start-up of every task

    opts = launch_options.Options(environment=environment, cluster=cluster, nodes=nodes, gpus_per_node=gpus_per_node,
                                  partition=partition, time=time, name=name, account=account, registry=registry,
                                  force=force)
    raise SystemExit(course_commands.handout_folder(Context.load(registry), opts, out, argv_after_dashdash(sys.argv),
                                                    replace=replace, dry_run=dry_run))


course_tasks = Collection("course", course_handout)


@task(name="sweep-status", positional=["name"],
      help={"name": "the sweep's launcher name, as given to invoke launch --name NAME --sweep ..."})
@task_guard
def sweep_status(c, name):
    """One row per combination of a sweep: index, done or not, run directory, values."""
    from shipyard.commands import launch as launch_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(launch_commands.sweep_status(Context.load(), name))


@task(name="profile", help={"cluster": "cluster whose partitions and image the profile names (default: "
                                         "defaults.cluster)",
                             "env": "environment whose staged image plugin jobs run in (default: defaults.environment)",
                             "check": "write nothing; exit 1 when the files differ from what the registry gives"})
@task_guard
def snakemake_profile(c, cluster=None, env=None, check=False):
    """Write snakemake/<cluster>/: a Snakemake profile and the Slurm plugin's partition file, from the registry."""
    from shipyard.commands import launch as launch_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(launch_commands.snakemake_profile(Context.load(), cluster, env, check=check))


snakemake_tasks = Collection("snakemake", snakemake_profile)


# ----------------------------------------------------------------------------------------------- sandbox, demo
# The local Slurm cluster (shipyard/sandbox/) and the README's main command (shipyard/commands/demo.py).

_SANDBOX_DIR_HELP = "sandbox directory (default: $SHIPYARD_SANDBOX_DIR, else /var/tmp/shipyard-sandbox: one per machine)"


@task(
    name="up",
    help={
        "nodes": "number of slurmd nodes, each in its own namespaces (default: clusters.sandbox.nodes)",
        "gpus_per_node": "fake GPUs (GRES) per node (default: clusters.sandbox.gpus_per_node)",
        "directory": _SANDBOX_DIR_HELP,
        "no_install": "do not apt-get install missing packages; fail naming them",
    },
)
@task_guard
def sandbox_up(c, nodes=None, gpus_per_node=None, directory=None, no_install=False):
    """Start a real local Slurm cluster (munged, slurmctld, one slurmd per node) as root; idempotent."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import sandbox as sandbox_commands  # lazy: start-up of every task

    raise SystemExit(sandbox_commands.up(Context.load(), nodes, gpus_per_node, directory, install=not no_install))


@task(name="down", help={"directory": _SANDBOX_DIR_HELP, "keep": "keep config, state and logs on disk"})
@task_guard
def sandbox_down(c, directory=None, keep=False):
    """Stop exactly the processes sandbox.up started (by PID); remove its namespaces and, unless --keep, its files."""
    from shipyard.commands import sandbox as sandbox_commands  # lazy: start-up of every task

    raise SystemExit(sandbox_commands.down(directory, keep=keep))


@task(name="status", help={"directory": _SANDBOX_DIR_HELP})
@task_guard
def sandbox_status(c, directory=None):
    """Show the sandbox's nodes, partitions and running jobs."""
    from shipyard.commands import sandbox as sandbox_commands  # lazy: start-up of every task

    raise SystemExit(sandbox_commands.status(directory))


@task(name="exec", help={"directory": _SANDBOX_DIR_HELP})
@task_guard
def sandbox_exec(c, directory=None):
    """Run a Slurm client against the sandbox, argv kept exact: invoke sandbox.exec -- sbatch job.sbatch"""
    from shipyard.commands import sandbox as sandbox_commands  # lazy: start-up of every task

    raise SystemExit(sandbox_commands.exec_(argv_after_dashdash(sys.argv), directory))


@task(
    name="runtimes",
    help={
        "sources": "folder with the enroot and pyxis source archives (default: ../shared/vendor of the project)",
        "directory": _SANDBOX_DIR_HELP,
        "no_install": "do not apt-get install missing build packages; fail naming them",
    },
)
@task_guard
def sandbox_runtimes(c, sources=None, directory=None, no_install=False):
    """Build real enroot + pyxis (cached) and install them in the running sandbox; sandbox.down removes them."""
    from shipyard.commands import sandbox as sandbox_commands  # lazy: start-up of every task

    here = Path(__file__).resolve().parents[1]  # the shipyard checkout: ../shared/vendor is beside it
    raise SystemExit(sandbox_commands.runtimes(here, sources, directory, install=not no_install))


sandbox_tasks = Collection("sandbox", sandbox_up, sandbox_down, sandbox_status, sandbox_exec, sandbox_runtimes)


# ----------------------------------------------------------------------------------------------- remote (docs/remote.md)
# A cluster reached from a workstation over ssh: one shared connection, the project shipped (shipyard/remote/).


@task(name="login", positional=["cluster"], help={"cluster": "a cluster with login and remote in registry.yaml"})
@task_guard
def remote_login(c, cluster):
    """Open the shared ssh connection to CLUSTER's login node once (may prompt: passphrase, one-time code)."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import remote as remote_commands  # lazy: start-up of every task

    raise SystemExit(remote_commands.login(Context.load(), cluster))


@task(name="sync", positional=["cluster"], help={"cluster": "a cluster with login and remote in registry.yaml"})
@task_guard
def remote_sync(c, cluster):
    """Ship the project (tracked files and locks) to REMOTE_ROOT/<project> through the shared connection."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import remote as remote_commands  # lazy: start-up of every task

    raise SystemExit(remote_commands.sync(Context.load(), cluster))


@task(name="logout", positional=["cluster"], help={"cluster": "a cluster with login and remote in registry.yaml"})
@task_guard
def remote_logout(c, cluster):
    """Close the shared ssh connection to CLUSTER's login node (ssh -O exit)."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import remote as remote_commands  # lazy: start-up of every task

    raise SystemExit(remote_commands.logout(Context.load(), cluster))


remote_tasks = Collection("remote", remote_login, remote_sync, remote_logout)


@task(
    help={
        "steps": "training steps of the demo job (default 60)",
        "timeout": "seconds to wait for the job (default 600)",
        "no_install": "do not apt-get install missing Slurm/munge packages",
    }
)
@task_guard
def demo(c, steps=60, timeout=600, no_install=False):
    """Sandbox up, render the default environment, run a 2-node torchrun job on it, print the training result."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import demo as demo_commands  # lazy: start-up of every task

    raise SystemExit(demo_commands.demo(Context.load(), steps=int(steps), timeout=float(timeout),
                                        install=not no_install))


@task(
    name="import-pcluster",
    positional=["config"],
    help={
        "config": "ParallelCluster 3 cluster config (YAML) to read",
        "name": "cluster profile name (default: the config file's name without .yaml)",
        "registry": "registry file to add it to (default: $SHIPYARD_REGISTRY or ./registry.yaml)",
        "dry_run": "show the diff only; write nothing",
        "yes": "write without asking (asked only on a terminal)",
        "runtime": f"{RUNTIME_CHOICES}; needed for a GPU cluster whose post-install scripts do not show it",
    },
)
@task_guard
def cluster_import_pcluster(c, config, name=None, registry=None, dry_run=False, yes=False, runtime=""):
    """Turn a ParallelCluster config into a cluster profile in registry.yaml (each queue a partition); shows the diff."""
    from shipyard.commands import registry as registry_commands  # lazy: start-up of every task
    raise SystemExit(registry_commands.import_pcluster(config, name, registry, dry_run=dry_run, yes=yes,
                                                       runtime=runtime))


cluster_tasks = Collection("cluster", cluster_import_pcluster)


# ----------------------------------------------------------------------------------------------- build, push, pull


@task(
    positional=["env"],
    help={
        "env": "environment to build (default: defaults.environment)",
        "backend": "apptainer (apptainer build from definitions/ENV.def) or docker (Docker Engine API); default: "
                   "apptainer here, and for a batch build the tool the cluster's runtime needs (pyxis: docker, then "
                   "enroot)",
        "fakeroot": "pass --fakeroot to apptainer build (unprivileged builds)",
        "force": "rebuild even when the manifest says the image is current; also go on despite `invoke check` "
                 "ERRORs (warned, and recorded in containers/ENV.json)",
        "formats": "comma-separated: sif,sqsh (default: sif for apptainer, sif,sqsh for docker where the tools exist)",
        "no_block": "exit at once if another build of ENV is running (default: wait for it)",
        "slurm": "submit the build as a batch job to the cluster's build partition instead of building here",
        "cluster": "with --slurm: cluster profile to use (default: defaults.cluster)",
        "partition": "with --slurm: override the cluster's build partition",
        "wait": "with --slurm: follow the job's log until it ends; exit 1 unless it COMPLETED",
        "verify_rebuild": "build again from the same lock and compare what the two images hold (read from each "
                          "image): apt drift is reported, a Python difference exits 1",
    },
)
@task_guard
def build(c, env=None, backend="", fakeroot=False, force=False, formats="", no_block=False, slurm=False,
          cluster="", partition="", wait=False, verify_rebuild=False):
    """Build containers/ENV.sif (and .sqsh / a docker image) when its inputs changed; record containers/ENV.json."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import containers as container_commands  # lazy: the build backends cost ~0.1 s

    raise SystemExit(container_commands.build(
        Context.load(), env, backend=backend, fakeroot=fakeroot, force=force, formats=formats or None,
        block=not no_block, slurm=slurm, cluster=cluster, partition=partition, wait=wait,
        verify_rebuild=verify_rebuild))


@task(
    positional=["env"],
    help={
        "env": "environment (default: defaults.environment)",
        "against": "another build manifest (a kept containers/ENV.json, or the one of a staged version) to compare "
                   "the last build with (default: the build before the last)",
    },
)
@task_guard
def diff(c, env=None, against=""):
    """What changed between two builds of ENV: Python packages, apt packages, libraries, labels (read from the images)."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import containers as container_commands  # lazy: the build backends cost ~0.1 s

    raise SystemExit(container_commands.diff(Context.load(), env, against or None))


@task(
    positional=["env"],
    help={
        "env": "environment to push (default: defaults.environment)",
        "registry": "registry name from registry.yaml (default: defaults.registry); oras:// pushes the SIF, "
                    "docker:// the docker image",
        "tag": "tag to push (default: the first 12 hex digits of the build's input hash)",
    },
)
@task_guard
def push(c, env=None, registry="", tag=""):
    """Push ENV's image and verify the pushed digest by reading the manifest back; record it in containers/ENV.json."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import containers as container_commands  # lazy: the build backends cost ~0.1 s

    raise SystemExit(container_commands.push(Context.load(), env, registry, tag))


@task(
    positional=["env"],
    help={
        "env": "environment to pull (default: defaults.environment)",
        "registry": "registry name from registry.yaml (default: defaults.registry)",
        "tag": "tag to pull (default: the one recorded by the last push to that registry)",
        "force": "replace a local SIF that differs from the pulled one",
    },
)
@task_guard
def pull(c, env=None, registry="", tag="", force=False):
    """Fetch ENV's image from a registry and verify its digest (SIF lands in containers/ENV.sif)."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import containers as container_commands  # lazy: the build backends cost ~0.1 s

    raise SystemExit(container_commands.pull(Context.load(), env, registry, tag, force=force))


@task(
    positional=["env"],
    help={
        "env": "environment to stage (default: defaults.environment)",
        "cluster": "cluster whose storage receives ENV.sif (apptainer) or ENV.sqsh (pyxis) (default: defaults.cluster)",
        "from": "containers (the build in containers/), registry (SIF over ORAS) or docker (pyxis: enroot import "
                "as a job on the build partition); default: containers, or docker for a pyxis cluster without .sqsh",
        "registry": "with --from registry: registry name from registry.yaml (default: defaults.registry)",
        "tag": "with --from registry: tag to pull (default: the one the last push recorded)",
        "mode": "permissions of the image and its record: group (0640, default), world (0644) or an octal mode",
        "link": "hard-link instead of copying (same filesystem only)",
        "force": "stage even when `invoke check` finds an ERROR for ENV on the cluster (warned, recorded beside the "
                 "image); with --prune, remove versions that handouts bind too",
        "list": "list the staged versions of ENV's image, the current one and the handouts that bind each",
        "rollback": "point ENV's image back at the version staged before the current one",
        "prune": "remove the staged versions that are not current and that no handout binds",
    },
)
@task_guard
def stage(c, env=None, cluster=None, from_="auto", registry="", tag="", mode="", link=False, force=False,
          list_=False, rollback=False, prune=False):
    """Put ENV's image into the cluster's storage atomically, verified, with a record launchers check."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import stage as stage_commands  # lazy: the build backends cost ~0.1 s

    raise SystemExit(stage_commands.stage(Context.load(), env, cluster, source=from_, registry=registry, tag=tag,
                                          mode=mode, link=link, force=force, list_=list_, rollback=rollback,
                                          prune=prune))


# ----------------------------------------------------------------------------------------------- locks, modules, signing


@task(
    name="lock",
    positional=["env"],
    help={
        "env": "environment to lock (default: defaults.environment)",
        "exclude_newer": "resolve as PyPI was at this UTC date/time (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ); "
                         "default: the cut-off recorded in the existing lock, else today 00:00 UTC",
        "index_url": "package index to resolve against instead of PyPI, uv's default (e.g. a site mirror); without "
                     "credentials: those go in ~/.netrc, or give the whole URL in $UV_DEFAULT_INDEX instead",
    },
)
@task_guard
def lock_(c, env=None, exclude_newer=None, index_url=None):
    """Write definitions/<env>.lock: the full dependency closure, pinned with sha256 hashes (uv pip compile)."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import definitions as definitions_commands  # lazy: start-up of every task

    raise SystemExit(definitions_commands.lock(Context.load(), env, exclude_newer, index_url))


@task(
    positional=["env"],
    help={
        "env": "environment (default: every environment used on the cluster)",
        "cluster": "apptainer or charliecloud cluster whose binds and image storage the wrappers use "
                   "(default: defaults.cluster)",
        "prefix": "where to write modulefiles/ and wrappers/ (default: <project>/modules)",
        "force": "write even when `invoke check` finds an ERROR for an environment on the cluster (warns)",
    },
)
@task_guard
def modules(c, env=None, cluster=None, prefix=None, force=False):
    """Write Lmod modulefiles shipyard/<env>.lua and wrappers (python, torchrun, pip, ...) that run each tool in the
    image: `apptainer exec --nv` or Charliecloud's `ch-run`, as the cluster's runtime says."""
    from shipyard.commands import launch as launch_commands  # lazy: start-up of every task
    from shipyard.commands.context import Context  # lazy: start-up of every task
    raise SystemExit(launch_commands.modules(Context.load(), env, cluster, prefix, force=force))


@task(
    positional=["env"],
    help={
        "env": "environment whose containers/<env>.sif to sign (default: defaults.environment)",
        "keyidx": "private key to sign with: its index in `apptainer key list --secret` (default 0)",
    },
)
@task_guard
def sign(c, env=None, keyidx=0):
    """Sign containers/<env>.sif with apptainer sign (your keyring) and record the signature in the manifest."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import containers as container_commands  # lazy: the build backends cost ~0.1 s

    raise SystemExit(container_commands.sign(Context.load(), env, int(keyidx)))


@task(positional=["env"], help={"env": "environment whose containers/<env>.sif to verify (default: defaults.environment)"})
@task_guard
def verify(c, env=None):
    """Verify containers/<env>.sif with apptainer verify --local against the key recorded by invoke sign."""
    from shipyard.commands.context import Context  # lazy: start-up of every task
    from shipyard.commands import containers as container_commands  # lazy: the build backends cost ~0.1 s

    raise SystemExit(container_commands.verify(Context.load(), env))


# ----------------------------------------------------------------------------------------------- namespace

ns = Collection(list_, show, check, render, launch, nccl_test, sweep_status, nccl_report, usage, status, logs,
                shell, doctor, sandbox_tasks, remote_tasks, cluster_tasks, snakemake_tasks, compat_tasks, demo, build,
                push, pull, stage, lock_, modules, sign, verify, diff, course_tasks)


def main(argv: list[str] | None = None) -> None:
    """The `shipyard` command (console entry point, and `python -m shipyard`): these tasks from any folder, with the
    folder's registry.yaml, without a tasks.py there. Messages then name `shipyard TASK` (cli.as_run)."""
    set_program("shipyard", ns.task_names)
    try:
        Program(namespace=ns, name="shipyard", binary="shipyard", version=__version__).run(argv)
    finally:  # in-process callers (tests) go back to the checkout's name
        set_program("invoke", ())
