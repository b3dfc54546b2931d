"""Fixtures for the launcher tests: a fixed test registry (one cluster per fabric) and a temporary project.

The registry is fixed here (not the project's registry.yaml) so that golden files change only when the launcher
changes, and its root is a fixed fake path so that absolute paths in the goldens are stable.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard import registry

LAUNCH_REGISTRY = """\
environments:
  pytorch-2.3:
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: ubuntu22.04
    env:
      OMP_NUM_THREADS: "1"
clusters:
  lab-efa:
    runtime: pyxis
    fabric: efa
    gpus_per_node: 8
    cpus_per_node: 192
    scheduler: {partition: gpu, partitions: [cpu, gpu], time: "04:00:00"}
    binds: [/fsx:/fsx]
    storage: /fsx/images
    fabric_options: {efa_installer: "1.43.0", aws_ofi_nccl: "1.16.1", line_rate_gbps: 3200}
  lab-efa-old:
    runtime: pyxis
    fabric: efa
    gpus_per_node: 8
    scheduler: {partition: gpu}
    storage: /fsx/images
    fabric_options: {aws_ofi_nccl: "1.5.0"}
  lab-ib:
    runtime: apptainer
    fabric: ib
    gpus_per_node: 4
    cpus_per_node: 64
    scheduler: {partition: grete, partitions: [grete, grete-interactive], account: proj1, time: "02:00:00"}
    modules: [apptainer]
    binds: [/scratch, "/mnt/data:/data:ro"]
    storage: /scratch/images
    fabric_options: {ib_hca: mlx5}
    env: {NCCL_SOCKET_IFNAME: ib0}
  lab-socket:
    runtime: host
    fabric: socket
    nodes: 2
    gpus_per_node: 2
    cpus_per_node: 2
    scheduler: {partition: debug, time: "00:10:00"}
    storage: images
defaults:
  environment: pytorch-2.3
  cluster: lab-socket
"""

FAKE_ROOT = Path("/srv/shipyard-project")
# A training command with the kinds of words that break naive quoting.
HOSTILE_ARGS = ("--epochs", "3", "two words", "it's \"quoted\"", "$(touch /tmp/pwned)", "a;b", "line1\nline2",
                "grüße 日本", "{{ not_jinja }}", "$HOME", "`id`", "*", "")


@pytest.fixture
def launch_registry():
    """The test registry, rooted at a fixed fake project path."""
    return registry.load_text(LAUNCH_REGISTRY, "registry.yaml", path=FAKE_ROOT / "registry.yaml")


@pytest.fixture
def launch_project(tmp_path, monkeypatch):
    """A temporary project directory holding the test registry; $SHIPYARD_REGISTRY points at it."""
    (tmp_path / "registry.yaml").write_text(LAUNCH_REGISTRY)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(tmp_path / "registry.yaml"))
    monkeypatch.chdir(tmp_path)
    return tmp_path
