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

import io
import re
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


def _wheels(dest: Path, reqs: list[str]) -> None:
    """The pinned wheels from this machine's configured package index (no network for the build itself)."""
    dest.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", str(dest), *reqs], check=True, timeout=600)


IMAGE = "shipyard-test/nccl-tests:compile"
ONE_BINARY = "ENV MAKEFLAGS=BIN_FILES_LIST=all_reduce"  # make's command-line override of the Makefile's list
IMAGE_NO_MPI = "shipyard-test/nccl-tests:mpi-none"


@pytest.fixture(scope="module")
def build_context(debian12_base, tmp_path_factory) -> Path:
    """The build context both images share: the source archive and the pinned wheels."""
    env = registry.load_text(REG).environment("nt")
    pc = facts.load("nccl_tests")["pip_compiler"]["13.0"]["packages"]
    ctx = tmp_path_factory.mktemp("nccl-tests-ctx")
    shutil.copy(VENDOR, ctx / "nccl-tests.tar.gz")
    _wheels(ctx / "wheels", [*pc, f"{env.nccl_package}=={env.nccl.value}"])
    return ctx


def _build(docker_services, debian12_base, ctx: Path, tag: str, nccl_tests: str, extra: tuple[str, ...] = ()) -> str:
    """A docker build of the recipe's nccl-tests step for ``environments.nt.nccl_tests: NCCL_TESTS``. (The two tests
    run in different sessions of `invoke test`, each with its own dockerd, so each builds its own layers.)"""
    env = registry.load_text(REG.replace(NCCL_TESTS_LINE, f"    nccl_tests: {nccl_tests}")).environment("nt")
    step, = recipe.nccl_tests_install(env)
    nccl = f"{env.nccl_package}=={env.nccl.value}"
    lines = [f"FROM {debian12_base}", "COPY nccl-tests.tar.gz /src/nccl-tests.tar.gz", "COPY wheels /wheels",
             "ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1",
             'ENV NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"',
             "RUN set -eu; " + "; ".join(recipe.python_install(env).commands),
             f"RUN {recipe.VENV}/bin/python -m pip install --no-cache-dir --no-deps {nccl}", *extra,
             "RUN set -eu; " + "; ".join(step.commands),
             "RUN rm -rf /wheels /src",  # not in the SquashFS enroot makes of the layers (a smaller, faster import)
             # the image's own PATH, as the recipe's environment sets it (enroot carries it into the container)
             f"ENV PATH={facts.load('nccl_tests')['prefix']}/bin:/usr/local/bin:/usr/bin:/bin"]
    (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
    api = docker_services[0].client(timeout=1800).api
    t0 = time.monotonic()
    log = io.StringIO()
    for chunk in api.build(path=str(ctx), tag=tag, rm=True, forcerm=True, network_mode="host", decode=True):
        log.write(chunk.get("stream", "") + (chunk.get("error", "") + "\n" if "error" in chunk else ""))
        assert "error" not in chunk, log.getvalue()[-4000:]
    print(f"nccl-tests compile stage {tag}: {time.monotonic() - t0:.0f} s")
    return tag


@pytest.fixture(scope="module")
def nccl_tests_image(docker_services, debian12_base, build_context) -> str:
    """The compile stage as a shipyard image builds it by default (Open MPI), built once for this module: the
    recipe's step as written, with make told (``MAKEFLAGS``, make's own channel) to build all_reduce_perf only. Every
    binary compiles and links by the same rule; compiling all 11 cost CI about a minute of both cores, and which
    binaries a release makes is checked against its Makefile (tests/definitions/test_nccl_tests_release.py)."""
    return _build(docker_services, debian12_base, build_context, IMAGE, NCCL_TESTS_VALUE, (ONE_BINARY,))


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
    assert f"{recipe.VENV}/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2" in out, out
    assert "libmpi.so" in out and "libcudart" not in out, out
    # no GPU here: the binary stops at the CUDA driver/device, and says so
    assert "CUDA driver version is insufficient" in out or "no CUDA-capable device" in out, out
    assert "rc=0" not in out, out


def _enroot_import(image: str, dest: Path, work: Path) -> Path:
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


@pytest.mark.slurm
@pytest.mark.real_runtimes
def test_two_node_nccl_test_in_real_pyxis_reaches_no_cuda_device_on_every_rank(
        docker_env, docker_services, debian12_base, build_context, sandbox, real_pyxis, tmp_path, monkeypatch):
    """Point 4 end to end, with the real enroot and pyxis on the 2-node sandbox.

    The image above (Open MPI, Debian 12's 4.1.4) cannot start under ``srun --mpi=pmi2``: Debian builds Open MPI
    with external PMIx only (no s1/s2 component for Slurm's PMI-1/PMI-2), so every rank stopped in MPI_Init when this
    test tried it (docs/nccl-tests.md). Hence the sandbox runs nccl-tests' own multi-process mode (``mpi: none``:
    one task per node, -g GPUs): the same
    recipe step with ``nccl_tests.mpi: none`` (all_reduce_perf only, to keep it cheap), imported by ``enroot import
    dockerd://``, launched by `invoke nccl-test --runtime pyxis --image X.sqsh --image-has-nccl-tests --submit`;
    every task starts all_reduce_perf in the container and stops at the missing CUDA device, and nccl-report says
    so. The image is Debian with its PATH in an ENV line only: enroot's login shell resets it (/etc/profile), and
    the launcher puts it back from /etc/environment (Pyxis.image_path_prelude)."""
    import yaml
    from fixtures_launch import run_launch, wait_job

    from shipyard.commands import jobs as jobs_commands
    from shipyard.commands.context import Context
    from shipyard.errors import ShipyardError
    from shipyard.launch.options import NCCL_TEST

    tmp_path.chmod(0o755)
    work = tmp_path / "enroot"

    image = _build(docker_services, debian12_base, build_context, IMAGE_NO_MPI,
                   '{version: "2.19.6", url: "file:///src/nccl-tests.tar.gz", mpi: none}',
                   (ONE_BINARY,))
    sqsh = _enroot_import(image, tmp_path / "nccl-tests.sqsh", work)

    project = tmp_path / "project"
    project.mkdir()
    sandbox_cluster = yaml.safe_load((Path(__file__).resolve().parents[2] / "registry.yaml").read_text())
    reg = yaml.safe_load(REG)
    reg["clusters"] = {"sandbox": {**sandbox_cluster["clusters"]["sandbox"], "mpi": "none"}}
    reg["defaults"] = {"environment": "nt", "cluster": "sandbox"}
    (project / "registry.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    monkeypatch.chdir(project)
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    t1 = time.monotonic()
    out = run_launch(kind=NCCL_TEST, submit=True, cluster="sandbox", runtime="pyxis", image=str(sqsh),
                     image_has_nccl_tests=True, nodes=2, sizes="8:8", iters=1)
    job = re.search(r"submitted job (\d+)", out).group(1)
    info = wait_job(sandbox, job, timeout=300)
    log = project / "launch" / "logs" / f"nccl-test-sandbox-{job}.out"
    text = log.read_text(errors="replace")
    print(f"job {job}: {time.monotonic() - t1:.0f} s, {info['JobState']} {info['ExitCode']}\n{text[-6000:]}")
    script = (project / "launch" / "nccl-test-sandbox.sbatch").read_text()
    assert "srun --mpi=none " in script and f"--container-image={sqsh}" in script, script

    ctx = Context.load(str(project / "registry.yaml"), out=io.StringIO())
    try:
        jobs_commands.nccl_report(str(log), str(tmp_path / "report.png"), "sandbox", ctx)
    except ShipyardError:
        pass  # no result rows: exit 2, after printing what can be said
    report = ctx.out.getvalue()
    print(report)
    assert "FAIL no CUDA device: 2 rank(s)" in report, report
    assert "NCCL_DEBUG" not in report, report
