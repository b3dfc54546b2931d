"""shipyard's command line: one table of tasks (:class:`~shipyard.taskspec.Spec`), each its flags, its help and one
command call; :func:`shipyard.taskspec.make` turns each into an invoke task. No logic lives here.

Installed with the package: `invoke TASK` in the checkout (the checkout's tasks.py adds `invoke test`, which runs the
suite and so exists only there), and `shipyard TASK` (or `python -m shipyard TASK`) from any folder, such as a course
folder outside the checkout.

The registry is ./registry.yaml unless $SHIPYARD_REGISTRY names another file.

Conventions: an optional environment argument is a positional ``env`` with default None; it may be omitted on the
command line (see ``install_parser_hooks``), and then arrives as "" or None: both mean ``defaults.environment``.
`invoke TASK --help`, `invoke TASK -h` and `invoke --help TASK` all print a task's help, with its positionals in the
usage line as the README writes them (same hooks). A new flag is one line in its task's ``flags``, and an argument
in its ``call``.
"""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, Program

from shipyard import __version__, runtimes
from shipyard.cli import install_parser_hooks, set_program

# the launch/nccl-test flags: invoke needs their help before any task runs (the module loads no registry)
from shipyard.launch import options as launch_options
from shipyard.taskspec import REQUIRED, Spec, make

install_parser_hooks()

# every help that lists the runtimes lists them from their registry (shipyard/runtimes/), as the launch options do
RUNTIME_CHOICES = " | ".join(runtimes.NAMES)
CHECKOUT = Path(__file__).resolve().parents[1]  # the shipyard checkout: ../shared/vendor is beside it


# ----------------------------------------------------------------------------------------------- registry, check, render

LIST = Spec(
    "list", "List environments and clusters as tables.",
    {},
    "shipyard.commands.registry:list_", lambda run, f: run(f.context()))

SHOW = Spec(
    "show", "Show an environment's fully resolved pins and where each came from.",
    {"env": (None, "environment name (default: defaults.environment)"),
     "contents": (False, "instead: what the last build's image holds (Python and apt packages, "
                         "CUDA/cuDNN/NCCL libraries, labels), read from the image")},
    "shipyard.commands.registry:show", lambda run, f: run(f.context(), f.env, f.contents), positional=("env",))

CHECK = Spec(
    "check", "Check every environment against the compatibility data, its clusters and its lock; exit 1 on any ERROR.",
    {"env": (None, "only this environment (default: all)"),
     "cluster": (None, "only this cluster (default: all it is used on)")},
    "shipyard.commands.registry:check", lambda run, f: run(f.context(), f.env, f.cluster), positional=("env",))

RENDER = Spec(
    "render", "Render definitions/<env>.def (and .Dockerfile) from registry.yaml; refuses what `invoke check` refuses.",
    {"env": (None, "environment to render (default: defaults.environment)"),
     "all": (False, "render every environment"),
     "check": (False, "do not write; exit 1 and name the stale files if definitions/ differs from what the registry "
                      "renders"),
     "force": (False, "write even when `invoke check ENV` finds an ERROR (a stale or missing lock, no such wheel); "
                      "warns")},
    "shipyard.commands.definitions:render",
    lambda run, f: run(f.context(), f.env, all_envs=f.all, check=f.check, force=f.force), positional=("env",))

COMPAT_REFRESH = Spec(
    "refresh", "Derive compat.yaml's wheel facts from PyPI metadata (uv, metadata only) and show them as a diff.",
    {"torch": ("", "comma-separated torch releases to refresh (default: every release in compat.yaml)"),
     "write": (False, "write compat.yaml after showing the diff (default: show the diff only, exit 1 if it differs)"),
     "no_companions": (False, "skip the torchvision/torchaudio look-ups (faster)")},
    "shipyard.commands.compat:compat_refresh",
    lambda run, f: run(f.torch or None, write=f.write, companions=not f.no_companions))

# ----------------------------------------------------------------------------------------------- cluster-facing tools

