"""`invoke stage` errors said as what they are: a registry that fails or is slow is the registry's fault,
not the storage's; a bad or unknown --tag is one line; a storage path that is a file is not "missing"."""

from __future__ import annotations

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import helpers_stage
import pytest
from helpers_stage import storage

from shipyard import registry
from shipyard.errors import ShipyardError

pytestmark = pytest.mark.real_apptainer


class Registry:
    """127.0.0.1: "hang" (accepts, answers nothing until closed) or "404" (every request: 404 MANIFEST_UNKNOWN)."""

    def __init__(self, mode: str):
        stop = self.stop = threading.Event()

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def handle_one(self):
                if mode == "hang":
                    stop.wait(20)
                    return
                body = b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_HEAD = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def pointed_at(reg, address: str):
    path = Path(reg.path)
    path.write_text(path.read_text().replace("127.0.0.1:9", address))
    return registry.load(path)


def one_line(exc, *needles):
    msg = str(exc)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    return msg


@pytest.mark.double  # the registry is this file's stand-in that hangs or answers 404
@pytest.mark.parametrize("mode", ["hang", "404"])
def test_registry_failures_during_stage_are_the_registrys(built, mode, monkeypatch):
    monkeypatch.setenv("SHIPYARD_CONNECT_TIMEOUT", "1")
    monkeypatch.setenv("SHIPYARD_READ_TIMEOUT", "1")
    monkeypatch.setattr("shipyard.containers.push.ATTEMPTS", 1)
    srv = Registry(mode)
    try:
        reg = pointed_at(built, srv.address)
        with pytest.raises(ShipyardError) as ei:
            helpers_stage.stage(reg, "tiny", "lab", source="registry", tag="nosuch", out=io.StringIO())
        msg = one_line(ei.value, f"registry 'local' ({srv.address})", "tiny:nosuch")
        assert "storage" not in msg and "permission" not in msg and "space" not in msg, msg
        if mode == "404":
            assert "404" in msg
    finally:
        srv.close()
    assert not [p for p in storage(built).iterdir() if not p.name.endswith(".lock")]


@pytest.mark.parametrize("tag", ["a:b", "../x", "-x", "a b", "x\ny"])
def test_a_bad_tag_is_one_line_before_any_request(built, tag):
    with pytest.raises(ShipyardError) as ei:
        helpers_stage.stage(built, "tiny", "lab", source="registry", tag=tag, out=io.StringIO())
    one_line(ei.value, "--tag", "OCI tag")


def test_a_storage_path_that_is_a_file_is_not_called_missing(built):
    path = storage(built)
    path.rmdir()
    path.write_text("not a directory\n")
    with pytest.raises(ShipyardError) as ei:
        helpers_stage.stage(built, "tiny", "lab", out=io.StringIO())
    msg = one_line(ei.value, str(path), "not a directory", "clusters.lab.storage")
    assert "mkdir -p" not in msg and "does not exist" not in msg
