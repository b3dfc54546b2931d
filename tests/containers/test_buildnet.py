"""The host's CA bundle and proxy settings reach the downloading build steps and nothing else
(shipyard/containers/buildnet.py): which variables are taken, the env file under %post's `sh -x`, the apptainer
backend's bind (a real build with the real Apptainer), the docker backend's build context, and `os: debian12`'s facts
and refusals.

The real docker build behind a proxy and a private CA path is tests/containers/test_real_image.py."""

from __future__ import annotations

import json
import subprocess
import tarfile
import tempfile

import pytest
from fixtures_invoke import invoke_cli

from shipyard.containers import buildnet, docker
from shipyard.containers import manifest as mf
from shipyard.containers.common import copy_sources
from shipyard.definitions import recipe
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


@pytest.mark.real_apptainer
@pytest.mark.slow
def test_apptainer_build_binds_the_settings_and_keeps_them_out_of_log_manifest_and_image(real_project, monkeypatch,
                                                                                          tmp_path):
    """A real build (tests/containers/test_build_apptainer.py's `tiny`): the host's CA bundle and proxy reach %post
    through the /mnt bind (the base's apt-get stub says so, never their values); neither reaches the build log (whose
    %post runs under `sh -x`), the terminal, the manifest or the SIF; apptainer's argv holds no proxy password; the
    private directory is gone afterwards. Without settings there is no bind (the exact argv line in
    test_build_apptainer.py's first test)."""
    ca = tmp_path / "site-private-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setenv("TMPDIR", str(staging))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    monkeypatch.setenv("https_proxy", "http://alice:s3cret@proxy-value.invalid:3128")
    path = real_project.root / "registry.yaml"
    path.write_text(path.read_text().replace("    stack: base\n", "    stack: base\n    apt: [shipyard-test-exit-0]\n", 1))
    res = invoke_cli("build", "tiny", cwd=real_project.root, timeout=None)
    assert res.returncode == 0, res.stdout + res.stderr
    m = mf.read_manifest(real_project.root / "containers" / "tiny.json")
    log = (real_project.root / m.log).read_text()
    argv = next(line for line in log.splitlines() if line.startswith("$ apptainer build"))
    assert " --bind " in argv and argv.split(" --bind ")[1].split()[0].endswith(":/mnt") and "s3cret" not in argv
    assert "apt-get stub: https_proxy is set" in log and "apt-get stub: SSL_CERT_FILE is readable" in log
    assert "build network: the host's CA bundle and https_proxy passed" in log
    sif = real_project.root / "containers" / "tiny.sif"
    for text in (log, res.stdout, res.stderr, json.dumps(m.to_dict())):
        assert "proxy-value.invalid" not in text and "s3cret" not in text and str(ca) not in text
    assert b"proxy-value.invalid" not in sif.read_bytes()
    out = subprocess.run(["apptainer", "exec", str(sif), "ls", "-A", "/mnt"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == ""  # the bind is not packed into the SIF
    assert not list(staging.glob("shipyard-build-net-*")), "removed after the build"


def test_proxy_password_is_only_in_a_private_file_while_staged(tmp_path, monkeypatch):
    """The env file with a proxy's user:password was 0644 in a 0755 directory under $TMPDIR
    (failed on e0c4781). Now 0600 in 0700, and removed afterwards."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what $TMPDIR gives a new process
    net = buildnet.from_environ({"HTTPS_PROXY": "http://alice:s3cret@proxy.invalid:3128"})
    with buildnet.staged(net) as d:
        assert oct(d.stat().st_mode & 0o777) == "0o700"
        assert oct((d / "shipyard-build.env.sh").stat().st_mode & 0o777) == "0o600"
        assert d.parent == tmp_path
    assert not list(tmp_path.glob("shipyard-build-net-*")), "removed after the build"


def test_docker_build_context_holds_no_proxy_value(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("CA")
    net = buildnet.from_environ({"SSL_CERT_FILE": str(ca), "HTTPS_PROXY": "http://alice:s3cret@proxy.invalid:1"})
    with buildnet.staged(net, proxies=False) as d:
        text = (d / "shipyard-build.env.sh").read_text()
    assert "s3cret" not in text and "SSL_CERT_FILE" in text
    assert net.docker_buildargs() == {"HTTPS_PROXY": "http://alice:s3cret@proxy.invalid:1"}


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


@pytest.mark.parametrize("shell", ["dash", "bash", "busybox sh"])
def test_sourcing_the_env_file_keeps_values_out_of_an_xtrace(shell, tmp_path):
    """Apptainer runs %post under `sh -x`: the recipe's line that sources the env file traces none of its values,
    and the variables are set. The same line runs in a Dockerfile RUN (no trace there)."""
    ca = tmp_path / "ca.pem"
    ca.write_text("CA")
    s = buildnet.from_environ({"SSL_CERT_FILE": str(ca), "https_proxy": "http://u:s3cret@proxy.invalid:3128"})
    env, seen = tmp_path / "env.sh", tmp_path / "seen"
    env.write_text(s.env_text())
    [line] = recipe.build_network().commands
    line = line.replace(recipe.BUILD_NET_ENV, str(env))
    res = subprocess.run([*shell.split(), "-ex", "-c", f"{line}; env > {seen}; true after"], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert "https_proxy=http://u:s3cret@proxy.invalid:3128" in seen.read_text().splitlines()
    assert f"SSL_CERT_FILE={buildnet.CA_FILE}" in seen.read_text().splitlines()
    assert "proxy.invalid" not in res.stderr and "true after" in res.stderr  # traced, but not the values
