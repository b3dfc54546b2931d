"""`invoke stage` and `invoke build` through their commands, as the tests of staging and the real image use them."""

from __future__ import annotations

import io
from pathlib import Path

from shipyard import registry, runtimes
from shipyard.commands import containers as container_commands
from shipyard.commands import stage as stage_commands
from shipyard.commands.context import Context
from shipyard.registry.model import Registry
from shipyard.staging import record


def context(reg, out=None) -> Context:
    """A command's context for ``reg`` (a Registry, or a registry file loaded afresh as the CLI would)."""
    return Context(reg if isinstance(reg, Registry) else registry.load(reg), out=out or io.StringIO())


def build(reg, env: str, out=None, **flags) -> int:
    return container_commands.build(context(reg, out), env, **flags)


def stage(reg, env: str | None, cluster: str | None, out=None, **flags) -> record.StageRecord:
    """Stage through the command (exit 0 asserted); the record it left beside the image."""
    ctx = context(reg, out)
    assert stage_commands.stage(ctx, env, cluster, **flags) == 0
    where = ctx.cluster(cluster)
    image = runtimes.get(where.runtime).image(ctx.root, ctx.environment(env).name, where)
    rec, why = record.read_record(image)
    assert rec, why
    return rec


def storage(reg) -> Path:
    """The `lab` cluster's image storage of the staging tests' project (tests/staging/conftest.py)."""
    return Path(reg.cluster("lab").storage)
