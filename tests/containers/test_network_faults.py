"""Registry faults without a registry: a small in-process HTTP server that hangs, answers 401/429/500, serves a
truncated blob, or moves an upload to another host. Each ends in one ShipyardError line (exit 2) naming the registry
and the image, within the configured timeouts, with nothing written and no credential sent to a foreign host.

The happy paths against a real OCI registry are in tests/containers/test_push.py (docker-marked); these need no daemon.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fixtures_build as fb
import pytest
from test_push import make_real_sif

from shipyard import facts
from shipyard import project as paths
from shipyard import registry
from shipyard.containers import common
from shipyard.containers import manifest as mf
from shipyard.containers import push as p
from shipyard.errors import ShipyardError
from shipyard.files import now_iso

SECRET = "s3cret-pw"


class FakeRegistry:
    """``mode``: "hang" (accept, never answer), "status:N" (every request answered N), "foreign" (uploads are sent
    to ``foreign`` by the Location header), "truncated" (a manifest whose blob is short), "ok-upload"."""

    def __init__(self, mode: str, foreign: str = ""):
        self.mode, self.foreign = mode, foreign
        self.auth_seen: list[str] = []
        self.stop = threading.Event()
        me = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def handle_one(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                me.auth_seen.append(self.headers.get("Authorization", ""))
                if me.mode == "hang":
                    me.stop.wait(30)
                    return
                if me.mode.startswith("status:"):
                    code = int(me.mode.split(":")[1])
                    return self._send(code, b'{"errors":[{"code":"X","message":"fault"}]}',
                                      {"Content-Type": "application/json"})
                if me.mode == "foreign":
                    if self.command == "HEAD":
                        return self._send(404)
                    if self.command == "POST":
                        return self._send(202, headers={"Location": f"http://{me.foreign}/upload/1"})
                    return self._send(201, headers={"Docker-Content-Digest": "sha256:" + "0" * 64})
                if me.mode == "truncated":
                    if "/manifests/" in self.path:
                        body = json.dumps({"schemaVersion": 2, "mediaType": p.OCI_MANIFEST, "config": {},
                                           "layers": [{"mediaType": p.SIF_LAYER_MEDIA_TYPE, "size": 4096,
                                                       "digest": "sha256:" + "a" * 64}]}).encode()
                        return self._send(200, body, {"Content-Type": p.OCI_MANIFEST,
                                                      "Docker-Content-Digest": "sha256:" +
                                                      hashlib.sha256(body).hexdigest()})
                    return self._send(200, b"short")
                return self._send(404)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


FAST_TIMEOUT_S, FAST_ATTEMPTS = 1, 2
# a hang costs each attempt its read timeout: 2 s here; the rest is room for a busy 2-core machine, well below what a
# third attempt or a doubled timeout would take
HANG_BOUND_S = FAST_ATTEMPTS * 2 * FAST_TIMEOUT_S + 1.5


@pytest.fixture
def fast_net(monkeypatch):
    monkeypatch.setenv("SHIPYARD_CONNECT_TIMEOUT", str(FAST_TIMEOUT_S))
    monkeypatch.setenv("SHIPYARD_READ_TIMEOUT", str(FAST_TIMEOUT_S))
    monkeypatch.setattr(p, "ATTEMPTS", FAST_ATTEMPTS)
    monkeypatch.setattr(p, "BACKOFF_S", 0.01)


def project(tmp_path, monkeypatch, address):
    root = fb.build_project_at(tmp_path / "proj", address)
    monkeypatch.chdir(root)
    return registry.load(root / "registry.yaml")


def built(reg, env="tiny"):
    sif = make_real_sif(paths.artifact_path(reg, env, "sif"), b"w" * 1000)
    mf.update_manifest(paths.manifest_path(reg, env), environment=env, status="ok", input_hash="f" * 64,
                       finished=now_iso(), artifacts={"sif": common.file_record(reg.root, sif)})
    return sif


def one_line(exc: ShipyardError, *needles):
    msg = str(exc)
    assert "\n" not in msg and all(n in msg for n in needles), msg


@pytest.mark.parametrize("mode", ["hang", "status:401", "status:429", "status:500"])
def test_push_faults_end_in_one_line(mode, tmp_path, monkeypatch, fast_net):
    """A registry that never answers, refuses credentials, throttles or fails: one line naming the registry and
    the image, after bounded retries and timeouts (the hang takes ~2 s with 1 s timeouts, not forever)."""
    srv = FakeRegistry(mode)
    try:
        reg = project(tmp_path, monkeypatch, srv.address)
        built(reg)
        t0 = time.monotonic()
        with pytest.raises(ShipyardError) as ei:
            p.push(reg, reg.environment("tiny"), tag="v1")
        elapsed = time.monotonic() - t0
        assert elapsed < HANG_BOUND_S, elapsed
        if mode == "hang":  # every attempt waited out its read timeout: the retries happened, the bound holds them
            assert elapsed >= FAST_ATTEMPTS * FAST_TIMEOUT_S * 0.9, elapsed
        one_line(ei.value, srv.address, "tiny:v1")
        if mode != "hang":
            assert mode.split(":")[1] in str(ei.value)
    finally:
        srv.close()


def test_pull_from_unreachable_registry_is_one_line_and_releases_the_lock(tmp_path, monkeypatch, fast_net):
    srv = FakeRegistry("hang")
    try:
        reg = project(tmp_path, monkeypatch, srv.address)
        with pytest.raises(ShipyardError) as ei:
            p.pull(reg, reg.environment("tiny"), tag="v1")
        one_line(ei.value, "tiny:v1")
        with common.build_lock(paths.build_lock_path(reg.root, "tiny"), block=False):
            pass  # the lock was released
    finally:
        srv.close()


def test_truncated_blob_is_refused_and_nothing_is_written(tmp_path, monkeypatch, fast_net):
    srv = FakeRegistry("truncated")
    try:
        reg = project(tmp_path, monkeypatch, srv.address)
        with pytest.raises(ShipyardError) as ei:
            p.pull(reg, reg.environment("tiny"), tag="v1")
        one_line(ei.value)
        assert not paths.artifact_path(reg, "tiny", "sif").exists()
        assert not list(paths.artifact_path(reg, "tiny", "sif").parent.glob("*.tmp-*"))
    finally:
        srv.close()


def test_credentials_never_follow_an_upload_to_another_host(tmp_path, monkeypatch, fast_net):
    """The registry answers the upload POST with a Location on another host: that host gets no Authorization."""
    foreign = FakeRegistry("status:202")
    srv = FakeRegistry("foreign", foreign=foreign.address)
    monkeypatch.setenv("SHIPYARD_REGISTRY_USERNAME", "me")
    monkeypatch.setenv("SHIPYARD_REGISTRY_PASSWORD", SECRET)
    try:
        reg = project(tmp_path, monkeypatch, srv.address)
        built(reg)
        with pytest.raises(ShipyardError):
            p.push(reg, reg.environment("tiny"), tag="v1")
        assert foreign.auth_seen, "the upload never reached the foreign host: the test proves nothing"
        assert foreign.auth_seen == [""] * len(foreign.auth_seen)
    finally:
        srv.close()
        foreign.close()


@pytest.mark.parametrize("tag", ["x:y", "../other", "-lead", "a" * 129, "a b", "sha256:abc", ".hidden"])
def test_bad_tags_are_refused_before_any_request(tag, tmp_path, monkeypatch):
    reg = project(tmp_path, monkeypatch, "127.0.0.1:9")
    built(reg)
    with pytest.raises(ShipyardError) as ei:
        p.push(reg, reg.environment("tiny"), tag=tag)
    one_line(ei.value, "--tag")
    with pytest.raises(ShipyardError):
        p.pull(reg, reg.environment("tiny"), tag=tag)


def test_push_refuses_a_file_that_is_not_a_sif(tmp_path, monkeypatch):
    reg = project(tmp_path, monkeypatch, "127.0.0.1:9")
    sif = built(reg)
    data = bytearray(sif.read_bytes())
    data[32:41] = b"NOT_MAGIC"
    sif.write_bytes(bytes(data))
    common.record_artifact(reg, "tiny", "sif")  # even when re-recorded: the content is checked, not the record
    with pytest.raises(ShipyardError) as ei:
        p.push(reg, reg.environment("tiny"), tag="v1")
    one_line(ei.value, "SIF")


def test_registry_uri_with_credentials_is_refused_at_load(tmp_path):
    text = fb.build_project_at(tmp_path / "proj", "127.0.0.1:5000").joinpath("registry.yaml").read_text()
    text = text.replace("oras://127.0.0.1:5000", "oras://user:pw@127.0.0.1:5000")
    assert "user:pw@" in text
    with pytest.raises(ShipyardError) as ei:
        registry.load_text(text)
    one_line(ei.value, "uri")


def test_timeouts_come_from_data_and_can_be_changed():
    assert p.timeouts({}) == (10.0, 120.0)
    assert p.timeouts({"SHIPYARD_CONNECT_TIMEOUT": "3", "SHIPYARD_READ_TIMEOUT": "4.5"}) == (3.0, 4.5)
    with pytest.raises(ShipyardError):
        p.timeouts({"SHIPYARD_READ_TIMEOUT": "soon"})


def test_cleanup_touches_only_exact_temp_names(tmp_path, monkeypatch):
    """An environment named like a temp file of another keeps its image and manifest when the other recovers."""
    reg = project(tmp_path, monkeypatch, "127.0.0.1:9")
    target = paths.artifact_path(reg, "tiny", "sif")
    target.parent.mkdir(parents=True, exist_ok=True)
    mine = paths.temp_path(target, 4242)
    mine.write_bytes(b"partial")
    neighbour = [target.parent / f"{target.name}.tmp-7.sif", target.parent / f"{target.name}.tmp-7.json"]
    for f in neighbour:
        f.write_text("another environment's file")
    common.recover_stale(reg, "tiny")
    assert not mine.exists() and all(f.exists() for f in neighbour)


class DripRegistry:
    """Answers every request with a 200 whose body comes one byte a second: never silent for a read timeout.
    Bounded: each answer stops after ``limit`` bytes, and the server is shut down by the test."""

    def __init__(self, limit: int = 12):
        self.stop = threading.Event()
        me = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def handle_one(self):
                self.send_response(200)
                self.send_header("Content-Type", p.OCI_MANIFEST)
                self.send_header("Content-Length", str(limit))
                self.end_headers()
                for _ in range(limit):
                    if me.stop.wait(1.0):
                        return
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        return

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("op", ["pull", "push"])
def test_a_registry_sending_one_byte_a_second_fails_within_the_deadline(op, tmp_path, monkeypatch, fast_net):
    """The read timeout (1 s here) never trips on a 1 byte/s answer; the total deadline does: one line naming the
    registry and the deadline, the build lock released, nothing written."""
    monkeypatch.setenv("SHIPYARD_TRANSFER_DEADLINE", "2")
    srv = DripRegistry()
    try:
        reg = project(tmp_path, monkeypatch, srv.address)
        if op == "push":
            built(reg)
        t0 = time.monotonic()
        with pytest.raises(ShipyardError) as ei:
            getattr(p, op)(reg, reg.environment("tiny"), tag="v1")
        took = time.monotonic() - t0
        one_line(ei.value, srv.address, "tiny:v1", "deadline of 2 s", "SHIPYARD_TRANSFER_DEADLINE")
        assert took < 6, took
        with common.build_lock(paths.build_lock_path(reg.root, "tiny"), block=False):
            pass
        if op == "pull":
            assert not paths.artifact_path(reg, "tiny", "sif").exists()
    finally:
        srv.close()


def test_the_deadline_comes_from_data_and_can_be_changed():
    assert p.deadline_s({}) == facts.load("limits")["network"]["deadline_s"]
    assert p.deadline_s({"SHIPYARD_TRANSFER_DEADLINE": "7.5"}) == 7.5
    for bad in ("soon", "0", "-1"):
        with pytest.raises(ShipyardError, match="SHIPYARD_TRANSFER_DEADLINE"):
            p.deadline_s({"SHIPYARD_TRANSFER_DEADLINE": bad})
