"""The nccl-test launcher the sandbox gets, for each runtime (pyxis, apptainer, host): this checkout's registry.yaml
(`clusters.sandbox`: mpi none, 2 nodes x 2 fake GPUs) rooted at a fixed fake project path. The sandbox tests
(test_launch_sandbox.py) submit the same launchers with `sbatch --test-only`, and
tests/containers/test_nccl_tests_real_pyxis.py runs the pyxis one for real."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_launch import FAKE_ROOT, build_launcher
from helpers_registry import GOLDEN, golden

from shipyard import registry
from shipyard.launch import launcher as launch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "host"])
def test_golden_sandbox_nccl_test_launcher(runtime):
    reg = registry.load_text((REPO / "registry.yaml").read_text(), "registry.yaml", path=FAKE_ROOT / "registry.yaml")
    text = launch.render(build_launcher(reg, cluster="sandbox", nodes=2, kind="nccl-test", runtime=runtime))
    assert "srun --mpi=none " in text
    golden(GOLDEN / "launch" / f"nccl-test-sandbox-{runtime}.sbatch", text)