NCCL_REPORT = Spec(
    "nccl-report", "Parse nccl-tests output into a bus-bandwidth table and a PNG plot against message size.",
    {"log": (REQUIRED, "nccl-tests output file (e.g. launch/logs/NAME-JOBID.out)"),
     "out": (None, "PNG to write (default: LOG with .png suffix)"),
     "cluster": (None, "cluster whose nominal line rate is drawn (default: defaults.cluster)"),
     "partition": (None, "partition the job ran on: its line rate (default: the cluster's scheduler.partition)")},
    "shipyard.commands.jobs:nccl_report",
    lambda run, f: run(f.log, f.out, f.cluster, partition=f.partition), positional=("log",))

USAGE = Spec(
    "usage", "Summarise a job's --monitor CSVs per node (CPU, RAM, GPU) and plot them over time.",
    {"jobid": (REQUIRED, "Slurm job id whose --monitor samples to summarise"),
     "out": (None, "PNG to write (default: launch/logs/NAME-JOBID.usage.png)"),
     "cluster": (None, "cluster the job ran on (default: defaults.cluster); only its launchers' samples are read")},
    "shipyard.commands.jobs:usage",
    lambda run, f: run(f.context(), f.jobid, f.out, cluster=f.cluster), positional=("jobid",))

STATUS = Spec(
    "status", "Table of your shipyard jobs: queued/running (squeue) and finished (sacct).",
    {"cluster": (None, "cluster whose Slurm to ask (default: defaults.cluster; sandbox talks to the local sandbox)"),
     "since": ("now-2days", "sacct start time for finished jobs (Slurm time syntax, default now-2days)")},
    "shipyard.commands.jobs:status", lambda run, f: run(f.context(), f.cluster, f.since))

LOGS = Spec(
    "logs", "Print the tail of a job's output file (found via scontrol show job, else launch/logs/*-JOBID.out).",
    {"jobid": (REQUIRED, "Slurm job id"),
     "follow": (False, "keep printing new output until the job ends (Ctrl-C stops)"),
     "num_lines": (20, "how many last lines to print first (default 20)"),
     "cluster": (None, "cluster whose Slurm to ask (default: defaults.cluster)")},
    "shipyard.commands.jobs:logs",
    lambda run, f: run(f.context(), f.jobid, follow=f.follow, lines=f.num_lines, cluster=f.cluster),
    positional=("jobid",))

SHELL = Spec(
    "shell", "Interactive srun --pty shell inside the environment's container on the cluster's interactive partition.",
    {"env": (None, "environment whose image to enter (default: defaults.environment)"),
     "cluster": (None, "cluster to run on (default: defaults.cluster); uses its interactive partition"),
     "dry_run": (False, "print the exact command and the ssh config snippet, run nothing"),
     "command": (None, "run this shell command line (bash -c, e.g. 'hostname; nproc') in the container on the node "
                       "instead of an interactive shell"),
     "gpus": (None, "GPUs to request on the node (default: 1 if the cluster has GPUs, else 0)"),
     "time": (None, "time limit (default: 01:00:00 (launch.yaml shell_time), or the cluster's scheduler.time or the "
                    "partition's max_time when shorter)"),
     "runtime": (None, f"{RUNTIME_CHOICES} (default: the cluster's runtime)"),
     "force": (False, "open the shell even when `invoke check` finds an ERROR for ENV on the cluster (warns)"),
     "partition": (None, "partition to run on (default: the cluster's interactive partition)"),
     "sbatch": (None, "extra Slurm option KEY=VALUE for srun (repeatable; the keys --sbatch of invoke launch allows)")},
    "shipyard.commands.shell:shell",
    lambda run, f: run(f.context(), f.env, f.cluster, dry_run=f.dry_run, command=f.command, gpus=f.gpus,
                       time=f.time, runtime=f.runtime, force=f.force, partition=f.partition, sbatch=f.sbatch),
    positional=("env",), iterable=("sbatch",))

