"""`invoke build ENV --slurm`: run the same build as a batch job on the cluster's build partition.

Most sites forbid heavy work on login nodes, and a CUDA image build is heavy. The job script is rendered from
``shipyard/containers/templates/build.sbatch.j2`` with the cluster profile's build partition, time, CPUs, memory and account, and
runs the ordinary local build (`invoke build ENV` without ``--slurm``) on the node, so locking, caching and the
manifest are exactly the same. Its output goes to ``containers/logs/ENV-build-%j.out`` (an absolute path: the job's
working directory is not the submitter's).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO

from shipyard import __version__, escaping, project, slurm, templating
from shipyard.containers.common import parse_formats
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write


def _directive(value, what: str):
    """#SBATCH lines are not parsed by a shell, so quoting cannot protect them: refuse anything unusual."""
    if value is None:
        return None
    return escaping.sbatch_value(value, what)


def job_argv(env_name: str, backend: str, fakeroot: bool, force: bool, formats: str | None,
             python: str = sys.executable) -> list[str]:
    """The build the job runs on its node: `python -m shipyard build ...` with this Python (shipyard's tasks come
    with the installed package, so the node needs no checkout, only the same Python on shared storage)."""
    argv = [python, "-m", "shipyard", "build", env_name, "--backend", backend]
    argv += ["--fakeroot"] * fakeroot + ["--force"] * force + (["--formats", formats] if formats else [])
    return argv


def render_job(reg, env_name: str, cluster, partition: str | None, argv: list[str]) -> str:
    """The batch script text (a pure function of the model and the flags; golden-tested)."""
    root = Path(reg.root)
    return templating.render("shipyard.containers", "build.sbatch.j2",
        version=__version__, env=env_name, cluster=cluster.name, job_name=_directive(f"build-{env_name}", "job name"),
        partition=_directive(partition or cluster.build_partition, "--partition"),
        cpus=cluster.build_cpus, mem=_directive(cluster.build_mem, f"clusters.{cluster.name}.scheduler.build_mem"),
        time=_directive(cluster.build_time or cluster.time, f"clusters.{cluster.name}.scheduler.build_time"),
        account=_directive(cluster.account, f"clusters.{cluster.name}.scheduler.account"),
        output=_directive(str(project.build_logs_dir(root) / f"{env_name}-build-%j.out"), "log path (project dir)"),
        modules=cluster.modules, registry=str(reg.path.resolve()), root=str(root), argv=argv,
    )


# What each runtime starts, and so what a build job for its cluster must make: (default backend, format).
_RUNTIME_NEEDS = {"apptainer": ("apptainer", "sif"), "pyxis": ("docker", "sqsh")}


def tool_for(cluster, backend: str | None, formats: str | None) -> tuple[str, str]:
    """(backend, formats) of a build job for ``cluster``: the tool its runtime needs when the flags do not say, and
    a refusal when they cannot make the image it runs. apptainer clusters start a .sif (apptainer build, or docker
    then apptainer); pyxis clusters a .sqsh, which only ``enroot import dockerd://`` after a docker build makes. A
    cluster without a container runtime (host) is a build machine only: the flags decide, apptainer by default."""
    need = _RUNTIME_NEEDS.get(cluster.runtime)
    if need is None:  # a cluster without a container runtime (the sandbox) is only a build machine: the flags decide
        backend = backend or "apptainer"
        parse_formats(formats, backend)
        return backend, formats
    backend = backend or need[0]
    if need[1] == "sqsh" and backend == "apptainer":
        raise ShipyardError(f"build --slurm --cluster {cluster.name} --backend apptainer: the cluster runs pyxis, which "
                            "starts an enroot .sqsh, and apptainer makes only a .sif; use --backend docker (docker and "
                            "enroot on the build node), or build and push with docker elsewhere and run `invoke stage "
                            f"ENV --cluster {cluster.name} --from registry`")
    fmts = parse_formats(formats, backend)
    if need[1] not in fmts:
        raise ShipyardError(f"--formats {formats}: cluster {cluster.name} runs {cluster.runtime}, which starts a "
                            f".{need[1]}; add {need[1]}")
    return backend, formats or need[1]


def submit(reg, env_name: str, *, cluster_name: str | None = None, partition: str | None = None,
           backend: str | None = None, fakeroot: bool = False, force: bool = False, formats: str | None = None,
           wait: bool = False, out: IO[str] | None = None) -> int:
    """Write containers/logs/ENV-build.sbatch, submit it, and with ``wait`` follow the job to its end. The build
    tool is the one the cluster's runtime needs (:func:`tool_for`)."""
    cluster = reg.cluster(cluster_name)
    backend, formats = tool_for(cluster, backend, formats)
    if partition and cluster.partitions and partition not in cluster.partitions:
        raise ShipyardError(f"--partition {partition}: not a partition of cluster {cluster.name} "
                            f"(known: {', '.join(cluster.partitions)})")
    part = cluster.partition_info(partition or cluster.build_partition)
    if cluster.build_cpus and part.cpus_per_node and cluster.build_cpus > part.cpus_per_node:
        raise ShipyardError(f"clusters.{cluster.name}.scheduler.build_cpus {cluster.build_cpus}: partition "
                            f"{part.name} has {part.cpus_per_node} CPUs per node; lower it or pick another "
                            "--partition")
    text = render_job(reg, env_name, cluster, partition, job_argv(env_name, backend, fakeroot, force, formats))
    script = project.build_logs_dir(reg) / f"{env_name}-build.sbatch"
    atomic_write(script, text, mode=0o755)
    job_id = slurm.submit(cluster, script)
    log = project.build_logs_dir(reg) / f"{env_name}-build-{job_id}.out"
    print(f"submitted build of {env_name} as job {job_id} on {cluster.name} "
          f"(partition {partition or cluster.build_partition}); log: {log}", file=out, flush=True)
    if not wait:
        return 0
    ended(slurm.Job(cluster, job_id), log, out, what="build job")
    return 0


def ended(job: slurm.Job, log: Path, out: IO[str] | None, *, what: str, poll: float | None = None) -> str:
    """Follow ``job``'s log to its end (:meth:`shipyard.slurm.Job.follow`); exit 1 unless it succeeded."""
    state = job.follow(log, out or sys.stdout, check_every=poll)
    stuck = job.stuck()
    if stuck:
        job.cancel()
        raise ShipyardError(f"{what} {job.id} cannot start on cluster {slurm.cluster_name(job.cluster)} "
                            f"({stuck}); cancelled it. Nothing was written.", exit_code=2)
    if state is None:
        raise ShipyardError(f"{what} {job.id}: the scheduler no longer knows it; see {log}")
    if not slurm.succeeded(state):
        raise ShipyardError(f"{what} {job.id} ended {state}; see {log}", exit_code=1)
    return state
