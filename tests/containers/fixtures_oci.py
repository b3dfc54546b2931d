"""An OCI registry in the test process (read-only, plain HTTP on 127.0.0.1) serving base images made here from a
root filesystem folder, so a real ``apptainer build`` pulls its ``Bootstrap: docker`` base through registry.yaml's
``base_mirror`` with no daemon and no network: what the distribution API's pull side needs and nothing else
(``GET /v2/``, manifests and blobs by tag or digest, HEAD of each)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"  # uncompressed: served locally, gzip would only cost time


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer(rootfs: Path) -> bytes:
    """A layer: the tar of ``rootfs``, every entry owned by root."""
    raw = io.BytesIO()

    def root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(rootfs.rglob("*")):
            tar.add(p, arcname=str(p.relative_to(rootfs)), recursive=False, filter=root_owned)
    return raw.getvalue()


class OciServer:
    """The registry: :meth:`add_image` puts an image under ``NAME:TAG``; ``address`` is ``127.0.0.1:PORT``."""

    def __init__(self):
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}  # (name, tag or digest) -> manifest
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: the test output is the builds'
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body: bool):
                server.requests.append(f"{self.command} {self.path}")
                path = self.path.split("?", 1)[0]
                data, ctype = None, "application/json"
                if path in ("/v2/", "/v2"):
                    data = b"{}"
                elif "/manifests/" in path:
                    name, ref = path[len("/v2/"):].split("/manifests/", 1)
                    data, ctype = server.manifests.get((name, ref)), MANIFEST_TYPE
                elif "/blobs/" in path:
                    data, ctype = server.blobs.get(path.rsplit("/", 1)[1]), "application/octet-stream"
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    err = b'{"errors":[{"code":"NAME_UNKNOWN","message":"not here"}]}'
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    if body:
                        self.wfile.write(err)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Docker-Content-Digest", _digest(data))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.end_headers()
                if body:
                    try:
                        self.wfile.write(data)
                    except (BrokenPipeError, ConnectionResetError):  # a client that had read enough (a layer it
                        pass  # already holds in its cache) hangs up mid-blob

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add_image(self, name: str, tag: str, layers: list[bytes], env: list[str]) -> str:
        """Serve ``layers`` (tars, lowest first) as a linux/amd64 image ``NAME:TAG``; returns its manifest digest."""
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "config": {"Env": env, "Cmd": ["/bin/sh"]},
                             "rootfs": {"type": "layers", "diff_ids": [_digest(x) for x in layers]}}).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": _digest(x), "size": len(x)} for x in layers],
        }).encode()
        for blob in (config, *layers):
            self.blobs[_digest(blob)] = blob
        digest = _digest(manifest)
        self.manifests[(name, tag)] = self.manifests[(name, digest)] = manifest
        return digest

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# A stand-in for apt-get in the tiny base, so a test can make a real %post fail or wait (the recipe runs
# `apt-get update` and `apt-get install ... PACKAGES` for an environment's `apt:`): a package named
# shipyard-test-exit-N makes it exit N (0: succeed); shipyard-test-hold-TOKEN makes it wait until the host file
# /tmp/shipyard-test-release-TOKEN exists (a build's %post sees the host's /tmp), 3 minutes at most: a %post whose
# builder was killed outlives it, and would otherwise poll forever on the machine. It says whether the build network
# settings (shipyard/containers/buildnet.py) reached it, never their values.
APT_GET_STUB = """#!/bin/sh
# TEST FIXTURE, not apt-get (tests/containers/fixtures_oci.py)
[ -n "${https_proxy:-}" ] && echo "apt-get stub: https_proxy is set"
[ -r "${SSL_CERT_FILE:-/nonexistent}" ] && echo "apt-get stub: SSL_CERT_FILE is readable"
for a in "$@"; do
  case "$a" in
    shipyard-test-exit-*) echo "apt-get stub: exit ${a#shipyard-test-exit-}"; exit "${a#shipyard-test-exit-}" ;;
    shipyard-test-hold-*) echo "apt-get stub: holding"; n=0
      while [ ! -e "/tmp/shipyard-test-release-${a#shipyard-test-hold-}" ] && [ "$n" -lt 1800 ]; do sleep 0.1; n=$((n + 1)); done ;;
  esac
done
"""
TINY_BASE_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin"]


def tiny_base_rootfs(dest: Path) -> Path:
    """fixtures_docker's tiny base (busybox, Debian's python3.11, the metadata-only torch) plus the apt-get stub."""
    from fixtures_docker import make_rootfs

    root = make_rootfs(dest)
    # the build network's bind point (shipyard/containers/buildnet.py): Apptainer builds %post in a writable
    # sandbox, where it cannot create a bind destination; every FHS base (Debian's, Ubuntu's, nvidia/cuda) has it
    (root / "mnt").mkdir()
    stub = root / "usr" / "bin" / "apt-get"
    stub.write_text(APT_GET_STUB)
    stub.chmod(0o755)
    return root


DEBIAN_TORCH_BASE = "shipyard-test/debian12-torch:1"


def debian_torch_layer(d: Path) -> bytes:
    """The layer that puts fixtures_docker's metadata-only torch (the tiny base's pins) on a Debian 12 base, where
    Debian's python3.11 finds it (/usr/local/lib/python3.11/dist-packages)."""
    from fixtures_docker import TINY_PINS, _fixture_torch

    _fixture_torch(d / "usr" / "local" / "lib" / "python3.11" / "dist-packages", TINY_PINS)
    return layer(d)
