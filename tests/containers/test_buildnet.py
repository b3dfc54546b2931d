"""The host's CA bundle and proxy settings reach the downloading build steps and nothing else
(shipyard/containers/buildnet.py): which variables are taken, the apptainer backend's bind (checked by the strict
apptainer double), the docker backend's build context, and `os: debian12`'s facts and refusals.

The real docker build behind a proxy and a private CA path is tests/containers/test_real_image.py."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from fixtures_build import read_calls

from shipyard.containers import buildnet, docker
from shipyard.containers import engine as b
from shipyard.containers.common import copy_sources
from shipyard.definitions import render as definitions
from shipyard.registry import load_text as loads
from shipyard.registry.compat import check_all as registry_check


def test_settings_take_the_first_readable_ca_and_every_proxy_spelling(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    s = buildnet.from_environ({"SSL_CERT_FILE": str(tmp_path / "missing.pem"), "PIP_CERT": str(ca),
                               "https_proxy": "http://u:p w@proxy.invalid:3128", "NO_PROXY": "localhost"})
    assert s.ca_bundle == ca
    assert s.proxies == (("https_proxy", "http://u:p w@proxy.invalid:3128"), ("NO_PROXY", "localhost"))
    text = s.env_text()
    # the value is shell-quoted; every CA variable points at the mounted copy, never at the host path
    assert "export https_proxy='http://u:p w@proxy.invalid:3128'" in text
    assert str(ca) not in text and f"PIP_CERT={buildnet.CA_FILE}" in text
    # the log line names variables, never values
    assert "proxy.invalid" not in s.describe() and "https_proxy, NO_PROXY" in s.describe()
    assert not buildnet.from_environ({})


def test_staged_directory_holds_the_files_and_is_removed(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("CA")
    with buildnet.staged(buildnet.from_environ({"SSL_CERT_FILE": str(ca)})) as d:
        assert (d / "shipyard-build-ca.pem").read_text() == "CA"
        assert (d / "shipyard-build.env.sh").is_file()
    assert not d.exists()


def test_apptainer_build_binds_the_settings_and_keeps_them_out_of_manifest_and_log(
        project, apptainer_double, tmp_path, monkeypatch):
    ca = tmp_path / "site-private-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy-value.invalid:3128")
    m = b.build(project, project.environment("tiny"), out=io.StringIO())
    build = [c for c in read_calls(apptainer_double) if c["argv"][0] == "build"][0]
    # the double checked the bind: DIR:/mnt holding the env file (export lines only) and the CA copy it names,
    # and a definition whose %post sources it
    assert build["argv"][1] == "--bind" and build["argv"][2].endswith(":/mnt")
    assert build["net_ca"] is True and "HTTPS_PROXY" in build["net_env"] and "SSL_CERT_FILE" in build["net_env"]
    log = (project.root / m.log).read_text()
    for text in (log, json.dumps(m.to_dict())):
        assert str(ca) not in text and "proxy-value.invalid" not in text
    assert "build network: the host's CA bundle and HTTPS_PROXY passed" in log


def test_proxy_password_is_only_in_a_private_file_during_an_apptainer_build(
        project, apptainer_double, tmp_path, monkeypatch):
    """Issue 19, security 5: the env file with a proxy's user:password was 0644 in a 0755 directory under $TMPDIR
    (failed on e0c4781). Now 0600 in 0700, never in apptainer's argv, and removed after the build."""
    monkeypatch.setenv("HTTPS_PROXY", "http://alice:s3cret@proxy.invalid:3128")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    b.build(project, project.environment("tiny"), out=io.StringIO())
    build = [c for c in read_calls(apptainer_double) if c["argv"][0] == "build"][0]
    assert build["net_modes"] == {".": "0o700", "shipyard-build.env.sh": "0o600"}
    assert not any("s3cret" in a for a in build["argv"])
    assert not list(tmp_path.glob("shipyard-build-net-*")), "removed after the build"


def test_docker_build_context_holds_no_proxy_value(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("CA")
    net = buildnet.from_environ({"SSL_CERT_FILE": str(ca), "HTTPS_PROXY": "http://alice:s3cret@proxy.invalid:1"})
    with buildnet.staged(net, proxies=False) as d:
        text = (d / "shipyard-build.env.sh").read_text()
    assert "s3cret" not in text and "SSL_CERT_FILE" in text
    assert net.docker_buildargs() == {"HTTPS_PROXY": "http://alice:s3cret@proxy.invalid:1"}


def test_apptainer_build_without_settings_passes_no_bind(project, apptainer_double):
    b.build(project, project.environment("tiny"), out=io.StringIO())
    build = [c for c in read_calls(apptainer_double) if c["argv"][0] == "build"][0]
    assert "--bind" not in build["argv"] and "bind" not in build


def test_docker_context_carries_the_settings_only_under_their_own_directory(tmp_path):
    (tmp_path / "definitions").mkdir()
    (tmp_path / "definitions" / "x.Dockerfile").write_text("FROM scratch\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("CA")
    with buildnet.staged(buildnet.from_environ({"SSL_CERT_FILE": str(ca)})) as d:
        ctx = docker.context_tar(tmp_path, ["definitions/x.Dockerfile"], d)
    names = tarfile.open(fileobj=ctx).getnames()
    assert sorted(names) == [".shipyard-build", ".shipyard-build/shipyard-build-ca.pem",
                             ".shipyard-build/shipyard-build.env.sh", "definitions/x.Dockerfile"]


def test_copy_sources_skip_the_download_stage_and_the_settings_directory():
    text = ("FROM b AS shipyard-download\nCOPY definitions/e.lock /opt/shipyard/e.lock\nCOPY .shipyard-build/ /mnt/\n"
            "FROM b\nCOPY --from=shipyard-download /opt/venv /opt/venv\nCOPY definitions/e.test.sh /t\n")
    assert copy_sources(text, "docker") == ["definitions/e.lock", "definitions/e.test.sh"]


DEBIAN = """\
environments:
  d:
    torch: "2.3.1"
    cuda: "12.1"
    python: "{python}"
    os: debian12
clusters:
  c: {{runtime: host, fabric: socket, gpus_per_node: 0, scheduler: {{partition: p}}}}
"""


def test_debian12_bootstraps_from_debian_and_installs_its_own_python():
    reg = loads(DEBIAN.format(python="3.11"))
    env = reg.environment("d")
    assert env.base.value == "debian:12-slim" and not env.base_is_cuda_image
    assert [p for p in registry_check(reg) if p.environment == "d"] == []  # no "not an nvidia/cuda tag" warning
    dockerfile = definitions.render_dockerfile(env)
    assert "FROM debian:12-slim AS shipyard-download" in dockerfile
    assert "deadsnakes" not in dockerfile and "python3.11-venv" in dockerfile


@pytest.mark.parametrize("python", ["3.10", "3.12"])
def test_debian12_refuses_a_python_it_does_not_ship(python):
    problems = [p for p in registry_check(loads(DEBIAN.format(python=python))) if p.severity == "ERROR"]
    assert [p.key for p in problems] == ["environments.d.python"]
    assert "debian12 ships Python 3.11 only" in problems[0].message