DOCTOR = Spec(
    "doctor", "Preflight: Slurm, pyxis, apptainer/enroot, fakeroot, GPUs and driver, shared storage; PASS/WARN/FAIL + fix.",
    {"cluster": (None, "cluster to check (default: defaults.cluster)"),
     "env": (None, "environment whose CUDA/arch needs are checked against the GPUs (default: defaults.environment)"),
     "partition": (None, "partition whose node is probed and whose GPUs are expected (default: scheduler.partition)"),
     "time_start": (False, "also start the staged image on one node, twice, and report the cold and warm start in "
                           "seconds with the runtime's start mode (every container runtime on the sandbox)")},
    "shipyard.commands.jobs:doctor",
    lambda run, f: run(f.context(), f.cluster, f.env, partition=f.partition, time_start=f.time_start))

# ----------------------------------------------------------------------------------------------- launchers
# Both launcher tasks' flags, help, repeatable flags and optional positional come from the one options model
# (shipyard/launch/options.py); their flags become one ``Options`` as they are, which the command passes down (to the
# checks, the launcher and its "regenerate with" line). A new flag is a field there.


def _launch_flags(kind: str) -> dict:
    defaults = launch_options.Options()
    helps = launch_options.help_for(kind)
    return {n: (getattr(defaults, n), helps[n]) for n in launch_options.names(kind)}


def _launch_task_keywords(kind: str) -> dict:
    return {k: v for k, v in launch_options.task_kwargs(kind).items() if k != "help"}


LAUNCH_TASK = Spec(
    "launch", "Write launch/<name>.sbatch for torchrun on 1..N nodes; the training script and its arguments follow `--`.",
    _launch_flags(launch_options.TORCHRUN),
    "shipyard.commands.launch:launch", lambda run, f: run(f.context(), f.options(), f.after_dashdash()),
    extra=_launch_task_keywords(launch_options.TORCHRUN))

NCCL_TEST = Spec(
    "nccl-test", "Write launch/<name>.sbatch running all_reduce_perf with one rank per GPU (read it with nccl-report).",
    _launch_flags(launch_options.NCCL_TEST),
    "shipyard.commands.launch:launch",
    lambda run, f: run(f.context(), f.options(), f.after_dashdash(), kind=launch_options.NCCL_TEST),
    extra=_launch_task_keywords(launch_options.NCCL_TEST))

COURSE_HANDOUT = Spec(
    "handout", "Write a student folder: a launcher with no instructor path (per-user logs, checkpoints), STUDENTS.md.",
    {"environment": (None, "the course environment (default: defaults.environment)"),
     "cluster": (None, "cluster the students run on (default: defaults.cluster)"),
     "out": ("", "folder to write the handout into (students copy it from there); must be empty unless --replace"),
     "nodes": (None, "nodes per student job (default: 1)"),
     "gpus_per_node": (None, "GPUs per node (default: the partition's)"),
     "partition": (None, "Slurm partition (default: the cluster's scheduler.partition)"),
     "time": (None, "time limit of a student job [D-]HH[:MM[:SS]] (default: the cluster's scheduler.time)"),
     "name": (None, "launcher name: writes OUT/<name>.sbatch (default: train-<cluster>)"),
     "account": (None, "Slurm account the students' jobs use (default: the cluster's scheduler.account)"),
     "registry": (None, "registry file (default: $SHIPYARD_REGISTRY or ./registry.yaml)"),
     "replace": (False, "replace the handout's files in a non-empty --out (a new handout over an old one)"),
     "force": (False, "go on despite `invoke check` ERRORs (named in the launcher's header)"),
     "dry_run": (False, "print the launcher and STUDENTS.md instead of writing them (also before the image is "
                        "staged)")},
    "shipyard.commands.course:handout_folder",
    lambda run, f: run(f.context(), f.options("environment", "cluster", "nodes", "gpus_per_node", "partition", "time",
                                              "name", "account", "registry", "force"),
                       f.out, f.after_dashdash(), replace=f.replace, dry_run=f.dry_run),
    positional=("environment",))

SWEEP_STATUS = Spec(
    "sweep-status", "One row per combination of a sweep: index, done or not, run directory, values.",
    {"name": (REQUIRED, "the sweep's launcher name, as given to invoke launch --name NAME --sweep ...")},
    "shipyard.commands.launch:sweep_status", lambda run, f: run(f.context(), f.name), positional=("name",))

