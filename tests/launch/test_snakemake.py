"""`invoke snakemake.profile` (issue 24): the profile and the Slurm plugin's partition file from the registry, golden
and deterministic; --check fails when stale. (The example workflow and a run through the plugin are not here yet.)"""

from __future__ import annotations

import io

import pytest
import yaml
from helpers_registry import GOLDEN, golden

from shipyard.commands import launch as launch_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.launch import snakemake


@pytest.mark.parametrize("cluster", ["lab-ib", "lab-socket"])
def test_golden_profile_and_partition_file(launch_registry, cluster):
    reg = launch_registry
    files = snakemake.render(reg, reg.environment(None), reg.cluster(cluster))
    assert files == snakemake.render(reg, reg.environment(None), reg.cluster(cluster))
    for path, text in files.items():
        golden(GOLDEN / "snakemake" / cluster / path.name, text)
        yaml.safe_load(text)
    parts = yaml.safe_load(files[snakemake.directory(reg.root, cluster) / snakemake.PARTITIONS])["partitions"]
    assert list(parts) == list(reg.cluster(cluster).partitions)


def test_write_then_check_then_stale(launch_project):
    ctx = Context.load(out=io.StringIO())
    assert launch_commands.snakemake_profile(ctx, "lab-ib") == 0
    assert launch_commands.snakemake_profile(ctx, "lab-ib", check=True) == 0
    path = snakemake.directory(ctx.registry.root, "lab-ib") / snakemake.CONFIG
    path.write_text(path.read_text() + "jobs: 1\n")
    with pytest.raises(ShipyardError, match="config.yaml: stale; regenerate with invoke snakemake.profile") as exc:
        launch_commands.snakemake_profile(ctx, "lab-ib", check=True)
    assert exc.value.exit_code == 1
