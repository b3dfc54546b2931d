"""`invoke push ENV` / `invoke pull ENV`: put a built image where every node can reach it, and get it back intact.

* SIF -> OCI registry as an ORAS artifact, with the media types ``apptainer pull oras://`` accepts (config
  ``application/vnd.sylabs.sif.config.v1+json``, layer ``application/vnd.sylabs.sif.layer.v1.sif``). Why the ``oras``
  library: it speaks the OCI distribution API including chunked (PATCH) blob uploads, so a multi-GB SIF goes up in
  16 MiB pieces with flat memory, and it reads docker-style credential files.
* Docker image -> registry through the Docker SDK (the daemon does the upload).
* Verification: after a push the manifest is read back from the registry and its sha256 must equal the digest the
  registry reported, and its layer must be our artifact's sha256 and size. A pull verifies the blob's sha256 against
  the manifest and the manifest against the digest recorded at push time.
* Transient failures (connection errors, 429 and 5xx) are retried with exponential backoff, by one policy for the
  whole operation (oras's own per-request retry, up to ~2 minutes of sleeps and blind to 502/503/429, is bypassed).
* Credentials: ``SHIPYARD_REGISTRY_USERNAME``/``SHIPYARD_REGISTRY_PASSWORD`` (or apptainer's
  ``APPTAINER_DOCKER_USERNAME``/``APPTAINER_DOCKER_PASSWORD``), else ``~/.docker/config.json`` and
  ``~/.apptainer/docker-config.json``. They are passed to the client in memory only: never written to the manifest,
  a log or the terminal.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import socket
import ssl
import tempfile
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Callable, TypeVar

from shipyard import facts, project
from shipyard.containers import common as b
from shipyard.containers import manifest as mf
from shipyard.containers.docker import check_repository_name, client
from shipyard.containers.sign import signature_problem
from shipyard.errors import ShipyardError

SIF_CONFIG_MEDIA_TYPE = "application/vnd.sylabs.sif.config.v1+json"
SIF_LAYER_MEDIA_TYPE = "application/vnd.sylabs.sif.layer.v1.sif"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CHUNK = 128 << 20  # bytes per PATCH; streamed from the file, so memory does not grow with it
_NET = facts.load("limits")["network"]  # timeouts and retries: shipyard/data/limits.yaml
ATTEMPTS = int(_NET["attempts"])
BACKOFF_S = float(_NET["backoff_s"])
# OCI distribution spec: a tag is [a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}
TAG = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")
_TRANSIENT = re.compile(r"\b(429|500|502|503|504)\b|Service Unavailable|Bad Gateway|Gateway Timeout|Too Many Requests|"
                        r"Internal Server Error|Connection (aborted|reset|refused)|timed out")
_RETRY_STATUS = (429, 500, 502, 503, 504)
T = TypeVar("T")


class TransientRegistryError(Exception):
    """The registry answered 429 or 5xx: worth another try."""


class RegistryAuthError(Exception):
    """The registry wants credentials it did not get or accept (401/403 after oras's auth attempt): not retried;
    :func:`one_line` names the registry and image."""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------------------------- retries, credentials


def is_transient(exc: BaseException) -> bool:
    """Worth another try: the network or the registry hiccupped, rather than a request that can never succeed."""
    import requests  # lazy: requests (~0.1 s) only when talking to a registry

    if isinstance(exc, (TransientRegistryError, requests.ConnectionError, requests.Timeout, ConnectionError,
                        TimeoutError)):
        return True
    if isinstance(exc, ShipyardError):
        return False
    return bool(_TRANSIENT.search(str(exc)))


def with_retries(what: str, fn: Callable[[], T], out: IO[str] | None, attempts: int | None = None,
                 backoff: float | None = None) -> T:
    """Run ``fn``; on a transient error wait ``backoff * 2**n`` seconds and try again, ``attempts`` times in all
    (defaults: the module's ATTEMPTS and BACKOFF_S, read at call time)."""
    attempts = ATTEMPTS if attempts is None else attempts
    backoff = BACKOFF_S if backoff is None else backoff
    for n in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or n == attempts - 1 or _deadline_passed():
                raise
            wait = backoff * 2 ** n
            if _CURRENT and wait >= _CURRENT[-1].left():
                raise
            print(f"{what}: transient error ({_first_line(exc)}); retry {n + 1}/{attempts - 1} in {wait:.0f} s",
                  file=out, flush=True)
            time.sleep(wait)
    raise AssertionError("unreachable")


def deadline_s(environ=None) -> float:
    """The total deadline of one push or pull (all requests and retries): shipyard/data/limits.yaml's
    ``network.deadline_s``, or $SHIPYARD_TRANSFER_DEADLINE (seconds)."""
    environ = os.environ if environ is None else environ
    raw = environ.get("SHIPYARD_TRANSFER_DEADLINE")
    try:
        val = float(raw) if raw else float(_NET["deadline_s"])
    except ValueError:
        raise ShipyardError(f"$SHIPYARD_TRANSFER_DEADLINE={raw!r}: expected seconds, e.g. 3600") from None
    if not val > 0:
        raise ShipyardError(f"$SHIPYARD_TRANSFER_DEADLINE={raw!r}: expected a positive number of seconds")
    return val


class _Deadline:
    """A total deadline for one transfer. Why a watchdog and not a timeout: a socket timeout bounds the silence
    between two bytes, so a registry that sends one byte a second never trips it. At the deadline every socket the
    transfer opened is shut down (a blocked read returns at once) and no retry starts."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def add(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets = [s for s in self._sockets if s.fileno() != -1] + [sock]
            if self.expired:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        return sock

    def left(self) -> float:
        return self.end - time.monotonic()


_CURRENT: list[_Deadline] = []  # the transfer in progress (a CLI runs one at a time)


@contextlib.contextmanager
def transfer_deadline(target, what: str, seconds: float | None = None):
    """Run one push or pull under :func:`deadline_s` (or ``seconds``: a shorter exchange, such as a manifest
    lookup): past it, one ShipyardError line naming the registry, what was transferred and the deadline, whatever
    the network was doing."""
    import urllib3.util.connection as u3conn  # lazy: with requests

    dl = _Deadline(seconds if seconds is not None else deadline_s())
    orig = u3conn.create_connection

    def create_connection(*args, **kwargs):
        return dl.add(orig(*args, **kwargs))

    u3conn.create_connection = create_connection
    _CURRENT.append(dl)
    dl._timer.start()
    try:
        yield dl
    except BaseException as exc:
        if dl.expired or dl.left() <= 0:
            raise ShipyardError(f"registry '{target.name}' ({target.host}): {what}: not done within the deadline of "
                                f"{dl.seconds:g} s (network.deadline_s in shipyard/data/limits.yaml, or "
                                "$SHIPYARD_TRANSFER_DEADLINE); the registry or the network is too slow") from None
        raise exc
    finally:
        dl._timer.cancel()
        _CURRENT.remove(dl)
        u3conn.create_connection = orig


def _deadline_passed() -> bool:
    return bool(_CURRENT) and (_CURRENT[-1].expired or _CURRENT[-1].left() <= 0)


def timeouts(environ=None) -> tuple[float, float]:
    """(connect, read) seconds for every registry request: shipyard/data/limits.yaml, or
    $SHIPYARD_CONNECT_TIMEOUT / $SHIPYARD_READ_TIMEOUT."""
    environ = os.environ if environ is None else environ
    out = []
    for var, key in (("SHIPYARD_CONNECT_TIMEOUT", "connect_s"), ("SHIPYARD_READ_TIMEOUT", "read_s")):
        raw = environ.get(var)
        try:
            val = float(raw) if raw else float(_NET[key])
        except ValueError:
            raise ShipyardError(f"${var}={raw!r}: expected seconds, e.g. 30") from None
        if not val > 0:
            raise ShipyardError(f"${var}={raw!r}: expected a positive number of seconds")
        out.append(val)
    return out[0], out[1]


def check_tag(tag: str) -> str:
    """``--tag``: the OCI tag grammar, so a tag can never name another repository (``x:y``) or a digest."""
    if not TAG.match(tag):
        raise ShipyardError(f"--tag {tag!r}: not an OCI tag (letters, digits and ._-, not starting with . or -, "
                            "at most 128 characters)")
    return tag


def _same_host(url: str, host: str) -> bool:
    """Whether ``url`` points at the registry's own ``host[:port]`` (credentials go nowhere else)."""
    u = urllib.parse.urlsplit(url)
    want = urllib.parse.urlsplit("//" + host)
    default = {"https": 443, "http": 80}.get(u.scheme)
    return (u.hostname or "").lower() == (want.hostname or "").lower() and \
        (u.port or default) == (want.port or default)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def env_credentials(environ=None) -> tuple[str, str] | None:
    """(username, password) from the environment, or None to fall back to credential files."""
    environ = os.environ if environ is None else environ
    for prefix in ("SHIPYARD_REGISTRY_", "APPTAINER_DOCKER_"):
        user, pw = environ.get(prefix + "USERNAME"), environ.get(prefix + "PASSWORD")
        if user and pw:
            return user, pw
    return None


def credential_files() -> list[str]:
    """Docker's and apptainer's credential files, those that exist."""
    home = Path.home()
    paths = [Path(os.environ.get("DOCKER_CONFIG", home / ".docker")) / "config.json",
             home / ".apptainer" / "docker-config.json"]
    return [str(p) for p in paths if p.is_file()]


# ----------------------------------------------------------------------------------------------- ORAS (SIF)


def _oras(target):
    """An oras registry client for ``target`` whose requests are not retried by oras itself (we retry)."""
    import oras.provider  # lazy: oras pulls in requests and jsonschema; only push/pull need it
    import requests.adapters  # lazy: with oras

    connect, read = timeouts()

    class TimeoutAdapter(requests.adapters.HTTPAdapter):
        """Every request of the session (oras's token requests included) gets the connect and read timeouts."""

        def send(self, request, **kwargs):
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = (connect, read)
            return super().send(request, **kwargs)

    class Client(oras.provider.Registry):
        def do_request(self, url, method="GET", data=None, headers=None, json=None, stream=False):
            if not _same_host(url, target.host):
                # e.g. an upload Location on another host: no credentials, no token, no auth dance there
                r = self.session.request(method, url, data=data, json=json, headers=dict(headers or {}),
                                         stream=stream, verify=self._tls_verify)
            else:
                try:
                    r = oras.provider.Registry.do_request.__wrapped__(self, url, method, data, headers, json, stream)
                except ValueError as exc:  # oras: "Cannot respond to request for authentication."
                    raise RegistryAuthError(f"{method} {url}: 401 Unauthorized ({_first_line(exc)}); set "
                                        "SHIPYARD_REGISTRY_USERNAME/SHIPYARD_REGISTRY_PASSWORD or log in "
                                        "(docker login)") from None
            if r.status_code in _RETRY_STATUS:  # oras would report these as assorted ValueErrors
                raise TransientRegistryError(f"{method} {url}: {r.status_code} {r.reason}")
            return r

    client = Client(hostname=target.host, insecure=target.insecure)
    for prefix in ("http://", "https://"):
        client.session.mount(prefix, TimeoutAdapter())
    creds = env_credentials()
    if creds:
        client.auth.set_basic_auth(*creds)
    else:
        client.auth._auth_config = {}
        from oras.auth import utils as auth_utils  # lazy: oras only for push/pull

        files = credential_files()
        if files:
            client.auth._auth_config = auth_utils.load_configs(files)
            client.auth._load_auth(target.host)
    return client


def reference(target, env_name: str, tag: str) -> str:
    """``HOST/REPO/ENV:TAG`` (no scheme)."""
    repo = f"{target.repository}/{env_name}" if target.repository else env_name
    return f"{target.host}/{repo}:{tag}"


def _manifest_bytes(client, ref: str, accept: str) -> tuple[bytes, str]:
    """The manifest as stored (raw bytes, so its digest can be recomputed) and the digest the registry reports."""
    container = client.get_container(ref)
    r = client.do_request(f"{client.prefix}://{container.manifest_url()}", "GET", headers={"Accept": accept})
    if r.status_code != 200:
        raise ValueError(f"GET manifest {ref}: {r.status_code} {r.reason}")
    return r.content, r.headers.get("Docker-Content-Digest", "")


def _verify_manifest(body: bytes, reported: str, ref: str, expect: str | None = None) -> str:
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if reported and reported != digest:
        raise ShipyardError(f"{ref}: registry reports digest {reported} but the manifest it serves hashes to {digest}")
    if expect and expect != digest:
        raise ShipyardError(f"{ref}: manifest digest {digest} differs from the pushed digest {expect}")
    return digest


def _patch_file_range(client, url: str, fh, offset: int, n: int) -> tuple[int, str, str]:
    """PATCH bytes ``offset..offset+n-1`` of ``fh`` to an upload session with ``socket.sendfile``: the kernel
    copies page cache to socket (zero-copy over plain HTTP), so memory stays flat and Python does not touch the
    bytes. Returns (status, Location, reason). Auth: the bearer token oras obtained when the session was opened."""

    u = urllib.parse.urlsplit(url)
    if u.scheme == "https":
        verify = client._tls_verify
        ctx = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
        if verify is False:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    connect, read = timeouts()
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, u.port, timeout=connect, context=ctx)
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=connect)
    try:
        conn.connect()
        if _CURRENT:
            _CURRENT[-1].add(conn.sock)
        conn.sock.settimeout(read)
        conn.putrequest("PATCH", u.path + (f"?{u.query}" if u.query else ""), skip_accept_encoding=True)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(n),
                   "Content-Range": f"{offset}-{offset + n - 1}"}
        token = getattr(client.auth, "token", None)
        if not _same_host(url, client.hostname):
            pass  # an upload Location on another host gets no credentials
        elif token:
            headers["Authorization"] = f"Bearer {token}"
        elif getattr(client.auth, "_basic_auth", None):
            headers["Authorization"] = f"Basic {client.auth._basic_auth}"
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.sock.sendfile(fh, offset, n)
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("Location", ""), resp.reason
    finally:
        conn.close()


