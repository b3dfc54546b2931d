"""`invoke check` findings that depend on how the cluster starts containers and what its GPUs are.

- Charliecloud on a GPU partition: ch-run brings no host GPU libraries, and shipyard runs no ``ch-fromhost
  --nvidia``; without a site mechanism (``clusters.NAME.gpu_injection``) torch sees no GPU, which a job reports
  only after its allocation.
- MIG partitions (``scheduler.partitions.NAME.mig``): one CUDA process sees one MIG instance and NCCL runs no
  communicator across MIG instances, so a multi-process NCCL job can use one per node; a partition that offers more
  per node gets a WARN here (single-process jobs may still use one instance each), and launch refuses
  ``--gpus-per-node`` above one there (shipyard/launch/launcher.py), where the job's GPU count is known.

The facts and their sources are in shipyard/data/compat.yaml (``mig``, ``charliecloud_gpu``).
"""

from __future__ import annotations

from typing import Callable

from shipyard import facts
from shipyard.registry.model import Cluster, Environment

ERROR = "ERROR"
WARN = "WARN"


def check(env: Environment, cluster: Cluster, add: Callable[[str, str, str], None]) -> None:
    """Add the runtime's and the partition's findings for ``env`` on ``cluster`` (seen through one partition)."""
    data = facts.load("compat")
    if cluster.runtime == "charliecloud" and cluster.gpus_per_node > 0 and not cluster.gpu_injection:
        add(ERROR, f"clusters.{cluster.name}.runtime",
            f"charliecloud on partition {cluster.partition} with {cluster.gpus_per_node} GPU(s) per node: "
            f"{' '.join(data['charliecloud_gpu'].split())}; declare how the site injects them "
            f"(clusters.{cluster.name}.gpu_injection) or use pyxis or apptainer")
    limit = int(data["mig"]["gpus_per_node"])
    if cluster.mig and cluster.gpus_per_node > limit:
        add(WARN, cluster.key("gpus_per_node"),
            f"partition {cluster.partition} has MIG instances ({cluster.mig}), {cluster.gpus_per_node} per node: a "
            f"multi-process NCCL job can use {limit} per node, because {' '.join(data['mig']['reason'].split())}; "
            f"launchers there use --gpus-per-node {limit} and refuse more")
