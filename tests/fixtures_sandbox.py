"""The ``sandbox`` fixture: one real local 2-node Slurm cluster per test session, for every area's integration tests.

It is real Slurm (slurmctld, one slurmd per node, munged), started by :func:`shipyard.sandbox.up`. Use it as::

    def test_submit(sandbox):
        res = sandbox.run(["sbatch", "--parsable", str(script)])   # a CompletedProcess (text, captured)
        assert res.returncode == 0, res.stderr

The fixture reuses a sandbox already running in ``$SHIPYARD_SANDBOX_DIR`` (and then leaves it running); otherwise it
starts one in a fresh directory under /tmp and always stops it at the end of the session, even after failures.
It skips only where the sandbox cannot run at all (not root, not Debian/Ubuntu), with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pytest

ROOT = Path(__file__).resolve().parent.parent

@dataclass
class SandboxHandle:
    """What a test gets: the sandbox's directory, its node names, and a way to run Slurm clients against it."""

    directory: Path
    nodes: list[str]
    info: dict = field(repr=False)

    def run(self, argv: Sequence[str], client_timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
        """Run a Slurm client (sbatch, srun, squeue, ...) against the sandbox; output captured as text by default."""
        from shipyard import sandbox

        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return sandbox.run_client(argv, self.directory, client_timeout, **kwargs)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """The wrapped argv (see :func:`shipyard.sandbox.client_argv`), for tests that run it themselves."""
        from shipyard import sandbox

        return sandbox.client_argv(argv, self.directory)

    def env(self) -> dict[str, str]:
        from shipyard import sandbox

        return sandbox.client_env(self.directory)


def sandbox_skip_reason() -> str | None:
    from shipyard import sandbox

    return sandbox.cannot_run_reason()


@pytest.fixture(scope="session")
def sandbox():
    """A running 2-node sandbox (see the module docstring)."""
    from shipyard import registry
    from shipyard import sandbox as sb

    reason = sandbox_skip_reason()
    if reason:
        pytest.skip(reason)
    preset = os.environ.get(sb.DIR_ENV)
    if preset:
        directory = Path(preset)
    else:
        # Under /tmp, not pytest's 0700 basetemp: munged runs as user munge and must reach its socket directory.
        directory = Path(tempfile.mkdtemp(prefix="shipyard-sandbox-"))
        directory.chmod(0o755)
    started = not sb.is_up(directory)
    try:
        # The project's own registry (not whatever the current directory or $SHIPYARD_REGISTRY holds): the shape
        # every area's integration tests expect, 2 nodes x 2 fake GPUs.
        info = sb.up(directory=directory, cluster=registry.load(ROOT / "registry.yaml").sandbox_cluster())
        yield SandboxHandle(directory, [n["name"] for n in info["nodes"]], info)
    finally:
        if started:
            sb.down(directory)
            if not preset:
                shutil.rmtree(directory, ignore_errors=True)
