"""The host's CA bundle and proxy settings, for the build steps that download, and never for the image.

Why: behind a TLS-intercepting proxy or a private CA (this project's CI machine is one; HPC compute nodes often reach
package indexes only through a proxy) pip fails inside a build with "self-signed certificate in certificate chain"
unless it trusts the host's CA bundle, and nothing downloads at all without the proxy. Baking either into the image
would be wrong twice: the image would trust a site's private CA wherever it runs, and it would carry one site's proxy.

What is taken from the environment of ``invoke build`` (and of a ``build --slurm`` job, which sbatch gives the
submitter's environment by default): the CA bundle named by the first of ``SSL_CERT_FILE``, ``PIP_CERT``,
``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` that is a readable file, and the proxy variables ``HTTP(S)_PROXY``,
``NO_PROXY``, ``ALL_PROXY`` in either case.

How it reaches the build, per backend (nothing of it in the image, its labels, its history, the manifest or the log):

* Both: the definition's downloading steps begin with one line that sources :data:`ENV_FILE` *if it exists*. That
  file and a copy of the CA bundle are written into a private temp directory (0700, files 0600) that exists only
  while the build runs.
* apptainer: ``apptainer build --bind TMPDIR:/mnt``. A bind mount is not part of the root filesystem apptainer packs
  into the SIF; ``/mnt`` is used because apptainer needs a bind target to exist in the image before ``%post`` and
  every Debian/Ubuntu base has it (empty).
* docker (the classic builder the Engine API offers has no build secrets or ``RUN --mount``): the temp directory is
  sent in the build context and copied only into a *discarded* first stage, which installs the Python environment
  (``/opt/venv``); the final stage copies ``/opt/venv`` from it and never sees the CA or the file. That first stage
  stays in the daemon's store as an untagged image, so its file holds the CA only, never a proxy value. Proxy
  variables go as Docker's predefined proxy build arguments, which Docker keeps out of ``docker history`` and the
  images' config and reaches to every ``RUN`` of both stages (apt in the final stage uses them).

Limits: with the docker backend, apt sources over https (the deadsnakes PPA, a site's https mirror) in the final stage
see the proxy but not the private CA; ``stack: base`` environments install into the base image's Python in one stage
and get the proxy only. Debian's and Ubuntu's own mirrors are plain http (apt checks their signatures itself).
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from shipyard.definitions.recipe import BUILD_NET_CA, BUILD_NET_ENV, BUILD_NET_MOUNT
from shipyard.definitions.render import BUILD_NET_CONTEXT

# where the settings appear inside the build (bind target / the discarded stage's copy): the recipe's constants
MOUNT, ENV_FILE, CA_FILE = BUILD_NET_MOUNT, BUILD_NET_ENV, BUILD_NET_CA
CONTEXT_DIR = BUILD_NET_CONTEXT  # its name in the docker build context (never a project file)
CA_VARS = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


@dataclass(frozen=True)
class Settings:
    ca_bundle: Path | None
    proxies: tuple[tuple[str, str], ...]  # (NAME, value), NAME as the host spelled it

    def __bool__(self) -> bool:
        return bool(self.ca_bundle or self.proxies)

    def describe(self) -> str:
        """For the build log: which settings were passed, by variable name only (values stay out of logs)."""
        what = []
        if self.ca_bundle:
            what.append("the host's CA bundle")
        if self.proxies:
            what.append(", ".join(name for name, _ in self.proxies))
        return "build network: " + " and ".join(what) + " passed to the downloading steps only (not kept in the image)"

    def env_text(self, proxies: bool = True) -> str:
        """The file %post sources. ``proxies=False`` (docker: they go as build arguments) leaves the proxy values
        out, so nothing of a ``user:password@`` proxy is in the build context or the discarded stage's layers."""
        lines = ["# written by shipyard for one build; never part of the image"]
        if self.ca_bundle:
            lines.append("export " + " ".join(f"{v}={CA_FILE}" for v in CA_VARS))
        for name, value in self.proxies if proxies else ():
            lines.append(f"export {name}={shlex.quote(value)}")
        return "\n".join(lines) + "\n"

    def docker_buildargs(self) -> dict[str, str]:
        """Docker's predefined proxy build arguments (kept out of the image's history unless a Dockerfile declares
        them with ARG, which ours never do)."""
        return {name: value for name, value in self.proxies}


def from_environ(environ: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    ca = None
    for var in CA_VARS:
        path = environ.get(var)
        if path and os.path.isfile(path) and os.access(path, os.R_OK):
            ca = Path(path)
            break
    proxies = []
    for var in PROXY_VARS:
        for name in (var, var.lower()):
            if environ.get(name):
                proxies.append((name, environ[name]))
    return Settings(ca, tuple(proxies))


@contextmanager
def staged(settings: Settings, proxies: bool = True) -> Iterator[Path]:
    """A private temp directory holding the env file and the CA copy (when there are settings), removed after.

    The directory is 0700 and every file in it 0600 from its creation (``O_EXCL``): the env file may hold a proxy's
    ``user:password``, and ``$TMPDIR`` is often shared. The readers are the user's own processes: apptainer (as the
    user, or its fakeroot namespace whose root is the user) and shipyard's own tar of the docker build context.
    ``proxies=False``: the proxy values are left out of the file (docker passes them as build arguments)."""
    d = Path(tempfile.mkdtemp(prefix="shipyard-build-net-"))  # 0700
    try:
        if settings:
            if settings.ca_bundle:
                _write_private(d / Path(CA_FILE).name, settings.ca_bundle.read_bytes())
            _write_private(d / Path(ENV_FILE).name, settings.env_text(proxies).encode("utf-8"))
        else:
            _write_private(d / "none", b"no build network settings\n")
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
