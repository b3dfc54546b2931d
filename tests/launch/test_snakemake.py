"""`invoke snakemake.profile`: the profile and the Slurm plugin's partition file from the registry, golden
and deterministic; --check fails when stale; the plugin's own partition selection, reading the file, picks the partition
the registry implies. The example workflow's run through the plugin on the sandbox: test_snakemake_sandbox.py."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import types
from pathlib import Path

import pytest
import yaml
from fixtures_launch import fake_build_manifest, replace_staged_image, stage_record
from helpers_registry import GOLDEN, golden

from shipyard.commands import snakemake as snakemake_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
from shipyard.launch import image_check, snakemake


@pytest.mark.parametrize("cluster", ["lab-ib", "lab-socket"])
def test_golden_profile_and_partition_file(launch_registry, cluster):
    reg = launch_registry
    image = "/scratch/images/pytorch-2.3.sif"
    check = image_check.Check(image, "ab" * 32, "cd" * 32, f"stage record {image}.json")
    files = snakemake.render(reg, reg.environment(None), reg.cluster(cluster), check)
    assert files == snakemake.render(reg, reg.environment(None), reg.cluster(cluster), check)
    for path, text in files.items():
        golden(GOLDEN / "snakemake" / cluster / path.name, text)
        if path.suffix == ".yaml":
            yaml.safe_load(text)
    parts = yaml.safe_load(files[snakemake.directory(reg.root, cluster) / snakemake.PARTITIONS])["partitions"]
    assert list(parts) == list(reg.cluster(cluster).partitions)


def test_write_then_check_then_stale(launch_project):
    ctx = Context.load(out=io.StringIO())
    with pytest.raises(ShipyardError, match="no image to check the Snakemake profile's image against"):
        snakemake_commands.snakemake_profile(ctx, "lab-ib")
    fake_build_manifest(launch_project, "pytorch-2.3", "sif")
    assert snakemake_commands.snakemake_profile(ctx, "lab-ib") == 0
    assert snakemake_commands.snakemake_profile(ctx, "lab-ib", check=True) == 0
    path = snakemake.directory(ctx.registry.root, "lab-ib") / snakemake.CONFIG
    path.write_text(path.read_text() + "jobs: 1\n")
    with pytest.raises(ShipyardError, match="config.yaml: stale; regenerate with invoke snakemake.profile") as exc:
        snakemake_commands.snakemake_profile(ctx, "lab-ib", check=True)
    assert exc.value.exit_code == 1


PARTITIONED = """\
environments:
  e: {torch: "2.3.1", cuda: "12.1", python: "3.11", os: ubuntu22.04}
clusters:
  site:
    runtime: host
    fabric: socket
    gpus_per_node: 4
    cpus_per_node: 64
    gpus: [{model: A100, arch: sm_80}]
    scheduler:
      partition: a100
      partitions:
        cpu: {gpus_per_node: 0, cpus_per_node: 128, mem_per_node: 512G, max_time: "24:00:00"}
        a100: {mem_per_node: 256G, max_time: "48:00:00"}
        h100: {gpus: [{model: H100, arch: sm_90}], cpus_per_node: 96, mem_per_node: 1024G, max_time: "12:00:00"}
defaults: {environment: e, cluster: site}
"""


@pytest.mark.parametrize("resources, threads, expected", [
    ({"mem_mb": 100_000, "runtime": 600}, 16, "cpu"),          # no GPU: the partition without GPUs
    ({"gpu": 2, "gpu_model": "a100", "runtime": 60}, 1, "a100"),
    ({"gpu": 1, "gpu_model": "h100", "runtime": 60}, 1, "h100"),
    ({"gpu": 1, "runtime": 40 * 60}, 1, "a100"),               # longer than h100's 12 h
    ({"gpu": 1, "mem_mb": 600_000}, 1, "h100"),                # more memory than a100's 256G
])
def test_the_plugin_picks_the_partition_the_registry_implies(tmp_path, make_project, resources, threads, expected):
    """The plugin's own reader and scorer (snakemake-executor-plugin-slurm) on the file shipyard writes. Snakemake's
    dry run (-n) runs no executor plugin, so it shows no partition; the plugin logs its choice when it submits (the
    sandbox test checks that line). The job is a plain object with the fields the scorer reads (name, threads,
    resources), as Snakemake's job gives them."""
    plugin = pytest.importorskip("snakemake_executor_plugin_slurm.partitions")  # test extras, Python >= 3.11
    reg = make_project(PARTITIONED)
    files = snakemake.render(reg, reg.environment(None), reg.cluster("site"))
    path = snakemake.directory(reg.root, "site") / snakemake.PARTITIONS
    snakemake.write(files)
    parts = plugin.read_partition_file(path)
    assert sorted(p.name for p in parts) == ["a100", "cpu", "h100"]
    job = types.SimpleNamespace(name="rule", threads=threads, resources=resources, is_group=lambda: False)
    assert plugin.get_best_partition(parts, job, logging.getLogger(__name__)) == expected


def test_the_profiles_image_check_refuses_a_replaced_image(make_project, tmp_path):
    """The profile names the staged image's check (config shipyard_image_check) and the example Snakefile's onstart
    runs it: it passes for the staged image and stops with one line and exit 3 once the image is replaced and its
    record rewritten."""
    root = make_project("launch", name=".").root
    storage = tmp_path / "storage"
    storage.mkdir()
    text = (root / "registry.yaml").read_text()
    assert text.count("storage: /scratch/images") >= 1
    (root / "registry.yaml").write_text(text.replace("storage: /scratch/images", f"storage: {storage}"))
    image = storage / "pytorch-2.3.sif"
    image.write_bytes(b"the staged image\n" * 500)
    stage_record(image)
    ctx = Context.load(out=io.StringIO())
    assert snakemake_commands.snakemake_profile(ctx, "lab-ib") == 0
    config = yaml.safe_load((snakemake.directory(root, "lab-ib") / snakemake.CONFIG).read_text())["config"]
    check = dict(c.split("=", 1) for c in config)["shipyard_image_check"]
    assert 'shell("bash {CHECK:q}")' in (Path(__file__).resolve().parents[2] / "examples" / "snakemake" /
                                         "Snakefile").read_text()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    ok = subprocess.run(["bash", check], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    replace_staged_image(image)
    bad = subprocess.run(["bash", check], capture_output=True, text=True, env=env)
    assert bad.returncode == 3 and bad.stderr.count("shipyard: error:") == 1, bad.stderr