SNAKEMAKE_PROFILE = Spec(
    "profile", "Write snakemake/<cluster>/: a Snakemake profile and the Slurm plugin's partition file, from the registry.",
    {"cluster": (None, "cluster whose partitions and image the profile names (default: defaults.cluster)"),
     "env": (None, "environment whose staged image plugin jobs run in (default: defaults.environment)"),
     "check": (False, "write nothing; exit 1 when the files differ from what the registry gives")},
    "shipyard.commands.snakemake:snakemake_profile", lambda run, f: run(f.context(), f.cluster, f.env, check=f.check))

# ----------------------------------------------------------------------------------------------- sandbox, demo
# The local Slurm cluster (shipyard/sandbox/) and the README's main command (shipyard/commands/demo.py).

_SANDBOX_DIR_HELP = "sandbox directory (default: $SHIPYARD_SANDBOX_DIR, else /var/tmp/shipyard-sandbox: one per machine)"

SANDBOX_UP = Spec(
    "up", "Start a real local Slurm cluster (munged, slurmctld, one slurmd per node) as root; idempotent.",
    {"nodes": (None, "number of slurmd nodes, each in its own namespaces (default: clusters.sandbox.nodes)"),
     "gpus_per_node": (None, "fake GPUs (GRES) per node (default: clusters.sandbox.gpus_per_node)"),
     "directory": (None, _SANDBOX_DIR_HELP),
     "no_install": (False, "do not apt-get install missing packages; fail naming them")},
    "shipyard.commands.sandbox:up",
    lambda run, f: run(f.context(), f.nodes, f.gpus_per_node, f.directory, install=not f.no_install))

SANDBOX_DOWN = Spec(
    "down", "Stop exactly the processes sandbox.up started (by PID); remove its namespaces and, unless --keep, its "
            "files.",
    {"directory": (None, _SANDBOX_DIR_HELP), "keep": (False, "keep config, state and logs on disk")},
    "shipyard.commands.sandbox:down", lambda run, f: run(f.directory, keep=f.keep))

SANDBOX_STATUS = Spec(
    "status", "Show the sandbox's nodes, partitions and running jobs.",
    {"directory": (None, _SANDBOX_DIR_HELP)},
    "shipyard.commands.sandbox:status", lambda run, f: run(f.directory))

SANDBOX_EXEC = Spec(
    "exec", "Run a Slurm client against the sandbox, argv kept exact: invoke sandbox.exec -- sbatch job.sbatch",
    {"directory": (None, _SANDBOX_DIR_HELP)},
    "shipyard.commands.sandbox:exec_", lambda run, f: run(f.after_dashdash(), f.directory))

SANDBOX_RUNTIMES = Spec(
    "runtimes", "Build real enroot + pyxis (cached) and install them in the running sandbox; sandbox.down removes them.",
    {"sources": (None, "folder with the enroot and pyxis source archives (default: ../shared/vendor of the project)"),
     "directory": (None, _SANDBOX_DIR_HELP),
     "no_install": (False, "do not apt-get install missing build packages; fail naming them")},
    "shipyard.commands.sandbox:runtimes",
    lambda run, f: run(CHECKOUT, f.sources, f.directory, install=not f.no_install))

# ----------------------------------------------------------------------------------------------- remote (docs/remote.md)
# A cluster reached from a workstation over ssh: one shared connection, the project shipped (shipyard/remote/).

_REMOTE_CLUSTER = {"cluster": (REQUIRED, "a cluster with login and remote in registry.yaml")}

REMOTE_LOGIN = Spec(
    "login", "Open the shared ssh connection to CLUSTER's login node once (may prompt: passphrase, one-time code).",
    _REMOTE_CLUSTER, "shipyard.commands.remote:login",
    lambda run, f: run(f.context(), f.cluster), positional=("cluster",))

