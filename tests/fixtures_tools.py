"""Fixtures of the cluster-facing tools' tests (nccl-report, usage, status/logs, shell, doctor)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HOSTILE_STORAGE = "/scr atch/it's $(touch PWNED)/ümlaut;x"


def write_tools_registry(directory: Path) -> Path:
    """The project's registry.yaml plus what the tools' tests need: a login host for grete and a cluster whose
    site values (storage, modules) are hostile to shell quoting."""
    data = yaml.safe_load((ROOT / "registry.yaml").read_text())
    data["clusters"]["grete"]["login"] = "alice@login.grete.example"
    hostile = copy.deepcopy(data["clusters"]["grete"])
    hostile.update(storage=HOSTILE_STORAGE, modules=["apptainer/1.3 $(id)", "cuda;12"], login="it's@login")
    data["clusters"]["hostile"] = hostile
    hostile_pyxis = copy.deepcopy(data["clusters"]["aws-pcluster"])
    hostile_pyxis.update(storage=HOSTILE_STORAGE)
    data["clusters"]["hostile-pyxis"] = hostile_pyxis
    path = directory / "registry.yaml"
    path.write_text("# yaml-language-server: $schema=shipyard/data/registry.schema.json\n" + yaml.safe_dump(data))
    return path


@pytest.fixture
def tools_registry(tmp_path):
    """A loaded registry (see :func:`write_tools_registry`) whose project root is a fresh temp directory."""
    from shipyard import registry

    return registry.load(write_tools_registry(tmp_path))
