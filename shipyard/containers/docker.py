"""The docker backend: Dockerfile from the same recipe as the .def, built through the Docker Engine API.

Why the ``docker`` SDK (low-level ``APIClient``) rather than the ``docker`` CLI: it streams the build as structured
messages (lines, errors, the image ID), so progress goes to the log and failures are detected without parsing CLI
text, and it honours ``DOCKER_HOST`` exactly like the CLI does.

Atomicity: the image is built *untagged*; the %test equivalent (definitions/ENV.test.sh, copied into the image) runs
in a throw-away container with no network; only then is the deterministic tag ``shipyard/ENV:<input hash[:12]>``
set. A build that is killed or fails therefore never leaves that tag on a partial or untested image. The .sif and
.sqsh come from the tagged image, through the same temp-file-and-rename path as every other artifact.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import os
import re
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

from shipyard import project
from shipyard.containers import buildnet, contents, oci_layout
from shipyard.containers.common import (
    Job,
    ShipyardError,
    check_sif,
    copy_sources,
    run_streaming,
    tool_version,
)
from shipyard.definitions import render as definitions
from shipyard.definitions.render import TEST_PATH

# Formats beyond the docker image, and the tool that makes each from it.
FORMAT_TOOLS = {"sif": "apptainer", "sqsh": "enroot"}
# Docker's (the distribution reference's) grammar of one repository path component: lowercase alphanumerics
# separated by one '.', one or two '_', or any run of '-'. The registry schema's environment names are wider
# (``a..b``, ``a_``), which only the docker backend and docker:// registries cannot name.
_REPO_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_{1,2}|-+)[a-z0-9]+)*")


def check_repository_name(env_name: str) -> str:
    """``env_name`` as a docker repository component (``shipyard/ENV``, ``HOST/REPO/ENV``), or one line saying why
    not and what would be valid."""
    if not _REPO_COMPONENT.fullmatch(env_name):
        raise ShipyardError(f"environments.{env_name}: docker cannot name an image after this environment (its "
                            "names are lowercase letters and digits joined by one '.', one or two '_' or '-'s: no "
                            "'..', no '_' or '.' at the end); rename it, or build with --backend apptainer")
    return env_name
_WHY = {"sif": "the apptainer runtime needs it", "sqsh": "pyxis launchers use it"}


def client(timeout: int = 3600):
    """A low-level Docker API client for $DOCKER_HOST (or the default socket); a clear error when none answers."""
    import docker  # lazy: the Docker SDK (~0.2 s) only for the docker backend

    try:  # DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH, as the docker CLI reads them
        api = docker.APIClient(timeout=timeout, version="auto", **docker.utils.kwargs_from_env())
    except docker.errors.DockerException as exc:
        where = f"DOCKER_HOST={os.environ['DOCKER_HOST']}" if os.environ.get("DOCKER_HOST") else \
            "/var/run/docker.sock (DOCKER_HOST is not set)"
        raise ShipyardError(f"docker backend: no Docker engine at {where} "
                            f"({str(exc).splitlines()[0][:160]}); start dockerd or set DOCKER_HOST") from None
    return api


def context_tar(root: Path, paths: list[str], net_dir: Path | None = None) -> tempfile.SpooledTemporaryFile:
    """The build context as a tar holding only what the Dockerfile uses (never the whole project: containers/ holds
    multi-GB images), plus the build-network directory (``net_dir``, as ``.shipyard-build/``) that only the
    discarded download stage copies. Spooled: small contexts stay in memory, large ones go to disk."""
    buf = tempfile.SpooledTemporaryFile(max_size=64 << 20)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in paths:
            src = root / rel
            if not src.exists():
                raise ShipyardError(f"docker build context: {rel} does not exist under {root}")
            tar.add(src, arcname=rel, recursive=True)
        if net_dir is not None:
            tar.add(net_dir, arcname=buildnet.CONTEXT_DIR, recursive=True)
    buf.seek(0)
    return buf


def daemon_allows_http(registry_config: dict, host: str) -> bool:
    """Whether a Docker engine with this ``RegistryConfig`` (``GET /info``) pulls from ``host`` (HOST[:PORT]) over
    plain HTTP: the host is an insecure index, or its address is in an insecure CIDR (127.0.0.0/8 always is)."""
    index = (registry_config.get("IndexConfigs") or {}).get(host)
    if index is not None and index.get("Secure") is False:
        return True
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(c, strict=False) for c in registry_config.get("InsecureRegistryCIDRs") or ())


class DockerBackend:
    name = "docker"

    def __init__(self):
        self._api = None

    @property
    def api(self):
        if self._api is None:
            self._api = client()
        return self._api

    def preflight(self) -> None:
        try:
            self.api.ping()
        except Exception as exc:  # docker raises several unrelated types for "nobody is listening"
            raise ShipyardError(f"docker backend: the Docker engine at {self.api.base_url} does not answer "
                                f"({str(exc).splitlines()[0][:160]}); start dockerd or set DOCKER_HOST") from None

    def inputs(self, reg, env) -> dict[Path, str]:
        return {project.dockerfile_path(reg, env.name): definitions.render_dockerfile(env, reg),
                project.test_script_path(reg, env.name): definitions.render_test_script(env, reg)}

    def sources(self, inputs: dict[Path, str]) -> list[str]:
        return [src for p, t in inputs.items() if p.suffix == ".Dockerfile" for src in copy_sources(t, "docker")]

    def tools(self, formats) -> dict[str, str]:
        tools = {"docker": "docker engine " + self.api.version().get("Version", "?")}
        for fmt in formats:
            tool = FORMAT_TOOLS[fmt]
            tools[tool] = tool_version(tool) if shutil.which(tool) else "missing"
        return tools

    def still_there(self, m) -> bool:
        try:
            return self.api.inspect_image(m.docker_tag)["Id"] == m.docker_id
        except Exception:
            return False

    # -------------------------------------------------------------------------------------------- build steps

    def _check_mirror(self, mirror) -> None:
        """A plain-HTTP base_mirror works only when the daemon lists it in its insecure-registries (the daemon
        decides, not the client): refuse before the build rather than fail in the middle of its pull."""
        if mirror is None or not mirror.insecure_http:
            return
        cfg = self.api.info().get("RegistryConfig") or {}
        if not daemon_allows_http(cfg, mirror.host):
            raise ShipyardError(f"base_mirror {mirror.url}: insecure_http is set, but the Docker engine at "
                                f"{self.api.base_url} does not list {mirror.host} in its insecure-registries; add it "
                                "to the daemon's daemon.json and restart dockerd, or serve the mirror over HTTPS")

    def _build_image(self, job: Job) -> str:
        self._check_mirror(job.reg.base_mirror)
        root = job.root
        path = project.dockerfile_path(job.reg, job.env.name)
        dockerfile = str(path.relative_to(root))
        net = buildnet.from_environ()
        if net:
            job.log.write(net.describe())
        network = os.environ.get("SHIPYARD_DOCKER_NETWORK") or None
        with buildnet.staged(net, proxies=False) as net_dir:  # proxies go as build arguments
            ctx = context_tar(root, [dockerfile] + copy_sources(path.read_text(encoding="utf-8"), "docker"), net_dir)
        image_id = None
        try:
            # proxies as Docker's predefined build arguments: every RUN sees them, `docker history` does not
            stream = self.api.build(fileobj=ctx, custom_context=True, dockerfile=dockerfile, rm=True, forcerm=True,
                                    pull=False, decode=True, buildargs=net.docker_buildargs() or None,
                                    network_mode=network)
            for msg in stream:
                if "stream" in msg:
                    for line in msg["stream"].splitlines():
                        if line.strip():
                            job.log.write(line)
                if "error" in msg:
                    raise ShipyardError(f"docker build of {job.env.name} failed: {msg['error'].strip()[:300]}; "
                                        f"full output in {job.log.path}")
                if isinstance(msg.get("aux"), dict) and "ID" in msg["aux"]:
                    image_id = msg["aux"]["ID"]
        finally:
            ctx.close()
        if not image_id:
            raise ShipyardError(f"docker build of {job.env.name} reported no image ID; see {job.log.path}")
        return image_id

    def _run_test(self, job: Job, image_id: str) -> None:
        """The %test equivalent: the rendered test script, run by /bin/sh in the built image (as apptainer runs
        %test), without network. A non-zero exit fails the build before anything is tagged."""

        job.log.write(f"$ %test: /bin/sh {TEST_PATH} in {image_id[:19]}")
        cid = self.api.create_container(image_id, ["/bin/sh", TEST_PATH], network_disabled=True,
                                        host_config=self.api.create_host_config(network_mode="none"))["Id"]
        try:
            self.api.start(cid)
            for chunk in self.api.logs(cid, stream=True, follow=True):
                for line in chunk.decode(errors="replace").splitlines():
                    job.log.write(line)
            rc = self.api.wait(cid).get("StatusCode", 1)
        finally:
            self._remove(cid)
        if rc != 0:
            raise ShipyardError(f"%test failed in the built image of {job.env.name} (exit {rc}); the image was "
                                f"not tagged; full output in {job.log.path}")

    def _remove(self, cid: str) -> None:
        """Remove a container of ours, running or not; a failure here must not hide the result it produced."""
        try:
            self.api.remove_container(cid, force=True)
        except Exception:
            pass

    def probe(self, reg, env, extra: dict) -> contents.Contents:
        """The contents record, read in a container of the image just built (no network), and its labels from the
        engine's inspect (a docker image has no labels file inside)."""
        image_id = extra["image"]["id"]
        cid = self.api.create_container(image_id, ["/bin/sh", "-c", contents.probe_script()], network_disabled=True,
                                        host_config=self.api.create_host_config(network_mode="none"))["Id"]
        try:
            self.api.start(cid)
            rc = self.api.wait(cid, timeout=contents.settings()["probe_timeout_s"]).get("StatusCode", 1)
            out = self.api.logs(cid, stdout=True, stderr=False).decode(errors="replace")
        finally:
            self._remove(cid)
        if rc != 0:
            raise ShipyardError(f"contents probe: the container of {image_id[:19]} exited {rc}")
        labels = (self.api.inspect_image(image_id).get("Config") or {}).get("Labels") or {}
        return contents.parse_probe(out, "docker run", labels={str(k): str(v) for k, v in labels.items()})

    def _sif(self, job: Job, rel: str, target: Path) -> None:
        """``apptainer build REL oci:LAYOUT`` from the tagged image, saved as an OCI layout with uncompressed layers
        (:mod:`shipyard.containers.oci_layout`: why not ``docker-daemon://``) where Apptainer keeps its own
        temporary files, and removed after.

        The layout's name starts with a hash of ``target`` (the SIF it is for). This runs under that environment's
        build lock, so a layout of that name is what a killed build of it left (GBs in a shared /tmp): removed
        first, when it is a folder of this user's and no symlink."""
        where = Path(os.environ.get("APPTAINER_TMPDIR") or tempfile.gettempdir())
        prefix = f"shipyard-oci-{hashlib.sha256(str(target).encode()).hexdigest()[:16]}-"
        for old in where.glob(prefix + "*"):
            try:
                st = old.lstat()
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                shutil.rmtree(old, ignore_errors=True)
                job.log.write(f"sif: removed {old}, the OCI layout a killed build of {target.name} left")
        with tempfile.TemporaryDirectory(prefix=prefix, dir=where) as layout:
            try:
                saved = oci_layout.write_layout(self.api.get_image(job.tag), Path(layout), job.tag.rsplit(":", 1)[1])
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise ShipyardError(f"sif: {exc.filename or layout}: {exc.strerror} while saving {job.tag} as an "
                                    "OCI layout for `apptainer build` (it needs about the image's size); set "
                                    "APPTAINER_TMPDIR to a folder on a larger disk") from None
            job.log.write(f"sif: {job.tag} saved as an OCI layout ({saved['layers']} layers, "
                          f"{saved['bytes'] / 2**30:.2f} GiB uncompressed, each checked against the image's "
                          "diff_ids)")
            run_streaming(["apptainer", "build", rel, f"oci:{layout}"], job.log, cwd=job.root)

    def run(self, job: Job) -> tuple[dict[str, Path], dict]:
        image_id = self._build_image(job)
        self._run_test(job, image_id)
        repo, tag = job.tag.rsplit(":", 1)
        self.api.tag(image_id, repo, tag)
        job.log.write(f"tagged {job.tag} ({image_id[:19]})")
        temps: dict[str, Path] = {}
        try:
            for fmt in job.formats:
                tool = FORMAT_TOOLS[fmt]
                if not shutil.which(tool):
                    job.log.write(f"{fmt}: skipped: {tool} is not on PATH (containers/{job.env.name}.{fmt}: "
                                  f"{_WHY[fmt]}; build where {tool} exists)")
                    continue
                tmp = project.temp_path(project.artifact_path(job.reg, job.env.name, fmt))
                temps[fmt] = tmp
                rel = str(tmp.relative_to(job.root))
                if fmt == "sif":
                    self._sif(job, rel, project.artifact_path(job.reg, job.env.name, fmt))
                    check_sif(tmp)
                else:
                    run_streaming(["enroot", "import", "-o", rel, f"dockerd://{job.tag}"], job.log, cwd=job.root)
        except BaseException:
            for t in temps.values():
                t.unlink(missing_ok=True)
            raise
        return temps, {"image": {"tag": job.tag, "id": image_id}}