def _expect(r, codes: tuple[int, ...], what: str):
    if r.status_code not in codes:
        raise ValueError(f"{what}: {r.status_code} {r.reason} {r.text[:200]}")
    return r


def upload_blob_streamed(client, container, path: Path, layer: dict, chunk: int | None = None) -> None:
    """OCI chunked blob upload (POST, one PATCH per chunk with Content-Range, PUT ?digest=) that sends each chunk
    straight from the file. Why not oras's own chunked_upload: it holds every chunk as bytes in Python and re-hashes
    the file, which ran at ~0.1x cp here; the digest is already in the build manifest (size/mtime-checked). oras
    still opens the session, authenticates, and uploads config and manifest."""
    chunk = chunk or CHUNK
    if client.blob_exists(layer, container):
        return
    base = f"{client.prefix}://{container.registry}"
    r = _expect(client.do_request(f"{client.prefix}://{container.upload_blob_url()}", "POST",
                                  headers={"Content-Length": "0"}), (202,), "start blob upload")
    location = client._get_location(r, container)
    size = layer["size"]
    with open(path, "rb") as fh:
        for offset in range(0, size, chunk):
            n = min(chunk, size - offset)
            url = location if location.startswith("http") else base + location
            status, loc, reason = _patch_file_range(client, url, fh, offset, n)
            if status in _RETRY_STATUS:
                raise TransientRegistryError(f"PATCH {url}: {status} {reason}")
            if status != 202:
                raise ValueError(f"upload bytes {offset}-{offset + n - 1}: {status} {reason}")
            location = loc or location
    sep = "&" if "?" in location else "?"
    url = location if location.startswith("http") else base + location
    _expect(client.do_request(f"{url}{sep}digest={layer['digest']}", "PUT", headers={"Content-Length": "0"}),
            (201,), "finish blob upload")


