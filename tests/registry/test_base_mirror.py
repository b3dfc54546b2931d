"""registry.yaml's base_mirror: the load-time checks (one line naming file:line and key) and the reference rewrite."""

from __future__ import annotations

import pytest
from helpers_registry import DATA

from shipyard import registry
from shipyard.containers.docker import daemon_allows_http
from shipyard.errors import ShipyardError
from shipyard.registry.model import BaseMirror

BASE = (DATA / "mirror.yaml").read_text()
MIRROR_BLOCK = "base_mirror:\n  url: mirror.example.org:5000/hub\n  insecure_http: true\n"


def _load(text: str):
    return registry.load_text(text, "registry.yaml")


@pytest.mark.parametrize("ref,want", [
    ("debian:12-slim", "m.example.org/hub/library/debian:12-slim"),
    ("nvidia/cuda:12.1.1-runtime-ubuntu22.04", "m.example.org/hub/nvidia/cuda:12.1.1-runtime-ubuntu22.04"),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "m.example.org/hub/nvcr.io/nvidia/pytorch:24.05-py3"),
    ("busybox@sha256:" + "a" * 64, "m.example.org/hub/library/busybox@sha256:" + "a" * 64),
])
def test_rewrite_keeps_path_tag_and_digest(ref, want):
    assert BaseMirror("m.example.org/hub").rewrite(ref) == want


def test_loaded_mirror_and_manifest_reference():
    reg = _load(BASE)
    assert reg.base_mirror == BaseMirror("mirror.example.org:5000/hub", insecure_http=True)
    env = reg.environment("debian12")
    assert env.base.value == "debian:12-slim"  # the environment keeps the reference registry.yaml names
    assert reg.base_reference(env) == "mirror.example.org:5000/hub/library/debian:12-slim"
    plain = _load(BASE.replace(MIRROR_BLOCK, ""))
    assert plain.base_mirror is None and plain.base_reference(plain.environment("debian12")) == "debian:12-slim"


@pytest.mark.parametrize("url", ["http://m.example.org", "https://m.example.org/hub", "user:pw@m.example.org",
                                 "m.example.org/Hub", "mirror", "m.example.org/hub/", "m.example.org:5000 /x",
                                 "m.example.org/%post", "m.example.org\n%post"])
def test_a_bad_mirror_url_is_one_line_naming_the_key(url):
    text = BASE.replace("url: mirror.example.org:5000/hub", f"url: {url!r}".replace("'", '"').replace("\n", "\\n"))
    with pytest.raises(ShipyardError) as err:
        _load(text)
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("registry.yaml:") and "base_mirror.url:" in msg
    assert "HOST[:PORT][/PREFIX]" in msg


def test_mirror_keys_are_checked():
    with pytest.raises(ShipyardError, match=r"base_mirror.insecure: unknown key 'insecure' \(did you mean 'insecure_http'\?\)"):
        _load(BASE.replace("insecure_http: true", "insecure: true"))
    with pytest.raises(ShipyardError, match=r"base_mirror.insecure_http: expected boolean"):
        _load(BASE.replace("insecure_http: true", "insecure_http: yes please"))
    with pytest.raises(ShipyardError, match=r"base_mirror: 'url' is required"):
        _load(BASE.replace("  url: mirror.example.org:5000/hub\n", ""))


def test_a_base_with_a_registry_port_cannot_be_mirrored():
    text = BASE.replace("base: nvcr.io/nvidia/pytorch", "base: registry.local:5000/nvidia/pytorch")
    with pytest.raises(ShipyardError) as err:
        _load(text)
    msg = str(err.value)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "registry.local:5000" in s)
    assert msg.startswith(f"registry.yaml:{line}: environments.ngc-base.base: registry.local:5000/nvidia/pytorch")
    assert "cannot serve under its name" in msg and len(msg.splitlines()) == 1
    _load(text.replace(MIRROR_BLOCK, ""))  # without a mirror: fine


def test_docker_daemon_http_rule():
    """What dockerd's GET /info says decides whether it pulls over plain HTTP (its insecure-registries)."""
    default = {"InsecureRegistryCIDRs": ["127.0.0.0/8", "::1/128"], "IndexConfigs": {}}
    assert daemon_allows_http(default, "127.0.0.1:5000")
    assert not daemon_allows_http(default, "10.0.0.5:5000")
    assert not daemon_allows_http(default, "m.example.org:5000")
    listed = {**default, "IndexConfigs": {"m.example.org:5000": {"Name": "m.example.org:5000", "Secure": False}}}
    assert daemon_allows_http(listed, "m.example.org:5000")
    assert daemon_allows_http({**default, "InsecureRegistryCIDRs": ["10.0.0.0/8"]}, "10.0.0.5:5000")
