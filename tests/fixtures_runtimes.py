"""Real enroot + pyxis in the sandbox (``invoke sandbox.runtimes``), built from the upstream source archives in
``../shared/vendor`` (or ``$SHIPYARD_RUNTIME_SOURCES``), and a tiny real SquashFS image (static busybox).

Sources missing: with CI=true the tests that need them FAIL (CI must never certify what it did not run); locally
they skip, and `invoke test` names them in one line with how to provide the sources."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def runtime_sources() -> Path:
    from shipyard.sandbox import runtimes

    return runtimes.test_sources(ROOT)


def missing_sources_line() -> str | None:
    """One line (which tests, how to provide the sources), or None when the sources are there."""
    from shipyard.sandbox import runtimes

    return runtimes.tests_left_out_line(ROOT)


@pytest.fixture(scope="module")
def real_pyxis(sandbox):
    """Real enroot + pyxis installed in the session's sandbox, the real pyxis in its plugstack.conf for this module;
    the plugstack as it was (e.g. the pyxis double) is restored afterwards. ``sandbox.down`` uninstalls enroot."""
    from ci_skips import in_ci

    from shipyard import sandbox as sb

    line = missing_sources_line()
    if line:
        (pytest.fail if in_ci() else pytest.skip)(line)
    before = sb.plugstack(sandbox.directory)
    info = sb.install_runtimes(runtime_sources(), sandbox.directory)
    try:
        yield info
    finally:
        sb.restore_plugstack(before, sandbox.directory)


def _copy_with_libraries(binary: Path, rootfs: Path) -> None:
    """``binary`` and every shared library ``ldd`` says it loads (and the loader), at the same paths under rootfs."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    paths = [binary, *(Path(w) for w in out.split() if w.startswith("/"))]
    for src in paths:
        dst = rootfs / src.resolve().relative_to("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src.resolve(), dst)
        if src.resolve() != src:  # e.g. /lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/...
            link = rootfs / src.relative_to("/")
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(src.resolve())


@pytest.fixture(scope="session")
def busybox_sqsh(tmp_path_factory) -> Path:
    """A real SquashFS image: Debian's static busybox as /bin/*, made with mksquashfs (a few hundred ms)."""
    return _busybox_image(tmp_path_factory.mktemp("busybox-image"))


# What Debian's /etc/profile does that matters here: PATH reset to the OS's, then /etc/profile.d/*.sh sourced.
DEBIAN_PROFILE = """if [ "$(id -u)" -eq 0 ]; then PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
else PATH="/usr/local/bin:/usr/bin:/bin"; fi
export PATH
for i in /etc/profile.d/*.sh; do if [ -r "$i" ]; then . "$i"; fi; done
"""


@pytest.fixture(scope="session")
def debian_profile_sqsh(tmp_path_factory) -> Path:
    """The busybox image with Debian's PATH reset in /etc/profile, which enroot's login shell reads."""
    return _busybox_image(tmp_path_factory.mktemp("debian-profile-image"), profile=DEBIAN_PROFILE)


@pytest.fixture(scope="session")
def debian_profile_recipe_sqsh(tmp_path_factory) -> Path:
    """As :func:`debian_profile_sqsh`, plus what shipyard's recipe writes for login shells, made by the recipe's own
    command run in the root filesystem (chroot)."""
    from shipyard.definitions import recipe

    step = recipe.login_path([recipe.EnvVar("PATH", "/opt/image/bin:$PATH", expand=True)])
    return _busybox_image(tmp_path_factory.mktemp("debian-profile-recipe-image"), profile=DEBIAN_PROFILE,
                          run_in_root=step.commands)


def _busybox_image(d: Path, profile: str | None = None, run_in_root: tuple[str, ...] = ()) -> Path:
    return squashfs(_busybox_rootfs(d, profile, run_in_root), d / "busybox.sqsh")


def squashfs(rootfs: Path, out: Path) -> Path:
    """``rootfs`` as a real SquashFS image at ``out`` (mksquashfs, every file root's), readable by all."""
    subprocess.run(["mksquashfs", str(rootfs), str(out), "-noappend", "-quiet", "-all-root"], check=True,
                   stdout=subprocess.DEVNULL)
    out.chmod(0o644)
    return out


def _busybox_rootfs(d: Path, profile: str | None = None, run_in_root: tuple[str, ...] = ()) -> Path:
    busybox = shutil.which("busybox")
    assert busybox, "busybox-static is in shipyard/data/test-packages.txt"
    d.chmod(0o755)
    rootfs = d / "rootfs"
    for sub in ("bin", "etc", "tmp", "proc", "sys", "dev", "root", "usr", "work"):
        (rootfs / sub).mkdir(parents=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for tool in ("sh", "hostname", "cat", "env", "ls", "pwd", "test", "echo", "printf"):
        (rootfs / "bin" / tool).symlink_to("busybox")
    # the host's bash with the libraries it loads: `invoke shell` runs `bash -c` in the container
    _copy_with_libraries(Path("/bin/bash"), rootfs)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    # a command only the image's own PATH finds (as torchrun in /opt/venv/bin)
    (rootfs / "opt" / "image" / "bin").mkdir(parents=True)
    (rootfs / "opt" / "image" / "bin" / "image-tool").write_text("#!/bin/sh\necho image-tool ran\n")
    (rootfs / "opt" / "image" / "bin" / "image-tool").chmod(0o755)
    # the image's own environment (enroot reads /etc/environment, which `enroot import` writes from the image's
    # ENV): a library path the image relies on and its PATH
    (rootfs / "etc" / "environment").write_text("LD_LIBRARY_PATH=/opt/image/lib\nIMAGE_ONLY=from-image\n"
                                                "PATH=/opt/image/bin:/bin\n")
    if profile is not None:
        (rootfs / "etc" / "profile").write_text(profile)
        (rootfs / "etc" / "profile.d").mkdir()
        for tool in ("id", "sed", "tail"):
            (rootfs / "bin" / tool).symlink_to("busybox")
    for command in run_in_root:
        subprocess.run(["chroot", str(rootfs), "/bin/sh", "-c", command], check=True)
    return rootfs


# A torchrun stand-in for launcher tests in a real container: what this node's torchrun received, one file per fact
# under <workdir>/probe-out/<job>-<node>/ (argv and environment NUL-separated, so no word can garble another).
TORCHRUN_STAND_IN = r"""#!/bin/bash
opts=()
while [[ $1 == --* ]]; do opts+=("$1"); shift; done
d="$PWD/probe-out/$SLURM_JOB_ID-$SLURM_NODEID"
mkdir -p "$d"
printf '%s\0' "${opts[@]}" > "$d/options"
printf '%s\0' "$@" > "$d/argv"
for k in $(compgen -e); do printf '%s=%s\0' "$k" "${!k}"; done > "$d/env"
pwd > "$d/cwd"
hostname > "$d/host"
id -u > "$d/uid"
cat /proc/self/mountinfo > "$d/mounts"
cat /data/in.txt > "$d/data" 2>&1
echo "torchrun stand-in on $(hostname) done"
"""

# The image's own environment, as a definition's %environment sets it (Apptainer keeps it in
# /.singularity.d/env/90-environment.sh): the same facts as the SquashFS image's /etc/environment, and FOO, which a
# launcher's override must win over.
SIF_ENVIRONMENT = """    export LD_LIBRARY_PATH=/opt/image/lib
    export IMAGE_ONLY=from-image FOO=from-image
    export PATH=/opt/image/bin:/bin
"""


def build_sif(apptainer_bin: Path, rootfs: Path, out: Path, environment: str = SIF_ENVIRONMENT) -> Path:
    """``apptainer build OUT`` from ``rootfs`` (a directory) through a definition with ``environment`` as its
    %environment: a real SIF, a fraction of a second for the busybox root filesystem."""
    import os

    deffile = out.with_suffix(".def")
    deffile.write_text(f"Bootstrap: localimage\nFrom: {rootfs}\n\n%environment\n{environment}")
    env = {**os.environ, "PATH": f"{apptainer_bin}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run(["apptainer", "build", "--force", str(out), str(deffile)], capture_output=True, text=True,
                         env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    out.chmod(0o644)
    return out


@pytest.fixture(scope="session")
def busybox_sif_rootfs(tmp_path_factory) -> Path:
    """The busybox root filesystem with a few more busybox tools and the torchrun stand-in at /opt/image/bin."""
    d = tmp_path_factory.mktemp("busybox-sif")
    rootfs = _busybox_rootfs(d)
    for tool in ("mkdir", "id", "grep", "sleep"):
        (rootfs / "bin" / tool).symlink_to("busybox")
    (rootfs / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    stand_in = rootfs / "opt" / "image" / "bin" / "torchrun"
    stand_in.write_text(TORCHRUN_STAND_IN)
    stand_in.chmod(0o755)
    return rootfs


@pytest.fixture(scope="session")
def busybox_sif(real_apptainer, busybox_sif_rootfs, tmp_path_factory) -> Path:
    """A real SIF built by the real Apptainer: static busybox, the host's bash, the torchrun stand-in and the image
    environment of :data:`SIF_ENVIRONMENT`."""
    d = tmp_path_factory.mktemp("busybox-sif-image")
    d.chmod(0o755)
    return build_sif(real_apptainer, busybox_sif_rootfs, d / "busybox.sif")


CONTAINER_IMAGE_PATH = "/opt/image/bin:/bin:/usr/bin"  # a real image's PATH has /usr/bin, where runtimes inject


@pytest.fixture(scope="session")
def busybox_container_rootfs(busybox_sif_rootfs, tmp_path_factory) -> Path:
    """The torchrun stand-in's root filesystem for every runtime: /usr/bin on the image's PATH (/etc/environment for
    enroot, /ch/environment for ch-run; a SIF built from it takes its PATH from build_sif's ``environment``) and
    the mount points and files ch-run needs in a read-only image."""
    d = tmp_path_factory.mktemp("busybox-container")
    d.chmod(0o755)
    root = d / "rootfs"
    shutil.copytree(busybox_sif_rootfs, root, symlinks=True)
    for sub in ("home", "var", "run", "ch", "usr/bin"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for f in ("hosts", "resolv.conf"):  # ch-run binds the node's over them (name resolution): they must exist
        (root / "etc" / f).touch()
    (root / "etc" / "environment").write_text(f"LD_LIBRARY_PATH=/opt/image/lib\nPATH={CONTAINER_IMAGE_PATH}\n")
    (root / "ch" / "environment").write_text(f"PATH={CONTAINER_IMAGE_PATH}\n")
    return root


class NamespaceForwarder:
    """A TCP forwarder from ``LISTEN_IP:PORT`` inside the sandbox controller's network namespace to a service on the
    host's 127.0.0.1 (the registry the tests start there). The nodes reach the controller's address over the sandbox
    bridge; their own 127.0.0.1 is their own. Only the listening socket is made inside that namespace (``setns`` on
    one thread, then back); every upstream connection is made in the host's namespace. Nothing is configured in the
    host's namespace."""

    def __init__(self, net_ns: str, listen_ip: str, upstream: tuple[str, int]):
        import ctypes
        import os
        import socket
        import threading

        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(net_ns, os.O_RDONLY)
        made: dict = {}

        def make() -> None:  # on its own thread: setns(CLONE_NEWNET) moves only the calling thread
            try:
                if libc.setns(target, 0x40000000) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the sandbox's network namespace")
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((listen_ip, 0))
                s.listen(16)
                made["sock"] = s
            except BaseException as exc:  # noqa: BLE001 (raised on the caller's thread)
                made["error"] = exc
            finally:
                libc.setns(own, 0x40000000)

        t = threading.Thread(target=make)
        t.start()
        t.join()
        os.close(own)
        os.close(target)
        if "error" in made:
            raise made["error"]
        self.sock = made["sock"]
        self.address = f"{listen_ip}:{self.sock.getsockname()[1]}"
        self.upstream = upstream
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                up = socket.create_connection(self.upstream, timeout=10)
                up.settimeout(None)
            except OSError:
                client.close()
                continue
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        import socket

        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="session")
def node_registry(sandbox, docker_services):
    """The session's OCI registry as the sandbox's nodes reach it: ``CONTROLLER_IP:PORT`` (a forwarder inside the
    controller's network namespace to the registry on the host's 127.0.0.1)."""
    from shipyard import slurm
    from shipyard.slurm import read_sandbox_state

    _, reg = docker_services
    pid = slurm.controller_pid(read_sandbox_state(sandbox.directory))
    host, port = reg.address.rsplit(":", 1)
    fwd = NamespaceForwarder(f"/proc/{pid}/ns/net", sandbox.info["controller"]["ip"], (host, int(port)))
    yield fwd
    fwd.close()


@pytest.fixture(scope="session")
def real_apptainer():
    """The bin folder of the real Apptainer 1.4.5, installed from ../shared/vendor (shipyard/sandbox/apptainer.py)
    and held by this test process: machine-wide at the prefix compiled into it, shared with the other test processes
    and sandboxes that hold it, removed when the last lets go. Tests put it on PATH themselves
    (``apptainer_on_path``)."""
    from ci_skips import in_ci

    from shipyard import sandbox as sb
    from shipyard.sandbox import apptainer

    line = missing_sources_line()
    if line or apptainer.missing_packages():
        (pytest.fail if in_ci() else pytest.skip)(line or f"missing packages: {apptainer.missing_packages()}")
    running = lambda d: sb.sandbox_running(sb.read_sandbox_state(d))  # noqa: E731
    holder = apptainer.process_holder()
    apptainer.install(apptainer.archive_path(runtime_sources()), holder, sandbox_running=running)
    try:
        with pytest.MonkeyPatch.context() as mp:
            # SIFs built in the tests hold uncompressed SquashFS (Apptainer's own APPTAINER_MKSQUASHFS_ARGS, read by
            # every `apptainer build`): gzip of a torch venv was most of a real image's build on 2 cores, and what
            # the tests check (sections, signatures, mounts, the kernel's and squashfuse's reading) does not depend
            # on the compression
            mp.setenv("APPTAINER_MKSQUASHFS_ARGS", "-noI -noD -noF -noX")
            yield apptainer.bin_dir()
    finally:
        apptainer.release(holder, sandbox_running=running)


@pytest.fixture
def apptainer_on_path(real_apptainer, monkeypatch) -> Path:
    """The real Apptainer first on PATH for one test (and every process it starts, Slurm jobs included)."""
    import os

    monkeypatch.setenv("PATH", f"{real_apptainer}{os.pathsep}{os.environ['PATH']}")
    return real_apptainer