def push_sif(target, env_name: str, sif: Path, sha256: str, tag: str, annotations: dict,
             out: IO[str] | None) -> dict:
    """Push one SIF as an ORAS artifact (chunked, streamed), read the manifest back and check it."""
    import oras.oci  # lazy: oras only for push/pull

    ref = reference(target, env_name, tag)
    layer = {"mediaType": SIF_LAYER_MEDIA_TYPE, "digest": f"sha256:{sha256}", "size": sif.stat().st_size,
             "annotations": {"org.opencontainers.image.title": f"{env_name}.sif"}}

    def attempt() -> dict:
        client = _oras(target)
        container = client.get_container(ref)
        upload_blob_streamed(client, container, sif, layer)
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "config.json"
            config.write_text("{}")
            conf, _ = oras.oci.ManifestConfig(str(config), SIF_CONFIG_MEDIA_TYPE)
            _expect(client.upload_blob(str(config), container, conf), (200, 201, 202), "upload config")
        manifest = oras.oci.NewManifest()
        manifest.update(config=conf, layers=[layer], annotations=annotations)
        resp = _expect(client.upload_manifest(manifest, container), (201,), "upload manifest")
        pushed = resp.headers.get("Docker-Content-Digest", "")
        body, reported = _manifest_bytes(client, ref, OCI_MANIFEST)
        digest = _verify_manifest(body, reported, ref, pushed or None)
        layers = json.loads(body).get("layers", [])
        if len(layers) != 1 or any(layers[0].get(k) != layer[k] for k in ("digest", "size", "mediaType")):
            raise ShipyardError(f"{ref}: the registry's manifest does not describe our SIF "
                                f"(expected one layer {layer}, got {layers})")
        return {"reference": f"oras://{ref}", "digest": digest, "layer_digest": layer["digest"],
                "size": layer["size"], "pushed": _now()}

    return with_retries(f"push {ref}", attempt, out)


