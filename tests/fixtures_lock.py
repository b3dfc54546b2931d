"""The lock tests' registry (the ``lock`` preset of make_project) and the fixed cut-off every real resolution in the
tests uses. The lock_project fixture is in tests/definitions/conftest.py."""

from __future__ import annotations

# Every test that resolves against the package index (marked pypi) pins this cut-off, so the results cannot
# drift between runs.
CUTOFF = "2026-11-01T00:00:00Z"

REGISTRY_TEXT = """\
environments:
  e:
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: ubuntu22.04
    pip: [numpy==1.26.4]
  nccl-override:
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: ubuntu22.04
    nccl: "2.21.5"
    torchaudio: false
  cu118:
    torch: "2.3.1"
    cuda: "11.8"
    python: "3.10"
    os: ubuntu22.04
  tiny:
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: ubuntu22.04
    stack: base
    base: nvcr.io/nvidia/pytorch:24.05-py3
    pip: [six==1.16.0]
clusters:
  c:
    runtime: host
    fabric: socket
    gpus_per_node: 0
    scheduler: {partition: p}
"""

