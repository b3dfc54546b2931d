"""The base image pinned by digest: `invoke lock ENV` looks the tag up through base_mirror (the tests' in-process OCI
registry, tests/containers/fixtures_oci.py), the lock records the digest, the definitions bootstrap from
``TAG@sha256:...``; a hand-changed digest fails `render --check`, `--update-base` moves the pin, an unreachable
registry leaves the base unpinned and `invoke check` warns. No uv resolution: the locks' Python closure is written
here (the resolution is tests/definitions/test_lock.py's), so the tests need no service and no network."""

from __future__ import annotations

import hashlib
import io
import subprocess

import pytest
from fixtures_lock import CUTOFF, REGISTRY_TEXT
from fixtures_oci import OciServer

from shipyard import project as paths
from shipyard.commands import definitions as definitions_cmd
from shipyard.commands import gate
from shipyard.commands.context import Context
from shipyard.containers import base_digest, engine, push
from shipyard.definitions import base_pin, pylock
from shipyard.definitions import render as definitions
from shipyard.errors import ShipyardError

BASE = "nvcr.io/nvidia/pytorch"  # the `tiny` environment's base, 24.05-py3, served by the mirror under its host
CLOSURE = "six==1.16.0 \\\n    --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254\n"


@pytest.fixture
def mirror():
    server = OciServer()
    yield server
    server.stop()


@pytest.fixture
def fast_retries(monkeypatch):
    """A refused connection is retried (it is transient); the tests do not wait out the backoff."""
    monkeypatch.setattr(push, "BACKOFF_S", 0.0)


def _project(make_project, address: str):
    """The lock preset with base_mirror at ``address`` and a lock for `tiny` whose closure is written here."""
    reg = make_project(REGISTRY_TEXT + f"base_mirror:\n  url: {address}\n  insecure_http: true\n", use=False)
    env = reg.environment("tiny")
    path = paths.lock_path(reg, "tiny")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(pylock.render_header(env, CUTOFF, None) + CLOSURE)
    definitions.write(reg, [env])
    return reg, env


def _ctx(reg):
    return Context(reg, out=io.StringIO(), err=io.StringIO())


def _image(server: OciServer, layer: bytes) -> str:
    return server.add_image(BASE, "24.05-py3", [layer], ["PATH=/usr/bin:/bin"])


def test_the_lock_records_the_digest_and_the_definitions_pull_by_it(make_project, mirror):
    digest = _image(mirror, b"one")
    reg, env = _project(make_project, mirror.address)
    ctx = _ctx(reg)
    assert definitions_cmd.lock(ctx, "tiny", update_base=True) == 0
    assert f"pinned at {digest}" in ctx.out.getvalue()
    header = pylock.read_header(paths.lock_path(reg, "tiny"))
    assert header["lock-format"] == "2" and header["base"] == f"{BASE}:24.05-py3" and header["base-digest"] == digest
    assert paths.lock_path(reg, "tiny").read_text().endswith(CLOSURE), "the Python closure was kept byte for byte"
    head = [r for r in mirror.requests if "/manifests/" in r]
    assert head == [f"HEAD /v2/{BASE}/manifests/24.05-py3"], head
    pulled = f"{mirror.address}/{BASE}:24.05-py3@{digest}"
    assert f"\nFrom: {pulled}\n" in paths.definition_path(reg, "tiny").read_text()
    assert f"\nFROM {pulled}\n" in paths.dockerfile_path(reg, "tiny").read_text()
    out = io.StringIO()
    assert definitions_cmd.render(Context(reg, out=out), "tiny", check=True) == 0, out.getvalue()
    warns = [p for p in _check_problems(reg) if "pinned by tag only" in p]
    assert not warns
    assert engine.base_record(reg, env) == {"reference": f"{BASE}:24.05-py3", "digest": digest,
                                            "mirrored": f"{mirror.address}/{BASE}:24.05-py3"}


def test_a_lock_whose_base_digest_was_changed_fails_render_check(make_project, mirror):
    digest = _image(mirror, b"one")
    reg, _ = _project(make_project, mirror.address)
    assert definitions_cmd.lock(_ctx(reg), "tiny", update_base=True) == 0
    lock = paths.lock_path(reg, "tiny")
    other = "sha256:" + "0" * 64
    lock.write_text(lock.read_text().replace(digest, other))
    out = io.StringIO()
    assert definitions_cmd.render(Context(reg, out=out), "tiny", check=True) == 1
    stale = [ln.strip() for ln in out.getvalue().splitlines() if ln.startswith("  ")]
    assert "definitions/tiny.def (differs from registry.yaml)" in stale, stale
    assert "definitions/tiny.Dockerfile (differs from registry.yaml)" in stale, stale