def pull_sif(target, env_name: str, tag: str, dest_tmp: Path, expect_digest: str | None, out: IO[str]) -> dict:
    """Download the SIF layer of ``ref`` into ``dest_tmp`` and verify manifest digest and blob sha256."""
    ref = reference(target, env_name, tag)

    def attempt() -> dict:
        client = _oras(target)
        body, reported = _manifest_bytes(client, ref, OCI_MANIFEST)
        digest = _verify_manifest(body, reported, ref, expect_digest)
        layers = [la for la in json.loads(body).get("layers", []) if la.get("mediaType") == SIF_LAYER_MEDIA_TYPE]
        if len(layers) != 1:
            raise ShipyardError(f"{ref}: not a SIF artifact (no single {SIF_LAYER_MEDIA_TYPE} layer)")
        layer = layers[0]
        client.download_blob(client.get_container(ref), layer["digest"], str(dest_tmp))
        got = "sha256:" + b.sha256_file(dest_tmp)
        if got != layer["digest"] or dest_tmp.stat().st_size != layer["size"]:
            raise ShipyardError(f"{ref}: downloaded blob hashes to {got}, the manifest says {layer['digest']}")
        made_by = (json.loads(body).get("annotations") or {}).get("org.shipyard.input-hash")
        return {"reference": f"oras://{ref}", "digest": digest, "layer_digest": layer["digest"], "pulled": _now(),
                "input_hash": made_by}

    return with_retries(f"pull {ref}", attempt, out)


