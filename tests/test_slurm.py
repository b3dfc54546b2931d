"""The Slurm client's refusals: a machine that is no login node of the cluster is said as such (bad input, exit 2),
not as the raw sbatch error of a refused job (exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_registry import ROOT

from shipyard import registry, slurm
from shipyard.errors import ShipyardError


def _fake_sbatch(tmp_path: Path, monkeypatch, message: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    return script


def test_no_configuration_here_is_one_line_naming_the_login_node(tmp_path, monkeypatch):
    grete = registry.load(ROOT / "registry.yaml").cluster("grete")
    script = _fake_sbatch(tmp_path, monkeypatch, "sbatch: error: Could not establish a configuration source")
    with pytest.raises(ShipyardError) as err:
        slurm.submit(grete, script)
    assert err.value.exit_code == 2
    assert str(err.value).startswith("cluster grete: this machine is not one of its login nodes (sbatch: error: Could "
                                     "not establish a configuration source); run the command on one, or set "
                                     "clusters.grete.login and remote")


def test_a_refused_job_stays_slurms_own_line(tmp_path, monkeypatch):
    grete = registry.load(ROOT / "registry.yaml").cluster("grete")
    script = _fake_sbatch(tmp_path, monkeypatch, "sbatch: error: invalid partition specified: nope")
    with pytest.raises(ShipyardError) as err:
        slurm.submit(grete, script)
    assert err.value.exit_code == 1 and str(err.value) == ("sbatch job.sbatch on cluster grete: sbatch: error: "
                                                           "invalid partition specified: nope")
