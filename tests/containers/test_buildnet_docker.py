"""Docker backend: a proxy's user:password is in no image of the daemon's store after a build,
not even the untagged intermediate image of the discarded download stage (its config, history and files). Failed
on e0c4781: the env file holding `export HTTPS_PROXY=...` was copied into that stage's layer.

The backend's own build step (DockerBackend._build_image) with a two-stage Dockerfile of the rendered shape."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from shipyard.containers import docker as dk

SECRET = "s3cret-f00d"
DOCKERFILE = """\
FROM {base} AS shipyard-download
COPY .shipyard-build/ /mnt/
RUN if [ -f /mnt/shipyard-build.env.sh ]; then . /mnt/shipyard-build.env.sh; fi; mkdir -p /opt/venv; echo ok > /opt/venv/x
FROM {base}
COPY --from=shipyard-download /opt/venv /opt/venv
RUN true
"""


class _Log:
    path = "log"

    def __init__(self):
        self.lines = []

    def write(self, line):
        self.lines.append(line)


@pytest.mark.docker
def test_no_proxy_password_in_any_image_of_the_daemon_after_a_docker_build(
        docker_services, debian12_base, tmp_path, monkeypatch):
    dockerd, _ = docker_services
    api = dockerd.client().api
    (tmp_path / "definitions").mkdir()
    (tmp_path / "definitions" / "n.Dockerfile").write_text(DOCKERFILE.format(base=debian12_base))
    ca = tmp_path / "ca.pem"
    ca.write_text("CA\n")
    for var in ("HTTP_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy",
                "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    monkeypatch.setenv("HTTPS_PROXY", f"http://alice:{SECRET}@proxy.invalid:3128")
    before = {i["Id"] for i in api.images(all=True)}
    backend = dk.DockerBackend()
    backend._api = api
    job = SimpleNamespace(root=tmp_path, reg=SimpleNamespace(root=tmp_path, base_mirror=None),
                          env=SimpleNamespace(name="n"), log=_Log())
    image_id = backend._build_image(job)
    new = [i["Id"] for i in api.images(all=True) if i["Id"] not in before]
    assert image_id in new and len(new) >= 2, "the discarded stage left an untagged image to check"
    for iid in new:
        text = json.dumps(api.inspect_image(iid)) + json.dumps(api.history(iid))
        assert SECRET not in text, f"the proxy password is in {iid}'s config or history"
        files = api.create_container(iid, ["/bin/sh", "-c", "cat /mnt/* 2>/dev/null; true"])
        try:
            api.start(files)
            api.wait(files, timeout=60)
            out = api.logs(files).decode()
        finally:
            api.remove_container(files, force=True)
        assert SECRET not in out, f"the proxy password is in a file of {iid}"
    assert SECRET not in "\n".join(job.log.lines)