def test_update_base_moves_the_pin_on_purpose_and_a_relock_keeps_it(make_project, mirror, monkeypatch):
    first = _image(mirror, b"one")
    reg, env = _project(make_project, mirror.address)
    assert definitions_cmd.lock(_ctx(reg), "tiny", update_base=True) == 0
    moved = _image(mirror, b"two")  # the publisher rebuilt the tag
    assert moved != first
    # a relock (here its uv part stands still) keeps the recorded digest: it moves only with --update-base
    monkeypatch.setattr(pylock, "compile_lock", lambda e, cutoff, index, base=None:
                        pylock.render_header(e, cutoff, index, base) + CLOSURE)
    assert definitions_cmd.lock(_ctx(reg), "tiny") == 0
    assert pylock.read_header(paths.lock_path(reg, "tiny"))["base-digest"] == first
    assert definitions_cmd.lock(_ctx(reg), "tiny", update_base=True) == 0
    assert pylock.read_header(paths.lock_path(reg, "tiny"))["base-digest"] == moved
    assert f"@{moved}\n" in paths.definition_path(reg, "tiny").read_text()


def test_a_registry_that_does_not_answer_leaves_the_base_unpinned_and_check_warns(make_project, fast_retries):
    reg, env = _project(make_project, "127.0.0.1:9")  # discard port: nothing listens, the connection is refused
    ctx = _ctx(reg)
    assert definitions_cmd.lock(ctx, "tiny", update_base=True) == 0
    assert "UNPINNED" in ctx.out.getvalue()
    header = pylock.read_header(paths.lock_path(reg, "tiny"))
    assert header["base-digest"] == "unpinned"
    assert header["base-unpinned"] == "no answer from base_mirror 127.0.0.1:9 (could not connect)"
    assert f"\nFrom: 127.0.0.1:9/{BASE}:24.05-py3\n" in paths.definition_path(reg, "tiny").read_text()
    warns = [p for p in _check_problems(reg) if "pinned by tag only" in p]
    assert warns == [f"WARN environments.tiny.base: base image {BASE}:24.05-py3 is pinned by tag only (no answer "
                     "from base_mirror 127.0.0.1:9 (could not connect)); run `invoke lock tiny --update-base` where "
                     "its registry (or base_mirror) answers"], warns


def test_a_tag_the_registry_does_not_have_is_one_error_line(make_project, mirror):
    reg, _ = _project(make_project, mirror.address)
    before = paths.lock_path(reg, "tiny").read_bytes()
    with pytest.raises(ShipyardError, match=r"^environments\.tiny\.base nvcr.io/nvidia/pytorch:24.05-py3: "
                       r"base_mirror 127\.0\.0\.1:\d+: no manifest nvcr.io/nvidia/pytorch:24.05-py3 \(HTTP 404\)$"):
        definitions_cmd.lock(_ctx(reg), "tiny", update_base=True)
    assert paths.lock_path(reg, "tiny").read_bytes() == before


def test_a_garbled_digest_in_the_lock_is_one_line_naming_the_lock(make_project, mirror):
    _image(mirror, b"one")
    reg, env = _project(make_project, mirror.address)
    assert definitions_cmd.lock(_ctx(reg), "tiny", update_base=True) == 0
    lock = paths.lock_path(reg, "tiny")
    text = lock.read_text()
    digest = pylock.read_header(lock)["base-digest"]
    lock.write_text(text.replace(digest, "sha256:x; rm -rf /"))
    with pytest.raises(ShipyardError, match=r"tiny\.lock: header base-digest 'sha256:x; rm -rf /' is neither"):
        definitions.render_definition(env, reg)
    assert "tiny.lock" in pylock.stale_reason(reg, env)


def test_a_lock_for_another_base_is_stale(make_project, mirror):
    _image(mirror, b"one")
    reg, env = _project(make_project, mirror.address)
    assert definitions_cmd.lock(_ctx(reg), "tiny", update_base=True) == 0
    text = paths.lock_path(reg, "tiny").read_text().replace("24.05-py3", "24.04-py3")
    paths.lock_path(reg, "tiny").write_text(text)
    why = pylock.stale_reason(reg, env)
    assert why and "records the base image nvcr.io/nvidia/pytorch:24.04-py3" in why and "--update-base" in why
    assert "@sha256:" not in definitions.render_definition(env, reg), "a digest of another tag is never used"


