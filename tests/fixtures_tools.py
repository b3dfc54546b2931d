"""Helpers of the cluster-facing tools' tests (nccl-report, usage, status/logs, shell, doctor)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
HOSTILE_STORAGE = "/scr atch/it's $(touch PWNED)/ümlaut;x"


def tools_registry_text() -> str:
    """The project's registry.yaml plus what the tools' tests need: a login host for grete and a cluster whose
    site values (storage, modules) are hostile to shell quoting (the ``tools`` preset of make_project)."""
    data = yaml.safe_load((ROOT / "registry.yaml").read_text())
    data["clusters"]["grete"]["login"] = "alice@login.grete.example"
    hostile = copy.deepcopy(data["clusters"]["grete"])
    hostile.update(storage=HOSTILE_STORAGE, modules=["apptainer/1.3 $(id)", "cuda;12"], login="it's@login")
    data["clusters"]["hostile"] = hostile
    hostile_pyxis = copy.deepcopy(data["clusters"]["aws-pcluster"])
    hostile_pyxis.update(storage=HOSTILE_STORAGE)
    data["clusters"]["hostile-pyxis"] = hostile_pyxis
    return "# yaml-language-server: $schema=shipyard/data/registry.schema.json\n" + yaml.safe_dump(data)


def write_tools_registry(directory: Path) -> Path:
    from fixtures_projects import write_project

    return write_project(directory, "tools")
