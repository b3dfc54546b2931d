"""Start a real Docker engine and a real OCI registry on this machine, privately, and stop them again.

Used by the build/push tests and benchmarks: shipyard's docker backend and push must be proven against the real
components, not mocks. Both daemons live entirely under one state directory, listen only on a unix socket or on
127.0.0.1 at a free port, do not touch the host network (no bridge, no iptables) and are stopped by the PID we
started, never by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from shipyard.errors import ShipyardError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, what: str, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ShipyardError(f"{what} exited with {proc.returncode} while starting; see {log}")
        if check():
            return
        time.sleep(0.1)
    raise ShipyardError(f"{what} did not come up within {timeout:.0f} s; see {log}")


def _spawn(argv: list[str], log: Path, what: str, ready, on_fail) -> subprocess.Popen:
    """Start a daemon in its own process group with output appended to ``log``; return once ``ready()`` holds."""
    with open(log, "ab") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        _wait(ready, what, proc, log)
    except BaseException:
        _stop(proc)
        on_fail()
        raise
    return proc


def _stop(proc: subprocess.Popen | None, timeout: float = 20.0) -> None:
    """SIGTERM the process group we started, then SIGKILL it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@dataclass
class Dockerd:
    """A private dockerd (its own data root, exec root and socket) for tests; ``host`` is a ``unix://`` URL."""

    state: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return f"unix://{self.state}/docker.sock"

    def start(self) -> "Dockerd":
        if not shutil.which("dockerd"):
            raise ShipyardError("dockerd not found: install Debian's docker.io (apt-get install docker.io)")
        self.state.mkdir(parents=True, exist_ok=True)
        log = self.state / "dockerd.log"
        # exec-root must stay short (containerd's socket path inside it is limited to 108 bytes) and be this
        # daemon's alone: two dockerds of one process (the session's and a test's own) must not share it
        exec_root = Path(tempfile.mkdtemp(prefix=f"shipyard-docker-{os.getpid()}-", dir="/run"))
        self._exec_root = exec_root
        argv = ["dockerd", "--data-root", str(self.state / "root"), "--exec-root", str(exec_root),
                "-H", self.host, "--pidfile", str(self.state / "dockerd.pid"),
                "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false"]
        import docker  # lazy: the Docker SDK (~0.2 s) only for the docker backend

        def ready() -> bool:
            try:
                docker.DockerClient(base_url=self.host, timeout=2).ping()
                return True
            except Exception:
                return False

        self.proc = _spawn(argv, log, "dockerd", ready, self.stop)
        return self

    def client(self, timeout: int = 600):
        import docker  # lazy: the Docker SDK (~0.2 s) only for the docker backend

        return docker.DockerClient(base_url=self.host, timeout=timeout)

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None
        unmount_under(self.state / "root")
        exec_root = getattr(self, "_exec_root", None)
        if exec_root is not None:
            unmount_under(exec_root)
            shutil.rmtree(exec_root, ignore_errors=True)


def mounts_under(root: Path) -> list[str]:
    """The mount points at or below ``root`` (this process's mount namespace), deepest first."""
    top = str(root)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")  # mountinfo writes a space in a path as \040
        if point == top or point.startswith(top + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def unmount_under(root: Path) -> None:
    """Unmount what a stopped daemon left mounted at or below ``root``. dockerd leaves two mounts when it exits: its
    default network namespace at ``EXEC_ROOT/netns/default`` and its data root mounted on itself (made private).
    Left there, neither folder can be removed (pytest's cleanup of old test folders warns), and every test
    session added mounts to the machine."""
    for point in mounts_under(root):
        subprocess.run(["umount", point], capture_output=True, timeout=30)


_REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


@dataclass
class OciRegistry:
    """A private ``docker-registry`` (distribution 2.x) on 127.0.0.1; ``address`` is ``127.0.0.1:PORT``."""

    state: Path
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "OciRegistry":
        if not shutil.which("docker-registry"):
            raise ShipyardError("docker-registry not found: install Debian's docker-registry")
        self.state.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        cfg = self.state / "config.yml"
        cfg.write_text(_REGISTRY_CONFIG.format(root=self.state / "data", port=self.port))
        log = self.state / "registry.log"

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1) as r:
                    return r.status == 200
            except Exception:
                return False

        self.proc = _spawn(["docker-registry", "serve", str(cfg)], log, "docker-registry", ready, self.stop)
        return self

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None
