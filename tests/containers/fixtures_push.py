"""A small HTTP proxy in front of the real local registry, for what that registry cannot do by itself in a test:
require credentials (Bearer token auth, the scheme real registries use) and fail transiently (503) on purpose.

Everything it forwards reaches the real docker-registry unchanged (the Host header too, so the registry's upload
Location URLs point back at the proxy).
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

TOKEN = "test-token-4f1a"


class RegistryProxy:
    def __init__(self, upstream: str, user: str | None = None, password: str | None = None, fail_first: int = 0):
        self.upstream = upstream
        self.basic = base64.b64encode(f"{user}:{password}".encode()).decode() if user else None
        self.fail_left = fail_first
        self.seen_auth: list[str] = []  # Authorization headers received (to prove credentials were sent)
        self.requests: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _reply(self, code: int, body: bytes = b"", headers: dict | None = None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                auth = self.headers.get("Authorization", "")
                with proxy.lock:
                    if auth:
                        proxy.seen_auth.append(auth)
                    if proxy.fail_left > 0:
                        proxy.fail_left -= 1
                        proxy.requests.append((self.command, self.path, 503))
                        return self._reply(503, b'{"errors":[{"code":"UNAVAILABLE","message":"try later"}]}',
                                           {"Content-Type": "application/json"})
                if proxy.basic and self.path.startswith("/token"):
                    if auth == f"Basic {proxy.basic}":
                        return self._reply(200, json.dumps({"token": TOKEN}).encode(),
                                           {"Content-Type": "application/json"})
                    return self._reply(401, b"{}", {"Content-Type": "application/json"})
                if proxy.basic and auth != f"Bearer {TOKEN}":
                    realm = f"http://{self.headers['Host']}/token"
                    return self._reply(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {
                        "Content-Type": "application/json",
                        "WWW-Authenticate": f'Bearer realm="{realm}",service="test-registry",scope="repository:x:pull,push"'})
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("authorization", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                proxy.requests.append((self.command, self.path, r.status))
                out = {k: v for k, v in r.getheaders() if k.lower() not in ("content-length", "connection",
                                                                             "transfer-encoding")}
                conn.close()
                self._reply(r.status, data, out)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry_proxy(docker_services):
    """Factory: ``registry_proxy(user=..., password=..., fail_first=N)`` -> a started proxy (stopped after)."""
    _, reg = docker_services
    started = []

    def make(**kw) -> RegistryProxy:
        p = RegistryProxy(reg.address, **kw).__enter__()
        started.append(p)
        return p

    yield make
    for p in started:
        p.__exit__(None, None, None)
