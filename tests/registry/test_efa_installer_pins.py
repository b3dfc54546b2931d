"""One EFA installer fact (shipyard/data/compat.yaml ``efa.current_installer``): the ParallelCluster importer
suggests it, and the registries shipyard ships (registry.yaml, examples/course/registry.yaml) pin it, so that an
instructor who compares the example with an imported cluster sees one version, not two."""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard import registry
from shipyard.registry import compat, pcluster

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [ROOT / "registry.yaml", ROOT / "examples" / "course" / "registry.yaml"]


def test_the_current_installer_is_the_newest_with_recorded_bundles():
    efa = compat.facts()["efa"]
    current = pcluster.current_efa_installer()
    assert efa["current_installer"]["source"].startswith("P:")
    assert current in efa["installers"] and efa["installers"][current].get("aws_ofi_nccl")
    assert current == max(efa["installers"], key=compat.vtuple)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_efa_clusters_pin_the_current_installer(path):
    reg = registry.load(path)
    efa = [c for c in reg.clusters.values() if c.fabric == "efa"]
    assert efa, f"{path} has no EFA cluster any more: drop it from this test"
    for c in efa:
        assert str(c.fabric_options.get("efa_installer")) == pcluster.current_efa_installer(), c.name
