"""The docker backend's client without an engine: the one line names where it looked, as the user set it."""

from __future__ import annotations

import docker
import pytest

from shipyard.containers import docker as backend
from shipyard.errors import ShipyardError


def _no_engine(*args, **kwargs):
    raise docker.errors.DockerException("Error while fetching server API version: connection refused")


@pytest.mark.parametrize(("value", "said"), [
    ("unix:///nope/docker.sock", "no Docker engine at DOCKER_HOST=unix:///nope/docker.sock ("),
    (None, "no Docker engine at /var/run/docker.sock (DOCKER_HOST is not set) ("),
])
def test_no_engine_names_the_place_it_tried(monkeypatch, value, said):
    if value is None:
        monkeypatch.delenv("DOCKER_HOST", raising=False)
    else:
        monkeypatch.setenv("DOCKER_HOST", value)
    monkeypatch.setattr(docker, "APIClient", _no_engine)
    with pytest.raises(ShipyardError) as err:
        backend.client()
    assert said in str(err.value) and "${" not in str(err.value)
