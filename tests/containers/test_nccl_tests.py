"""nccl-tests really compiles here: the recipe's own nccl-tests step (shipyard/definitions/recipe.py, the same
commands the rendered .def and Dockerfile carry) runs in a docker build FROM the debootstrapped Debian 12 base, with
pip's CUDA 13 compiler wheels, against an NCCL wheel in /opt/venv, and the binaries link.

What it takes, to stay cheap: the build stage alone, not a whole image. torch is not installed: the NCCL wheel
torch 2.14.1 pins (nvidia-nccl-cu13 2.30.7, compat.yaml) stands in for torch's closure at the same path, so the
compile sees exactly the NCCL a torch image holds; the %test that compares it with ``torch.cuda.nccl.version()`` needs
torch and is not run here. The source is ../shared/vendor/nccl-tests-2.19.6.tar.gz (``nccl_tests.url`` overridden to
a file:/// path, the sha256 check unchanged); the wheels come from this machine's local package index through the
build context (no index reached from the build); Debian's packages (g++, make, Open MPI) from the base's mirror.
One gencode (sm_90, ``NVCC_GENCODE``) instead of the release's five, and one binary (all_reduce_perf, through make's
``MAKEFLAGS``) instead of eleven, keep the compile near 30 s on 2 cores.

Nothing runs on a GPU here: there is none. The compiled all_reduce_perf is run once and must stop because there is
no CUDA driver/device, which is what a rank on a GPU-less node prints.
"""

from __future__ import annotations

import handoff
import pytest
from helpers_nccl_tests import (HANDED_NO_MPI, IMAGE, NCCL_TESTS_VALUE, ONE_BINARY, build, build_context,
                                build_no_mpi, save)

from shipyard.definitions import layout, recipe

pytestmark = [pytest.mark.slow, pytest.mark.docker]


@pytest.fixture(scope="module")
def nccl_tests_context(debian12_base, tmp_path_factory):
    return build_context(tmp_path_factory)


@pytest.fixture(scope="module")
def nccl_tests_image(docker_services, debian12_base, nccl_tests_context) -> str:
    """The compile stage as a shipyard image builds it by default (Open MPI), built once for this module: the
    recipe's step as written, with make told (``MAKEFLAGS``, make's own channel) to build all_reduce_perf only. Every
    binary compiles and links by the same rule; compiling all 11 cost CI about a minute of both cores, and which
    binaries a release makes is checked against its Makefile (tests/definitions/test_nccl_tests_release.py).

    When the real-runtimes run of the same `invoke test` wants the ``mpi: none`` variant, it is built here first
    and handed over (tests/handoff.py): this dockerd then builds the compile image from the same cached layers up to
    the nccl-tests step."""
    handoff.give(HANDED_NO_MPI, lambda path: save(docker_services, build_no_mpi(docker_services, debian12_base,
                                                                                nccl_tests_context), path))
    return build(docker_services, debian12_base, nccl_tests_context, IMAGE, NCCL_TESTS_VALUE, (ONE_BINARY,))


def test_nccl_tests_compile_from_the_recipe_step_and_link(docker_env, nccl_tests_image):
    script = ("cd /opt/nccl-tests/bin; ls; ldd all_reduce_perf | grep -q 'not found' && echo UNRESOLVED; "
              "ldd all_reduce_perf | grep -E 'libnccl|libmpi|libcudart'; "
              "mpirun --allow-run-as-root --oversubscribe -np 1 ./all_reduce_perf -b 8 -e 8 -g 1; echo rc=$?")
    out = docker_env.client().containers.run(nccl_tests_image, ["/bin/bash", "-c", script],
                                             network_mode="none", remove=True, stderr=True).decode()
    print(out)
    assert "all_reduce_perf" in out.split(), out
    assert "UNRESOLVED" not in out, out
    # torch's NCCL (the wheel's file, through the run path), Open MPI; the CUDA runtime linked statically
    assert f"{layout.VENV}/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2" in out, out
    assert "libmpi.so" in out and "libcudart" not in out, out
    # no GPU here: the binary stops at the CUDA driver/device, and says so
    assert "CUDA driver version is insufficient" in out or "no CUDA-capable device" in out, out
    assert "rc=0" not in out, out
