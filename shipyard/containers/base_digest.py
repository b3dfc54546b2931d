"""Resolve a base image's tag to the digest it names now (`invoke lock ENV`), through base_mirror or the registry
the reference names.

The OCI distribution API: ``HEAD /v2/<name>/manifests/<tag>`` with an Accept header listing the OCI image index,
the Docker manifest list and both single-image manifests, so a multi-platform tag answers with its index (the digest
``docker pull`` and Apptainer record, from which each picks its platform); the digest is the answer's
``Docker-Content-Digest``. A registry that gives no digest on HEAD is asked with GET, and the digest is the sha256 of
the manifest's bytes (checked against the header when it sends one). Why oras: push/pull's client already does the
token dance of Docker Hub and NGC and reads the same credentials (the environment, Docker's and Apptainer's files),
and its session carries the connect and read timeouts of shipyard/data/limits.yaml. The lookup as a whole runs under
``network.lookup_deadline_s``, retries included.

No registry answering (no network, a refused connection, the deadline, 5xx after the retries, a registry that wants
credentials it did not get) is not an error: the pin records the base as unpinned, with the reason, and
``invoke check`` warns. A tag the registry does not have (404), or a manifest whose bytes do not hash to the digest
the registry reports, is one error line: the build would fail on it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from shipyard.containers import push
from shipyard.definitions import base_pin
from shipyard.definitions.base_pin import BasePin
from shipyard.errors import ShipyardError
from shipyard.registry.model import Environment, Registry

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, push.OCI_MANIFEST, push.DOCKER_MANIFEST))
DOCKER_HUB = "registry-1.docker.io"  # the API host of Docker Hub, which a reference without a host names


@dataclass(frozen=True)
class Source:
    """Where a base reference is looked up: the attributes push's oras client and deadline read (``name``,
    ``host``, ``insecure``), and the repository and tag in that registry."""

    name: str
    host: str
    insecure: bool
    repository: str
    tag: str

    @property
    def words(self) -> str:
        return f"{self.name} {self.host}"


def _split(reference: str) -> tuple[str, str, str]:
    """``HOST/REPO[:TAG]`` -> (host, repo, tag); a reference whose first component is no host (no ``.`` or ``:``,
    not ``localhost``) is Docker Hub's, with ``library/`` for an official image's one-component name."""
    name = reference.split("@", 1)[0]
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = DOCKER_HUB, name if slash else f"library/{name}"
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
    else:
        tag = "latest"
    return host, path, tag


def source(reg: Registry, env: Environment) -> Source:
    """Where ``env``'s base is looked up: registry.yaml's base_mirror (as the build pulls it), else the registry its
    reference names."""
    mirror = reg.base_mirror
    if mirror:
        host, repo, tag = _split(mirror.rewrite(env.base.value or ""))
        return Source("base_mirror", host, mirror.insecure_http, repo, tag)
    host, repo, tag = _split(env.base.value or "")
    return Source("registry", host, False, repo, tag)


class _NoAnswer(Exception):
    """The registry did not answer with a manifest: the base stays unpinned, for this reason."""


def _lookup(src: Source) -> str:
    """The digest of ``src``'s tag (one HEAD, or a GET where the HEAD gives none)."""
    client = push._oras(src)
    url = f"{client.prefix}://{src.host}/v2/{src.repository}/manifests/{src.tag}"
    try:
        r = client.do_request(url, "HEAD", headers={"Accept": ACCEPT})
        reported = r.headers.get("Docker-Content-Digest", "") if r.status_code == 200 else ""
        if r.status_code == 200 and base_pin.DIGEST.match(reported):
            return reported
        if r.status_code in (200, 405):  # no digest on HEAD, or no HEAD at all: the manifest's own bytes
            r = client.do_request(url, "GET", headers={"Accept": ACCEPT})
    except push.RegistryAuthError:
        raise _NoAnswer(f"{src.words} wants credentials it did not get (SHIPYARD_REGISTRY_USERNAME/"
                        "SHIPYARD_REGISTRY_PASSWORD, or docker login)") from None
    if r.status_code == 404:
        raise ShipyardError(f"{src.words}: no manifest {src.repository}:{src.tag} (HTTP 404)")
    if r.status_code != 200:
        raise _NoAnswer(f"{src.words} answered HTTP {r.status_code}")
    reported = r.headers.get("Docker-Content-Digest", "")
    return push._verify_manifest(r.content, reported, f"{src.host}/{src.repository}:{src.tag}")


def resolve(reg: Registry, env: Environment, out: IO[str] | None = None) -> BasePin | None:
    """The pin of ``env``'s base to record in its lock: the digest its tag names now, or unpinned with the reason
    no registry gave one. None when the environment names no base. A reference that names a digest already is
    recorded as it is, with no lookup."""
    reference = env.base.value or ""
    if not reference:
        return None
    src = source(reg, env)
    given = base_pin.embedded_digest(reference)
    if given:
        return BasePin(reference, given, "the reference in registry.yaml")
    where = f"{src.words}, {src.repository}:{src.tag}"
    what = f"base image {reference}"
    dl = None
    try:
        with push.transfer_deadline(src, f"look up {what}", seconds=float(push._NET["lookup_deadline_s"])) as dl:
            digest = push.with_retries(f"look up {what}", lambda: _lookup(src), out)
    except _NoAnswer as exc:
        return BasePin(reference, None, where, str(exc))
    except ShipyardError as exc:
        if dl is not None and (dl.expired or dl.left() <= 0):
            return BasePin(reference, None, where, f"{src.words} did not answer within "
                           f"network.lookup_deadline_s ({push._NET['lookup_deadline_s']} s)")
        raise ShipyardError(f"environments.{env.name}.base {reference}: {exc}") from None
    except Exception as exc:  # requests' connection errors and timeouts after the retries, oras's ValueErrors
        if push.is_transient(exc):
            return BasePin(reference, None, where, f"no answer from {src.words} ({_kind(exc)})")
        raise ShipyardError(f"environments.{env.name}.base {reference}: {src.words}: {push._first_line(exc)}") \
            from None
    return BasePin(reference, digest, where)


def _kind(exc: BaseException) -> str:
    """What went wrong, in words that are the same every time (the lock records them: a relock with the same
    outcome writes the same bytes)."""
    import requests  # lazy: with oras

    if isinstance(exc, push.TransientRegistryError):
        return str(exc).rsplit(": ", 1)[-1]
    if isinstance(exc, (requests.Timeout, TimeoutError)):
        return "timed out"
    return "could not connect"