# ----------------------------------------------------------------------------------------------- docker images


def _docker_auth() -> dict | None:
    creds = env_credentials()
    return {"username": creds[0], "password": creds[1]} if creds else None  # else: the SDK reads ~/.docker


def _stream_errors(stream, what: str) -> dict:
    aux: dict = {}
    for msg in stream:
        if _deadline_passed():
            raise TimeoutError(f"{what}: past the transfer deadline")
        if "error" in msg:
            raise ValueError(f"{what}: {msg['error']}")
        if isinstance(msg.get("aux"), dict):
            aux.update(msg["aux"])
    return aux


def push_image(target, env_name: str, image: dict, tag: str, out: IO[str]) -> dict:
    api = client()
    ref = reference(target, env_name, tag)
    repo = ref.rsplit(":", 1)[0]
    api.tag(image["id"], repo, tag)

    def attempt() -> dict:
        aux = _stream_errors(api.push(repo, tag=tag, stream=True, decode=True, auth_config=_docker_auth()),
                             f"push {ref}")
        body, reported = _registry_manifest(target, ref)
        digest = _verify_manifest(body, reported, ref, aux.get("Digest"))
        return {"reference": f"docker://{ref}", "digest": digest, "image_id": image["id"], "pushed": _now()}

    return with_retries(f"push {ref}", attempt, out)


