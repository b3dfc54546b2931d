"""``nccl_tests:`` of an environment: resolved against shipyard/data/nccl_tests.yaml, refused in one line where the
image has no compiler or no NCCL wheel to build against, and shown by `invoke show` with its cost in image size."""

from __future__ import annotations

import pytest

from shipyard import facts, registry
from shipyard.errors import ShipyardError
from shipyard.registry import report

BASE = """
environments:
  e:
{body}
clusters:
  c: {{runtime: host, fabric: socket, gpus_per_node: 0, scheduler: {{partition: p}}}}
"""
CU13 = '    torch: "2.14.1"\n    cuda: "13.0"\n    python: "3.11"\n    os: debian12\n'
CU12 = '    torch: "2.5.1"\n    cuda: "12.4"\n    python: "3.11"\n    os: ubuntu22.04\n'


def _env(body: str):
    return registry.load_text(BASE.format(body=body)).environment("e")


def test_true_is_the_default_release_with_its_sha256_and_pip_compiler_on_cuda13():
    nt = _env(CU13 + "    nccl_tests: true\n").nccl_tests
    rel = facts.load("nccl_tests")["releases"][facts.load("nccl_tests")["default"]]
    assert (nt.version, nt.sha256, nt.commit, nt.url) == ("2.19.6", rel["sha256"], rel["commit"], rel["url"])
    assert (nt.compiler, nt.mpi) == ("pip", "openmpi")


def test_devel_base_compiles_with_its_own_cuda_and_mpi_none_is_kept():
    nt = _env(CU12 + "    cuda_image: {flavor: devel}\n    nccl_tests: {mpi: none}\n").nccl_tests
    assert (nt.compiler, nt.mpi) == ("cuda-image", "none")


def test_off_by_default_and_part_of_the_spec_only_when_set():
    plain, on = _env(CU13), _env(CU13 + "    nccl_tests: true\n")
    assert plain.nccl_tests is None and "nccl_tests" not in plain.spec()
    assert plain.spec_hash != on.spec_hash


@pytest.mark.parametrize("body,message", [
    (CU12 + "    nccl_tests: true\n", r"^registry.yaml:\d+: environments\.e\.nccl_tests: no CUDA 12\.4 compiler in "
                                     r"this image: set cuda_image: \{flavor: devel\}"),
    (CU13 + '    nccl_tests: "2.0.0"\n', r"nccl-tests 2\.0\.0 has no pinned release .* \(known: 2\.19\.6\)"),
    (CU13 + "    nccl_tests: {mpi: mpich}\n", r"environments\.e\.nccl_tests"),
    (CU13 + "    nccl_tests: {url: 'http://example.org/x.tgz'}\n", r"environments\.e\.nccl_tests"),
])
def test_refused_in_one_line(body, message):
    with pytest.raises(ShipyardError, match=message) as e:
        _env(body)
    assert "\n" not in str(e.value)


def test_show_says_what_it_costs_in_image_size():
    text = report.show(_env(CU13 + "    nccl_tests: true\n"))
    size = facts.load("nccl_tests")["size_mb"]
    assert ("nccl-tests 2.19.6 (commit a0b82b2260cf, sha256 85c65a240432) in /opt/nccl-tests/bin, against torch's "
            "NCCL 2.30.7, MPI: openmpi") in text
    assert f"image size: about +{size['binaries'] + size['mpi']['openmpi']} MB" in text
