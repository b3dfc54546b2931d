"""The contents probe inside a SIF made by the real Apptainer: `apptainer exec IMAGE /bin/sh -c PROBE` as the build
runs it, on the busybox test image with a venv stand-in, a library and labels added by a definition."""

from __future__ import annotations

import os

import pytest
from fixtures_sif import build_sif

from shipyard.containers import apptainer

pytestmark = pytest.mark.real_apptainer

# A venv whose python answers `-m pip list --format=json ...` as pip does (busybox has no Python), a NCCL-named
# library under /opt and one outside the probe's roots, and %labels.
DEFINITION = """\
Bootstrap: localimage
From: {base}

%post
    mkdir -p /opt/venv/bin /opt/venv/lib/nvidia/nccl/lib /srv/lib
    echo '[{{"name": "Torch", "version": "2.3.1"}}]' > /opt/venv/pip-list.json
    printf '#!/bin/sh\\ncat /opt/venv/pip-list.json\\n' > /opt/venv/bin/python
    chmod 755 /opt/venv/bin/python
    echo nccl > /opt/venv/lib/nvidia/nccl/lib/libnccl.so.2.21.5
    ln -s libnccl.so.2.21.5 /opt/venv/lib/nvidia/nccl/lib/libnccl.so.2
    echo elsewhere > /srv/lib/libcudart.so.12.1.105

%labels
    org.shipyard.environment probe-test
"""


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_probe_reads_the_sif(real_apptainer, staging_sif, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{real_apptainer}{os.pathsep}{os.environ['PATH']}")
    definition = tmp_path / "probe.def"
    definition.write_text(DEFINITION.format(base=staging_sif))
    sif = build_sif(real_apptainer, tmp_path / "probe.sif", definition, tmp_path)
    rec = apptainer.probe_sif(sif, tmp_path)
    assert rec.probed == "apptainer exec"
    assert rec.python == {"torch": "2.3.1"}
    # the regular file, by the version its name carries; not the soname link, nothing outside /usr and /opt
    assert rec.libraries == {"/opt/venv/lib/nvidia/nccl/lib/libnccl.so.2.21.5": "2.21.5"}
    assert rec.labels["org.shipyard.environment"] == "probe-test"
    assert "org.label-schema.build-date" in rec.labels  # Apptainer's own labels come with the file
    assert rec.apt == {}  # busybox: no dpkg-query
