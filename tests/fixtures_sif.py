"""Real SIF files made by the real Apptainer, for tests that need an image and its build manifest rather than a
build: staging, the launcher's binding to a staged image, doctor's image findings, the bench's no-op runs.

`invoke build` of a shipped definition pulls its base from a registry; the build itself is tested in
tests/containers. Here the image comes from `apptainer build` of a local source (a SquashFS image, a definition
whose base is a local SIF), a second or two, and :func:`record_build` records it in ``containers/ENV.json`` as
`invoke build` does: the input hash of the environment's rendered definition and the real Apptainer's version, the
artifact's sha256 and identity stamp, status ``ok``."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

TIMEOUT_S = 120

# The host-userland image's PATH: the test's own Python environment first (its torchrun), then the system's.
HOST_USERLAND_DEF = """\
Bootstrap: localimage
From: {base}

%environment
    export PATH={venv_bin}:/usr/local/bin:/usr/bin:/bin
"""


def build_sif(bindir: Path, target: Path, source: Path, work: Path, *options: str) -> Path:
    """``apptainer build [OPTIONS] TARGET SOURCE`` with the real Apptainer in ``bindir``, its temporary and cache
    folders in ``work``; fails the test with Apptainer's message. The SIF and its folder are left readable by every
    user (setuid mode: an unprivileged job reads the image itself)."""
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    for var in ("APPTAINER_TMPDIR", "APPTAINER_CACHEDIR"):
        (work / var.lower()).mkdir(parents=True, exist_ok=True)
        env[var] = str(work / var.lower())
    proc = subprocess.run(["apptainer", "build", *options, str(target), str(source)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"apptainer build {target} {source}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    target.chmod(0o644)
    target.parent.chmod(0o755)
    return target


@pytest.fixture(scope="session")
def staging_sif(real_apptainer, busybox_sqsh, tmp_path_factory) -> Path:
    """The busybox image of tests/fixtures_runtimes.py (static busybox, the host's bash with its libraries,
    ``/opt/image/bin/image-tool``) as a SIF: ``apptainer build x.sif busybox.sqsh`` (about 2 s)."""
    d = tmp_path_factory.mktemp("busybox-sif")
    return build_sif(real_apptainer, d / "busybox.sif", busybox_sqsh, d)


@pytest.fixture(scope="session")
def host_userland_sif(real_apptainer, staging_sif, tmp_path_factory) -> Path:
    """A SIF for jobs that run Python and torchrun: the busybox SIF as a definition's local base
    (``Bootstrap: localimage``), its ``%environment`` PATH naming this test run's Python environment first. This
    machine's torch is the host's, so a launch binds the host's ``/usr`` and the environment's top folder into it
    (:func:`host_userland_mounts`), as the Charliecloud launch test does with its directory image."""
    import sys

    d = tmp_path_factory.mktemp("host-userland-sif")
    definition = d / "host-userland.def"
    definition.write_text(HOST_USERLAND_DEF.format(base=staging_sif, venv_bin=Path(sys.executable).parent))
    return build_sif(real_apptainer, d / "host-userland.sif", definition, d)


def host_userland_mounts() -> list[str]:
    """The host folders a job of :func:`host_userland_sif` binds: ``/usr``, the top folder that holds this run's
    Python environment (``/root`` for ``/root/venv``, ``/tmp`` for CI's) and the one that holds the Python it was
    made from (the environment's ``python`` is a link there, e.g. into ``/root/.pyenv``)."""
    import sys

    tops = [Path(p) for p in (Path(sys.executable).parent.parent, Path(sys.executable).resolve(), sys.base_prefix)]
    return list(dict.fromkeys(["/usr", *(str(Path(p.parts[0], p.parts[1])) for p in tops)]))


def record_build(reg, env_name: str, sif: Path) -> None:
    """``sif`` copied to ``containers/ENV.sif`` and recorded in ``containers/ENV.json`` as a finished build of the
    environment: the definition rendered to ``definitions/ENV.def`` and the input hash over it and the real
    Apptainer's version (the first on PATH), as `invoke build` computes them."""
    from shipyard import project
    from shipyard.containers import engine
    from shipyard.containers import manifest as mf
    from shipyard.containers.apptainer import ApptainerBackend
    from shipyard.containers.common import copied_files, file_record, tool_ids
    from shipyard.files import atomic_write, now_iso

    env = reg.environment(env_name)
    root = Path(reg.root)
    backend = ApptainerBackend()
    inputs = backend.inputs(reg, env)
    for path, text in inputs.items():
        atomic_write(path, text)
    tools = backend.tools(("sif",))
    files = copied_files(root, [s for s in backend.sources(inputs) if root / s not in inputs])
    key = engine.input_hash(env.spec(), {str(p.relative_to(root)): t for p, t in inputs.items()}, "apptainer",
                            tools, ("sif",), files)
    target = project.artifact_path(reg, env.name, "sif")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(sif, target)
    mf.update_manifest(project.manifest_path(reg, env.name), environment=env.name, status="ok", error=None,
                       input_hash=key, spec_hash=env.spec_hash, backend="apptainer", tools=tools,
                       tool_ids={t: tool_ids[t] for t in tools if t in tool_ids}, formats=["sif"],
                       pins={k: p.value for k, p in env.pins().items()}, host=socket.gethostname(), pid=None,
                       started=now_iso(), finished=now_iso(), artifacts={"sif": file_record(root, target)})


def sized_sif(bindir: Path, target: Path, size: int, work: Path) -> Path:
    """A real SIF of about ``size`` bytes: Debian's static busybox and ``size`` random bytes in ``/data/blob``,
    stored uncompressed (``mksquashfs -noD``), so the file is as large as asked (a benchmark's large image)."""
    rootfs = work / "sized-rootfs"
    for sub in ("bin", "data", "tmp"):
        (rootfs / sub).mkdir(parents=True)
    shutil.copy2(shutil.which("busybox"), rootfs / "bin" / "busybox")
    (rootfs / "bin" / "sh").symlink_to("busybox")
    with open(rootfs / "data" / "blob", "wb") as fh:
        for left in range(size, 0, -(1 << 20)):
            fh.write(os.urandom(min(left, 1 << 20)))
    try:
        return build_sif(bindir, target, rootfs, work, "--mksquashfs-args", "-noD")
    finally:
        shutil.rmtree(rootfs)


@contextlib.contextmanager
def held_apptainer() -> Iterator[Path]:
    """The real Apptainer installed from ../shared/vendor and held by this process for the block, as the
    ``real_apptainer`` fixture holds it for a test session (a bench script outside pytest); its bin folder."""
    from shipyard import sandbox as sb
    from shipyard.sandbox import apptainer, runtimes

    root = Path(__file__).resolve().parents[1]
    line = runtimes.tests_left_out_line(root)
    if line or apptainer.missing_packages():
        raise SystemExit(line or f"missing packages: {apptainer.missing_packages()}")
    running = lambda d: sb.sandbox_running(sb.read_sandbox_state(d))  # noqa: E731
    holder = apptainer.process_holder()
    apptainer.install(apptainer.archive_path(runtimes.test_sources(root)), holder, sandbox_running=running)
    try:
        yield apptainer.bin_dir()
    finally:
        apptainer.release(holder, sandbox_running=running)
