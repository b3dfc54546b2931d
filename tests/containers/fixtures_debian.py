"""A real Debian 12 base image for the end-to-end build (tests/containers/test_real_image.py), made here from Debian's own
packages with debootstrap and imported into the tests' private dockerd. Nothing is pulled from an image registry.

The root filesystem tarball is cached between test sessions (CI reruns would otherwise redo a 30 s debootstrap):
``$SHIPYARD_TEST_CACHE`` or ``~/.cache/shipyard-tests``, under a name keyed by every input of the debootstrap
(suite, variant, mirror, architecture, debootstrap's version). A missing or partial tarball is made again from
nothing (written to a temp name, then renamed). The image is tagged with the name ``os: debian12`` derives
(shipyard/data/compat.yaml), so a definition's ``FROM`` finds it in the daemon without a pull.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from shipyard.registry import compat

SUITE = "bookworm"
VARIANT = "minbase"


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (``$SHIPYARD_DEBIAN_MIRROR`` overrides): the first ``URIs:`` /
    ``deb URL`` line for the main archive that is not a snapshot or security archive."""
    if os.environ.get("SHIPYARD_DEBIAN_MIRROR"):
        return os.environ["SHIPYARD_DEBIAN_MIRROR"]
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for url in re.findall(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.M):
            if "snapshot" not in url and "security" not in url and url.startswith("http"):
                return url
    pytest.fail("no Debian mirror in /etc/apt/sources.list*: set SHIPYARD_DEBIAN_MIRROR")


def cache_dir() -> Path:
    d = Path(os.environ.get("SHIPYARD_TEST_CACHE") or Path.home() / ".cache" / "shipyard-tests")
    d.mkdir(parents=True, exist_ok=True)
    return d


def rootfs_tarball() -> Path:
    """The debootstrap root filesystem as a tar, from the cache or made now."""
    if not shutil.which("debootstrap"):
        pytest.fail("debootstrap is missing: apt-get install debootstrap (shipyard/data/test-packages.txt)")
    version = subprocess.run(["debootstrap", "--version"], capture_output=True, text=True).stdout.strip()
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    mirror = debian_mirror()
    key = hashlib.sha256(f"{SUITE}|{VARIANT}|{mirror}|{arch}|{version}".encode()).hexdigest()[:16]
    tarball = cache_dir() / f"debian-{SUITE}-{VARIANT}-{arch}-{key}.tar"
    if tarball.is_file():
        return tarball
    # `invoke test` runs two docker sessions side by side: the second waits for the first's debootstrap
    with open(tarball.with_name(tarball.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.is_file():
            _debootstrap(tarball, arch, mirror)
    return tarball


def _debootstrap(tarball: Path, arch: str, mirror: str) -> None:
    with tempfile.TemporaryDirectory(prefix="shipyard-debootstrap-") as tmp:
        root = Path(tmp) / "root"
        res = subprocess.run(["debootstrap", f"--variant={VARIANT}", f"--arch={arch}", SUITE, str(root), mirror],
                             capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            pytest.fail(f"debootstrap {SUITE} from {mirror} failed: {(res.stdout + res.stderr)[-2000:]}")
        part = tarball.with_name(tarball.name + f".tmp-{os.getpid()}")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(part), "."], check=True)
        os.replace(part, tarball)


@pytest.fixture(scope="session")
def debian12_base(docker_services):
    """The image ``os: debian12`` bootstraps from, imported into the session's dockerd from the debootstrap tar."""
    dockerd, _ = docker_services
    name = compat.os_base("debian12")
    repo, tag = name.rsplit(":", 1)
    api = dockerd.client(timeout=900).api
    api.import_image_from_file(str(rootfs_tarball()), repository=repo, tag=tag, changes=['CMD ["/bin/bash"]'])
    assert api.inspect_image(name)["Id"]
    return name


class ConnectProxy:
    """A real HTTPS proxy on 127.0.0.1 (HTTP CONNECT tunnels, nothing else), counting the hosts it tunnels to. The
    end-to-end build goes through it, as builds on sites whose nodes reach package indexes only through a proxy."""

    def __init__(self):
        import socketserver
        import threading

        tunnels = self.tunnels = []

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                import select
                import socket

                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                words = head.split(b"\r\n", 1)[0].decode(errors="replace").split()
                if len(words) < 2 or words[0] != "CONNECT":
                    self.request.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                    return
                host, _, port = words[1].rpartition(":")
                try:
                    up = socket.create_connection((host, int(port)), timeout=30)
                except OSError:
                    self.request.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                    return
                tunnels.append(words[1])
                self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                socks = [self.request, up]
                try:
                    while True:
                        ready, _, _ = select.select(socks, [], [], 120)
                        if not ready:
                            return
                        for s in ready:
                            data = s.recv(1 << 16)
                            if not data:
                                return
                            (up if s is self.request else self.request).sendall(data)
                finally:
                    up.close()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def connect_proxy():
    proxy = ConnectProxy()
    yield proxy
    proxy.stop()