REMOTE_SYNC = Spec(
    "sync", "Ship the project (tracked files and locks) to REMOTE_ROOT/<project> through the shared connection.",
    _REMOTE_CLUSTER, "shipyard.commands.remote:sync",
    lambda run, f: run(f.context(), f.cluster), positional=("cluster",))

REMOTE_LOGOUT = Spec(
    "logout", "Close the shared ssh connection to CLUSTER's login node (ssh -O exit).",
    _REMOTE_CLUSTER, "shipyard.commands.remote:logout",
    lambda run, f: run(f.context(), f.cluster), positional=("cluster",))

DEMO_TASK = Spec(
    "demo", "Sandbox up, render the default environment, run a 2-node torchrun job on it, print the training result.",
    {"steps": (60, "training steps of the demo job (default 60)"),
     "timeout": (600, "seconds to wait for the job (default 600)"),
     "no_install": (False, "do not apt-get install missing Slurm/munge packages")},
    "shipyard.commands.demo:demo",
    lambda run, f: run(f.context(), steps=int(f.steps), timeout=float(f.timeout), install=not f.no_install))

CLUSTER_IMPORT_PCLUSTER = Spec(
    "import-pcluster",
    "Turn a ParallelCluster config into a cluster profile in registry.yaml (each queue a partition); shows the diff.",
    {"config": (REQUIRED, "ParallelCluster 3 cluster config (YAML) to read"),
     "name": (None, "cluster profile name (default: the config file's name without .yaml)"),
     "registry": (None, "registry file to add it to (default: $SHIPYARD_REGISTRY or ./registry.yaml)"),
     "dry_run": (False, "show the diff only; write nothing"),
     "yes": (False, "write without asking (asked only on a terminal)"),
     "runtime": ("", f"{RUNTIME_CHOICES}; needed for a GPU cluster whose post-install scripts do not show it"),
     "update": (None, "NAME: re-read the edited config into the existing profile NAME (keeps the keys you added; "
                      "shows the diff; writes only with --yes)")},
    "shipyard.commands.pcluster:import_pcluster",
    lambda run, f: run(f.config, f.name, f.registry, dry_run=f.dry_run, yes=f.yes, runtime=f.runtime,
                       update=f.update),
    positional=("config",))

# ----------------------------------------------------------------------------------------------- build, push, pull

BUILD = Spec(
    "build", "Build containers/ENV.sif (and .sqsh / a docker image) when its inputs changed; record containers/ENV.json.",
    {"env": (None, "environment to build (default: defaults.environment)"),
     "backend": ("", "apptainer (apptainer build from definitions/ENV.def) or docker (Docker Engine API); default: "
                     "apptainer here, and for a batch build the tool the cluster's runtime needs (pyxis: docker, "
                     "then enroot)"),
     "fakeroot": (False, "pass --fakeroot to apptainer build (unprivileged builds)"),
     "force": (False, "rebuild even when the manifest says the image is current; also go on despite `invoke check` "
                      "ERRORs (warned, and recorded in containers/ENV.json)"),
     "formats": ("", "comma-separated: sif,sqsh (default: sif for apptainer, sif,sqsh for docker where the tools "
                     "exist)"),
     "no_block": (False, "exit at once if another build of ENV is running (default: wait for it)"),
     "slurm": (False, "submit the build as a batch job to the cluster's build partition instead of building here"),
     "cluster": ("", "with --slurm: cluster profile to use (default: defaults.cluster)"),
     "partition": ("", "with --slurm: override the cluster's build partition"),
     "wait": (False, "with --slurm: follow the job's log until it ends; exit 1 unless it COMPLETED"),
     "verify_rebuild": (False, "build again from the same lock and compare what the two images hold (read from each "
                               "image): apt drift is reported, a Python difference exits 1")},
    "shipyard.commands.containers:build",
    lambda run, f: run(f.context(), f.env, backend=f.backend, fakeroot=f.fakeroot, force=f.force,
                       formats=f.formats or None, block=not f.no_block, slurm=f.slurm, cluster=f.cluster,
                       partition=f.partition, wait=f.wait, verify_rebuild=f.verify_rebuild),
    positional=("env",))

