"""`invoke stage --from registry` for a pyxis cluster, end to end on the sandbox with the real enroot: a docker image
pushed by the real dockerd (a Docker v2 schema 2 manifest) to the session's real plain-HTTP registry becomes a .sqsh
through ``enroot import docker://REGISTRY#REPO:TAG`` run as a Slurm job on the build partition, with
``ENROOT_ALLOW_HTTP=yes`` in that job only; the real pyxis then runs a 2-node step from the staged image.

The registry listens on the host's 127.0.0.1; the nodes reach it at the controller's address on the sandbox bridge
(``node_registry``: a forwarder inside the controller's network namespace), as compute nodes reach a site registry
at an address of their network. The image is the session's tiny base (busybox + python, about 30 MB): the import
path is what is tested here; the real torch image goes through ``--from docker`` in test_real_image.py."""

from __future__ import annotations

import io
import time

import pytest
from fixtures_build import build_project_at

import helpers_stage
from shipyard import registry
from shipyard.files import sha256_file

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.real_runtimes]


def test_stage_from_a_plain_http_docker_registry_with_real_enroot(
        sandbox, docker_services, tiny_base, node_registry, real_pyxis, tmp_path, monkeypatch):
    dockerd, regd = docker_services
    api = dockerd.client().api
    api.tag(tiny_base, f"{regd.address}/shipyard/tiny", "v1")
    pushed = [m for m in api.push(f"{regd.address}/shipyard/tiny", "v1", stream=True, decode=True)]
    assert not [m for m in pushed if "error" in m], pushed
    digest = next(m["aux"]["Digest"] for m in pushed if "aux" in m)

    # the project as the nodes see the registry: the controller's address, plain HTTP (insecure: true)
    root = build_project_at(tmp_path / "proj", node_registry.address)
    text = (root / "registry.yaml").read_text().replace("runtime: host", "runtime: pyxis", 1)
    (root / "registry.yaml").write_text(text)
    (root / ".sandbox" / "images").mkdir(parents=True)
    monkeypatch.chdir(root)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(root / "registry.yaml"))
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    reg = registry.load(root / "registry.yaml")

    out = io.StringIO()
    t0 = time.monotonic()
    rec = helpers_stage.stage(reg, "tiny", "sandbox", out=out, source="registry", registry="local-docker",
                              tag="v1", force=True)
    seconds = time.monotonic() - t0
    ref = f"docker://{node_registry.address}#shipyard/tiny:v1"
    assert f"enroot import of {ref} runs as job" in out.getvalue(), out.getvalue()
    assert node_registry.connections > 0, "the import never reached the registry through the nodes' address"
    script = (root / "containers" / "logs" / "tiny-stage.sbatch").read_text()
    assert "export ENROOT_ALLOW_HTTP=yes" in script
    sqsh = root / ".sandbox" / "images" / "tiny.sqsh"
    assert rec.source["kind"] == "registry" and rec.source["reference"] == ref, rec
    assert rec.sha256 == sha256_file(sqsh)
    with open(sqsh, "rb") as fh:
        assert fh.read(4) == b"hsqs"

    # the staged image runs on both nodes under the real pyxis: the pushed image's own python
    res = sandbox.run(["srun", "-N2", "--ntasks-per-node=1", f"--container-image={sqsh}",
                       "--no-container-mount-home", "sh", "-c", "echo $(hostname) $(command -v python3)"],
                      client_timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split("\n")[:-1]) == [f"{n} /usr/bin/python3" for n in sandbox.nodes], res.stdout
    print(f"\nstage --from registry (enroot import docker:// as a Slurm job, {digest[:19]}): {seconds:.1f} s")