@pytest.mark.parametrize("reference,want", [
    ("debian:12", ("registry-1.docker.io", "library/debian", "12")),
    ("nvidia/cuda:12.1.1-runtime-ubuntu22.04", ("registry-1.docker.io", "nvidia/cuda", "12.1.1-runtime-ubuntu22.04")),
    ("nvcr.io/nvidia/pytorch:24.05-py3", ("nvcr.io", "nvidia/pytorch", "24.05-py3")),
    ("localhost:5000/a/b", ("localhost:5000", "a/b", "latest")),
])
def test_where_a_reference_is_looked_up(reference, want):
    assert base_digest._split(reference) == want


def test_the_accept_header_asks_for_indexes_and_manifests():
    for media in ("application/vnd.oci.image.index.v1+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json",
                  "application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json"):
        assert media in base_digest.ACCEPT.split(", ")


def _check_problems(reg) -> list[str]:
    """What `invoke check tiny` adds for the lock (tests/registry has the table itself)."""
    return [f"{p.severity} {p.key}: {p.message}" for p in gate.lock_problems_for(reg, reg.environment("tiny"))]


@pytest.mark.real_apptainer
@pytest.mark.slow  # a real build from the registry by digest: seconds of CPU
def test_real_apptainer_bootstraps_from_the_pinned_reference(real_project, base_registry, tmp_path):
    """The ``From:`` line shipyard renders for a pinned base (the mirror's ``HOST:PORT/NAME:TAG@sha256:...``) is one
    the real Apptainer 1.4.5 builds from, and it asks the registry for the manifest by that digest."""
    env = real_project.environment("tiny")
    pin = base_digest.resolve(real_project, env)
    manifest = base_registry.manifests[tuple(env.base.value.split(":"))]
    assert pin.digest == "sha256:" + hashlib.sha256(manifest).hexdigest(), pin
    ref = base_pin.pinned(real_project.base_reference(env), pin, env.base.value)
    assert ref == f"{base_registry.address}/shipyard-test/base:1@{pin.digest}"
    (tmp_path / "pinned.def").write_text(f"Bootstrap: docker\nFrom: {ref}\n\n%post\n    touch /pinned\n")
    res = subprocess.run(["apptainer", "build", "--no-https", str(tmp_path / "pinned.sif"), str(tmp_path / "pinned.def")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"GET /v2/shipyard-test/base/manifests/{pin.digest}" in base_registry.requests


class _Registry:
    """A registry that gives no digest on HEAD (some proxies drop the header): the GET's bytes decide. ``lie``: the
    GET reports a digest its bytes do not hash to. Keeps each request's method, path and Accept header."""

    def __init__(self, body: bytes, lie: bool = False):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.seen: list[tuple[str, str, str]] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, send_body: bool):
                registry.seen.append((self.command, self.path, self.headers.get("Accept", "")))
                self.send_response(200)
                self.send_header("Content-Type", base_digest.OCI_INDEX)
                self.send_header("Content-Length", str(len(body)))
                if send_body and lie:
                    self.send_header("Docker-Content-Digest", "sha256:" + "e" * 64)
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def do_HEAD(self):
                self._answer(False)

            def do_GET(self):
                self._answer(True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_without_a_digest_on_head_the_manifests_own_bytes_decide(make_project):
    body = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}'
    server = _Registry(body)
    try:
        reg, env = _project(make_project, server.address)
        pin = base_digest.resolve(reg, env)
    finally:
        server.stop()
    assert pin.digest == "sha256:" + hashlib.sha256(body).hexdigest()
    assert [(m, p) for m, p, _ in server.seen] == [("HEAD", f"/v2/{BASE}/manifests/24.05-py3"),
                                                  ("GET", f"/v2/{BASE}/manifests/24.05-py3")]
    assert all(a == base_digest.ACCEPT for _, _, a in server.seen)


def test_a_registry_whose_digest_is_not_its_bytes_is_one_error_line(make_project):
    server = _Registry(b"{}", lie=True)
    try:
        reg, env = _project(make_project, server.address)
        with pytest.raises(ShipyardError, match=r"^environments\.tiny\.base .*registry reports digest sha256:e+ but "
                                                r"the manifest it serves hashes to sha256:"):
            base_digest.resolve(reg, env)
    finally:
        server.stop()