DIFF = Spec(
    "diff", "What changed between two builds or staged versions of ENV: Python packages, apt packages, libraries, "
            "labels\n(read from the images).",
    {"env": (None, "environment (default: defaults.environment)"),
     "against": ("", "another build manifest (a kept copy of containers/ENV.json) to compare the last build with "
                     "(default: the build before the last)"),
     "staged": (None, "a staged version on the cluster's storage (`current`, its file name, or a sha256 prefix as "
                      "`stage --list` shows it): once, that version against the last build; twice, the first version "
                      "against the second"),
     "cluster": (None, "the cluster whose staged versions --staged names (default: defaults.cluster)")},
    "shipyard.commands.containers:diff",
    lambda run, f: run(f.context(), f.env, f.against or None, f.staged, f.cluster),
    positional=("env",), iterable=("staged",))

PUSH = Spec(
    "push", "Push ENV's image and verify the pushed digest by reading the manifest back; record it in "
            "containers/ENV.json.",
    {"env": (None, "environment to push (default: defaults.environment)"),
     "registry": ("", "registry name from registry.yaml (default: defaults.registry); oras:// pushes the SIF, "
                      "docker:// the docker image"),
     "tag": ("", "tag to push (default: the first 12 hex digits of the build's input hash)")},
    "shipyard.commands.containers:push", lambda run, f: run(f.context(), f.env, f.registry, f.tag), positional=("env",))

PULL = Spec(
    "pull", "Fetch ENV's image from a registry and verify its digest (SIF lands in containers/ENV.sif).",
    {"env": (None, "environment to pull (default: defaults.environment)"),
     "registry": ("", "registry name from registry.yaml (default: defaults.registry)"),
     "tag": ("", "tag to pull (default: the one recorded by the last push to that registry)"),
     "force": (False, "replace a local SIF that differs from the pulled one")},
    "shipyard.commands.containers:pull", lambda run, f: run(f.context(), f.env, f.registry, f.tag, force=f.force),
    positional=("env",))

STAGE_TASK = Spec(
    "stage", "Put ENV's image into the cluster's storage atomically, verified, with a record launchers check.",
    {"env": (None, "environment to stage (default: defaults.environment)"),
     "cluster": (None, "cluster whose storage receives ENV.sif (apptainer) or ENV.sqsh (pyxis) (default: "
                       "defaults.cluster)"),
     "from_": ("auto", "containers (the build in containers/), registry (SIF over ORAS) or docker (pyxis: enroot "
                       "import as a job on the build partition); default: containers, or docker for a pyxis cluster "
                       "without .sqsh"),
     "registry": ("", "with --from registry: registry name from registry.yaml (default: defaults.registry)"),
     "tag": ("", "with --from registry: tag to pull (default: the one the last push recorded)"),
     "mode": ("", "permissions of the image and its record: group (0640, default), world (0644) or an octal mode"),
     "link": (False, "hard-link instead of copying (same filesystem only)"),
     "force": (False, "stage even when `invoke check` finds an ERROR for ENV on the cluster (warned, recorded beside "
                      "the image); with --prune, remove versions that handouts bind too"),
     "list_": (False, "list the staged versions of ENV's image, the current one and the handouts that bind each"),
     "rollback": (False, "point ENV's image back at the version staged before the current one"),
     "prune": (False, "remove the staged versions that are not current and that no handout binds")},
    "shipyard.commands.stage:stage",
    lambda run, f: run(f.context(), f.env, f.cluster, source=f.from_, registry=f.registry, tag=f.tag, mode=f.mode,
                       link=f.link, force=f.force, list_=f.list_, rollback=f.rollback, prune=f.prune),
    positional=("env",))

# ----------------------------------------------------------------------------------------------- locks, modules, signing