def _registry_manifest(target, ref: str) -> tuple[bytes, str]:
    """Read a docker image manifest straight from the registry (not from the daemon that pushed it)."""
    return _manifest_bytes(_oras(target), ref, DOCKER_MANIFEST)


def pull_image(target, env_name: str, tag: str, expect_digest: str | None, out: IO[str]) -> dict:
    api = client()
    ref = reference(target, env_name, tag)
    repo = ref.rsplit(":", 1)[0]

    def attempt() -> dict:
        body, reported = _registry_manifest(target, ref)
        digest = _verify_manifest(body, reported, ref, expect_digest)
        _stream_errors(api.pull(repo, tag=tag, stream=True, decode=True, auth_config=_docker_auth()), f"pull {ref}")
        repo_digests = api.inspect_image(ref).get("RepoDigests", [])
        if f"{repo}@{digest}" not in repo_digests:
            raise ShipyardError(f"{ref}: the daemon pulled {repo_digests}, expected {repo}@{digest}")
        return {"reference": f"docker://{ref}", "digest": digest, "image_id": api.inspect_image(ref)["Id"],
                "pulled": _now()}

    return with_retries(f"pull {ref}", attempt, out)


# ----------------------------------------------------------------------------------------------- commands


@contextlib.contextmanager
def one_line(target, what: str, local_errors: bool = True):
    """Any registry, network, Docker or disk failure of ``what`` ends as one ShipyardError line (exit 2) naming the
    registry, the image and, where there was one, the HTTP status; never a traceback. ``local_errors=False``: a local
    OSError (the disk) propagates as it is, for a caller that says it as its own (stage: the storage)."""
    try:
        yield
    except ShipyardError:
        raise
    except OSError as exc:
        if not getattr(exc, "request", None) and not getattr(exc, "response", None) \
                and exc.__class__.__module__.split(".")[0] not in ("requests", "urllib3", "docker"):
            if not local_errors:
                raise
            raise ShipyardError(f"{what}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")) \
                from None
        raise ShipyardError(f"registry '{target.name}' ({target.host}): {what}: {_first_line(exc)}") from None
    except Exception as exc:  # requests, oras (ValueError), docker.errors, json: one line each
        raise ShipyardError(f"registry '{target.name}' ({target.host}): {what}: {_first_line(exc)}") from None


def push(reg, env, registry_name: str | None = None, tag: str | None = None,
         out: IO[str] | None = None) -> dict:
    """Push the environment ``env``'s SIF (``oras://`` registries) or docker image (``docker://``); record it in the
    manifest."""
    target = reg.registry_target(registry_name)
    mpath = project.manifest_path(reg, env.name)
    m = mf.read_manifest(mpath)
    if not m.built:
        state = f"the last build {m.status}" if m.status else "it was never built"
        raise ShipyardError(f"{mpath}: cannot push {env.name}: {state}; run `invoke build {env.name}` first")
    if target.require_signed:
        problem = signature_problem(reg, env.name)
        if problem:
            raise ShipyardError(f"registries.{target.name}: require_signed is true: {problem}")
    tag = check_tag(tag) if tag else m.input_hash[:12]
    annotations = {"org.opencontainers.image.title": env.name, "org.shipyard.input-hash": m.input_hash,
                   "org.shipyard.spec-sha256": m.spec_hash or "", "org.opencontainers.image.created":
                   m.finished or ""}
    if target.scheme == "oras":
        rec = m.artifact("sif")
        if not rec:
            raise ShipyardError(f"{mpath}: {env.name} has no SIF to push (docker-backend builds make one only where "
                                "apptainer exists); push the image to a docker:// registry instead")
        if not b.intact_or_signed(reg, env.name, m, "sif"):
            raise ShipyardError(f"{rec.path} changed since it was built (size/mtime differ from {mpath.name}); "
                                f"rebuild with `invoke build {env.name} --force`")
        rec = mf.read_manifest(mpath).artifact("sif")  # re-recorded if signing changed the file
        sif = Path(reg.root) / rec.path
        if not sif.resolve().is_relative_to(project.containers_dir(reg).resolve()):
            raise ShipyardError(f"{mpath}: the recorded SIF {rec.path} is not inside containers/; rebuild")
        b.check_sif(sif, "not a SIF image; rebuild it")
        what = f"push {reference(target, env.name, tag)}"
        with one_line(target, what), transfer_deadline(target, what):
            record = push_sif(target, env.name, sif, rec.sha256, tag, annotations, out)
    else:
        check_repository_name(env.name)
        image = m.image
        if not image:
            raise ShipyardError(f"{mpath}: {env.name} has no docker image (it was built with --backend apptainer); "
                                "push its SIF to an oras:// registry instead")
        what = f"push {reference(target, env.name, tag)}"
        with one_line(target, what), transfer_deadline(target, what):
            record = push_image(target, env.name, image, tag, out)
    record.update(registry=target.name, input_hash=m.input_hash)
    pushed = dict(m.pushed or {})
    pushed[target.name] = record
    mf.update_manifest(mpath, pushed=pushed)
    print(f"pushed {record['reference']} ({record['digest']}), verified by reading the manifest back", file=out)
    return record


