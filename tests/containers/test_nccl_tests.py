"""nccl-tests really compiles here: the recipe's own nccl-tests step (shipyard/definitions/recipe.py, the same
commands the rendered .def and Dockerfile carry) runs in a docker build FROM the debootstrapped Debian 12 base, with
pip's CUDA 13 compiler wheels, against an NCCL wheel in /opt/venv, and the binaries link.

What it takes, to stay cheap: the build stage alone, not a whole image. torch is not installed: the NCCL wheel
torch 2.14.1 pins (nvidia-nccl-cu13 2.30.7, compat.yaml) stands in for torch's closure at the same path, so the
compile sees exactly the NCCL a torch image holds; the %test that compares it with ``torch.cuda.nccl.version()`` needs
torch and is not run here. The source is ../shared/vendor/nccl-tests-2.19.6.tar.gz (``nccl_tests.url`` overridden to
a file:/// path, the sha256 check unchanged); the wheels come from this machine's local package index through the
build context (no index reached from the build); Debian's packages (g++, make, Open MPI) from the base's mirror.
One gencode (sm_90, ``NVCC_GENCODE``) instead of the release's five keeps the compile near 90 s on 2 cores.

Nothing runs on a GPU here: there is none. The compiled all_reduce_perf is run once and must stop because there is
no CUDA driver/device, which is what a rank on a GPU-less node prints.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shipyard import facts, registry
from shipyard.definitions import recipe

pytestmark = [pytest.mark.slow, pytest.mark.docker]

VENDOR = Path(__file__).resolve().parents[3] / "shared" / "vendor" / "nccl-tests-2.19.6.tar.gz"
if not VENDOR.is_file():  # CI sees the folder at ../shared/vendor from the project root
    VENDOR = Path(os.environ.get("SHIPYARD_VENDOR", "/work/shared/vendor")) / "nccl-tests-2.19.6.tar.gz"
REG = """
environments:
  nt:
    torch: "2.14.1"
    cuda: "13.0"
    python: "3.11"
    os: debian12
    torchvision: false
    nccl_tests: {version: "2.19.6", url: "file:///src/nccl-tests.tar.gz"}
clusters:
  c: {runtime: host, fabric: socket, gpus_per_node: 0, scheduler: {partition: p}}
"""


def _wheels(dest: Path, reqs: list[str]) -> None:
    """The pinned wheels from this machine's configured package index (no network for the build itself)."""
    dest.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", str(dest), *reqs], check=True, timeout=600)


def test_nccl_tests_compile_from_the_recipe_step_and_link(docker_env, debian12_base, tmp_path):
    env = registry.load_text(REG).environment("nt")
    step, = recipe.nccl_tests_install(env)
    pc = facts.load("nccl_tests")["pip_compiler"]["13.0"]["packages"]
    nccl = f"{env.nccl_package}=={env.nccl.value}"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(VENDOR, ctx / "nccl-tests.tar.gz")
    _wheels(ctx / "wheels", [*pc, nccl])
    lines = [f"FROM {debian12_base}", "COPY nccl-tests.tar.gz /src/nccl-tests.tar.gz", "COPY wheels /wheels",
             "ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1",
             'ENV NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"',
             "RUN set -eu; " + "; ".join(recipe.python_install(env).commands),
             f"RUN {recipe.VENV}/bin/python -m pip install --no-cache-dir --no-deps {nccl}",
             "RUN set -eu; " + "; ".join(step.commands)]
    (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
    api = docker_env.client(timeout=1800).api
    t0 = time.monotonic()
    log = io.StringIO()
    for chunk in api.build(path=str(ctx), tag="shipyard-test/nccl-tests:compile", rm=True, forcerm=True,
                           network_mode="host", decode=True):
        log.write(chunk.get("stream", "") + (chunk.get("error", "") + "\n" if "error" in chunk else ""))
        assert "error" not in chunk, log.getvalue()[-4000:]
    print(f"nccl-tests compile stage: {time.monotonic() - t0:.0f} s")
    binaries = facts.load("nccl_tests")["releases"]["2.19.6"]["binaries"]
    script = (f"cd /opt/nccl-tests/bin; ls; du -sm .; for b in {' '.join(binaries)}; do ldd $b | grep -q 'not found'"
              " && echo UNRESOLVED $b; done; ldd all_reduce_perf | grep -E 'libnccl|libmpi|libcudart'; "
              "mpirun --allow-run-as-root --oversubscribe -np 1 ./all_reduce_perf -b 8 -e 8 -g 1; echo rc=$?")
    out = docker_env.client().containers.run("shipyard-test/nccl-tests:compile", ["/bin/bash", "-c", script],
                                             network_mode="none", remove=True, stderr=True).decode()
    print(out)
    for b in binaries:
        assert b in out.split(), out
    assert "UNRESOLVED" not in out, out
    # torch's NCCL (the wheel's file, through the run path), Open MPI; the CUDA runtime linked statically
    assert f"{recipe.VENV}/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2" in out, out
    assert "libmpi.so" in out and "libcudart" not in out, out
    # no GPU here: the binary stops at the CUDA driver/device, and says so
    assert "CUDA driver version is insufficient" in out or "no CUDA-capable device" in out, out
    assert "rc=0" not in out, out