LOCK = Spec(
    "lock", "Write definitions/<env>.lock: the full dependency closure, pinned with sha256 hashes (uv pip compile), "
            "and\nthe base image's digest (looked up through base_mirror or its registry).",
    {"env": (None, "environment to lock (default: defaults.environment)"),
     "exclude_newer": (None, "resolve as PyPI was at this UTC date/time (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ); "
                             "default: the cut-off recorded in the existing lock, else today 00:00 UTC"),
     "index_url": (None, "package index to resolve against instead of PyPI, uv's default (e.g. a site mirror); "
                         "without credentials: those go in ~/.netrc, or give the whole URL in $UV_DEFAULT_INDEX "
                         "instead"),
     "update_base": (False, "only look up the base image's tag again and record the digest it names now (the Python "
                            "closure is kept); without it a digest already recorded is kept")},
    "shipyard.commands.definitions:lock",
    lambda run, f: run(f.context(), f.env, f.exclude_newer, f.index_url, f.update_base),
    positional=("env",))

MODULES = Spec(
    "modules", "Write Lmod modulefiles shipyard/<env>.lua and wrappers (python, torchrun, pip, ...) that run each tool "
               "in the\nimage: `apptainer exec --nv` or Charliecloud's `ch-run`, as the cluster's runtime says.",
    {"env": (None, "environment (default: every environment used on the cluster)"),
     "cluster": (None, "apptainer or charliecloud cluster whose binds and image storage the wrappers use "
                       "(default: defaults.cluster)"),
     "prefix": (None, "where to write modulefiles/ and wrappers/ (default: <project>/modules)"),
     "force": (False, "write even when `invoke check` finds an ERROR for an environment on the cluster (warns)")},
    "shipyard.commands.modules:modules", lambda run, f: run(f.context(), f.env, f.cluster, f.prefix, force=f.force),
    positional=("env",))

SIGN = Spec(
    "sign", "Sign containers/<env>.sif with apptainer sign (your keyring) and record the signature in the manifest.",
    {"env": (None, "environment whose containers/<env>.sif to sign (default: defaults.environment)"),
     "keyidx": (0, "private key to sign with: its index in `apptainer key list --secret` (default 0)")},
    "shipyard.commands.containers:sign", lambda run, f: run(f.context(), f.env, int(f.keyidx)), positional=("env",))

VERIFY = Spec(
    "verify", "Verify containers/<env>.sif with apptainer verify --local against the key recorded by invoke sign.",
    {"env": (None, "environment whose containers/<env>.sif to verify (default: defaults.environment)")},
    "shipyard.commands.containers:verify", lambda run, f: run(f.context(), f.env), positional=("env",))

# ----------------------------------------------------------------------------------------------- namespace

TOP = (LIST, SHOW, CHECK, RENDER, LAUNCH_TASK, NCCL_TEST, SWEEP_STATUS, NCCL_REPORT, USAGE, STATUS, LOGS, SHELL,
       DOCTOR, DEMO_TASK, BUILD, PUSH, PULL, STAGE_TASK, LOCK, MODULES, SIGN, VERIFY, DIFF)
COLLECTIONS = {
    "sandbox": (SANDBOX_UP, SANDBOX_DOWN, SANDBOX_STATUS, SANDBOX_EXEC, SANDBOX_RUNTIMES),
    "remote": (REMOTE_LOGIN, REMOTE_SYNC, REMOTE_LOGOUT),
    "cluster": (CLUSTER_IMPORT_PCLUSTER,),
    "snakemake": (SNAKEMAKE_PROFILE,),
    "compat": (COMPAT_REFRESH,),
    "course": (COURSE_HANDOUT,),
}
SPECS = TOP + tuple(s for specs in COLLECTIONS.values() for s in specs)

ns = Collection(*(make(s) for s in TOP),
                *(Collection(name, *(make(s) for s in specs)) for name, specs in COLLECTIONS.items()))


def main(argv: list[str] | None = None) -> None:
    """The `shipyard` command (console entry point, and `python -m shipyard`): these tasks from any folder, with the
    folder's registry.yaml, without a tasks.py there. Messages then name `shipyard TASK` (cli.as_run)."""
    set_program("shipyard", ns.task_names)
    try:
        Program(namespace=ns, name="shipyard", binary="shipyard", version=__version__).run(argv)
    finally:  # in-process callers (tests) go back to the checkout's name
        set_program("invoke", ())