def pull(reg, env, registry_name: str | None = None, tag: str | None = None,
         out: IO[str] | None = None, force: bool = False) -> dict:
    """Fetch the environment ``env``'s image from a registry and verify its digest (against the push record when there is one).

    A local SIF that differs from the pulled one is replaced only with ``force``. Afterwards the manifest describes
    the file on disk: its record, and the input hash the pushed artifact was built from (its
    ``org.shipyard.input-hash`` annotation), so `build` reuses it only for the same inputs and `push` tags it truly.
    """
    target = reg.registry_target(registry_name)
    mpath = project.manifest_path(reg, env.name)
    m = mf.read_manifest(mpath)
    known = m.pushed_to(target.name)
    if tag is None:
        if not known:
            raise ShipyardError(f"{mpath}: no push of {env.name} to registry '{target.name}' is recorded; "
                                "give the tag with --tag")
        tag = known.tag
    check_tag(tag)
    expect = known.digest_for(tag) if known else None
    root = Path(reg.root)
    what = f"pull {reference(target, env.name, tag)}"
    if target.scheme == "docker":
        check_repository_name(env.name)
        with one_line(target, what), transfer_deadline(target, what):
            record = pull_image(target, env.name, tag, expect, out)
    else:
        dest = project.artifact_path(reg, env.name, "sif")
        with b.build_lock(project.build_lock_path(root, env.name), out=out), one_line(target, what):
            b.recover_stale(reg, env.name, out)
            tmp = project.temp_path(dest)
            try:
                with transfer_deadline(target, what):
                    record = pull_sif(target, env.name, tag, tmp, expect, out)
                made_by = record.get("input_hash")
                if made_by is not None and not mf.is_input_hash(made_by):
                    # it becomes the manifest's input hash, then a push's tag and a part of its URL
                    raise ShipyardError(f"{record['reference']}: its org.shipyard.input-hash annotation "
                                        f"{str(made_by)[:80]!r} is not 64 lowercase hex digits (not pushed by "
                                        "shipyard, or changed since); nothing was written")
                b.check_sif(tmp, "the registry served no SIF image")
                if dest.exists() and not force and b.sha256_file(dest) != record["layer_digest"].split(":", 1)[1]:
                    raise ShipyardError(f"{dest.relative_to(root)} differs from {record['reference']}; keeping the "
                                        "local image (pull --force replaces it)")
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            artifacts = dict(mf.read_manifest(mpath).artifacts or {})
            artifacts["sif"] = b.file_record(root, dest)
            made_by = record.get("input_hash")
            mf.update_manifest(mpath, artifacts=artifacts, input_hash=made_by, status="ok" if made_by else "pulled",
                               error=None)
    record["registry"] = target.name
    pulled = dict(mf.read_manifest(mpath).pulled or {})
    pulled[target.name] = record
    with one_line(target, what):
        mf.update_manifest(mpath, environment=env.name, pulled=pulled)
    print(f"pulled {record['reference']} ({record['digest']}), digest verified", file=out)
    return record
