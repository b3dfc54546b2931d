"""What the two nccl-tests test files share (tests/containers/test_nccl_tests.py compiles, test_nccl_tests_real_pyxis.py
runs under the real pyxis): the environment, the build context (the upstream archive and the pinned wheels), the docker
build of the recipe's nccl-tests step, the image handed between them, and the real enroot import.

Each file runs in its own pytest process of `invoke test` (the pyxis one with the real runtimes), each with its own
dockerd. The compile test's process builds both variants (the second reuses the first's layers up to the nccl-tests
step) and hands the ``mpi: none`` image to the real-runtimes process as a `docker save` archive (tests/handoff.py);
run alone, the pyxis file builds its own."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from shipyard import facts, registry
from shipyard.definitions import layout, recipe
from shipyard.sandbox import runtimes

# the tests' one source folder ($SHIPYARD_RUNTIME_SOURCES, else ../shared/vendor beside the checkout)
VENDOR = runtimes.test_sources(Path(__file__).resolve().parents[2]) / "nccl-tests-2.19.6.tar.gz"
NCCL_TESTS_VALUE = '{version: "2.19.6", url: "file:///src/nccl-tests.tar.gz"}'
NCCL_TESTS_LINE = f"    nccl_tests: {NCCL_TESTS_VALUE}"
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


def wheels(dest: Path, reqs: list[str]) -> None:
    """The pinned wheels from this machine's configured package index (no network for the build itself)."""
    dest.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", str(dest), *reqs], check=True, timeout=600)


IMAGE = "shipyard-test/nccl-tests:compile"
ONE_BINARY = "ENV MAKEFLAGS=BIN_FILES_LIST=all_reduce"  # make's command-line override of the Makefile's list
IMAGE_NO_MPI = "shipyard-test/nccl-tests:mpi-none"
NO_MPI_VALUE = '{version: "2.19.6", url: "file:///src/nccl-tests.tar.gz", mpi: none}'
HANDED_NO_MPI = "nccl-tests-mpi-none.tar"  # tests/handoff.py's name for it




def build_context(tmp_path_factory) -> Path:
    """The build context: the source archive and the pinned wheels."""
    env = registry.load_text(REG).environment("nt")
    pc = facts.load("nccl_tests")["pip_compiler"]["13.0"]["packages"]
    ctx = tmp_path_factory.mktemp("nccl-tests-ctx")
    shutil.copy(VENDOR, ctx / "nccl-tests.tar.gz")
    wheels(ctx / "wheels", [*pc, f"{env.nccl_package}=={env.nccl.value}"])
    return ctx


def build(docker_services, debian12_base, ctx: Path, tag: str, nccl_tests: str, extra: tuple[str, ...] = ()) -> str:
    """A docker build of the recipe's nccl-tests step for ``environments.nt.nccl_tests: NCCL_TESTS``."""
    env = registry.load_text(REG.replace(NCCL_TESTS_LINE, f"    nccl_tests: {nccl_tests}")).environment("nt")
    step, = recipe.nccl_tests_install(env)
    nccl = f"{env.nccl_package}=={env.nccl.value}"
    lines = [f"FROM {debian12_base}", "COPY nccl-tests.tar.gz /src/nccl-tests.tar.gz", "COPY wheels /wheels",
             "ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1",
             'ENV NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"',
             "RUN set -eu; " + "; ".join(recipe.python_install(env).commands),
             f"RUN {layout.VENV}/bin/python -m pip install --no-cache-dir --no-deps {nccl}", *extra,
             "RUN set -eu; " + "; ".join(step.commands),
             "RUN rm -rf /wheels /src",  # not in the SquashFS enroot makes of the layers (a smaller, faster import)
             # the image's own PATH, as the recipe's environment sets it (enroot carries it into the container)
             f"ENV PATH={facts.load('nccl_tests')['prefix']}/bin:/usr/local/bin:/usr/bin:/bin"]
    (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
    api = docker_services[0].client(timeout=1800).api
    t0 = time.monotonic()
    log = io.StringIO()
    steps = []  # (seconds since the build began, docker's "Step N/M : ..." line): where a slow build spends it
    for chunk in api.build(path=str(ctx), tag=tag, rm=True, forcerm=True, network_mode="host", decode=True):
        stream = chunk.get("stream", "")
        if stream.startswith("Step "):
            steps.append((time.monotonic() - t0, stream.strip()[:100]))
        log.write(stream + (chunk.get("error", "") + "\n" if "error" in chunk else ""))
        assert "error" not in chunk, log.getvalue()[-4000:]
    total = time.monotonic() - t0
    ends = [t for t, _ in steps[1:]] + [total]
    print(f"nccl-tests compile stage {tag}: {total:.0f} s")
    print("\n".join(f"  {end - begin:6.1f} s  {line}" for (begin, line), end in zip(steps, ends)))
    return tag


def build_no_mpi(docker_services, debian12_base, ctx: Path) -> str:
    """The recipe's nccl-tests step with ``mpi: none`` (all_reduce_perf only, to keep it cheap): its docker tag."""
    return build(docker_services, debian12_base, ctx, IMAGE_NO_MPI, NO_MPI_VALUE, (ONE_BINARY,))


def save(docker_services, tag: str, dest: Path) -> None:
    """``docker save TAG > DEST``: the image as the archive `docker load` reads."""
    api = docker_services[0].client(timeout=900).api
    t0 = time.monotonic()
    with open(dest, "wb") as fh:
        for chunk in api.get_image(tag):
            fh.write(chunk)
    print(f"docker save {tag}: {time.monotonic() - t0:.0f} s, {dest.stat().st_size >> 20} MiB")


def load(docker_services, archive: Path, tag: str) -> str:
    """``docker load < ARCHIVE`` into this session's dockerd; ``tag``, checked to be there."""
    api = docker_services[0].client(timeout=900).api
    t0 = time.monotonic()
    with open(archive, "rb") as fh:
        for _ in api.load_image(fh):
            pass
    assert api.inspect_image(tag)["Id"]
    print(f"docker load {tag} from {archive.name}: {time.monotonic() - t0:.0f} s")
    return tag


def enroot_import(image: str, dest: Path, work: Path) -> Path:
    """``enroot import dockerd://IMAGE`` with the real enroot (installed by the real_pyxis fixture), its cache, data,
    runtime and temp folders under ``work`` (the sandbox's drop-in names per-node folders that exist only inside the
    nodes' namespaces)."""
    paths = {f"ENROOT_{k.upper()}_PATH": str(work / k) for k in ("cache", "data", "runtime", "temp")}
    for d in paths.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    res = subprocess.run(["enroot", "import", "-o", str(dest), f"dockerd://{image}"], env={**os.environ, **paths},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    dest.chmod(0o644)
    print(f"enroot import {image}: {time.monotonic() - t0:.0f} s, {dest.stat().st_size >> 20} MiB")
    return dest
