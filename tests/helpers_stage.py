"""`invoke stage` and `invoke build` through their commands, as the tests of staging and the real image use them."""

from __future__ import annotations

import io
import re
from pathlib import Path

from shipyard import registry, runtimes
from shipyard.commands import containers as container_commands
from shipyard.commands import stage as stage_commands
from shipyard.commands.context import Context
from shipyard.errors import ShipyardError
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
    try:
        code = stage_commands.stage(ctx, env, cluster, **flags)
    except ShipyardError as e:  # the error as it is (tests match it), with what the command said and the job's log
        if hasattr(e, "add_note"):  # Python 3.11+
            e.add_note(_what_it_said(ctx))
        raise
    assert code == 0, f"invoke stage exited {code}:\n{_what_it_said(ctx)}"
    where = ctx.cluster(cluster)
    image = runtimes.get(where.runtime).image(ctx.root, ctx.environment(env).name, where)
    rec, why = record.read_record(image)
    assert rec, why
    return rec


def _what_it_said(ctx: Context) -> str:
    """The end of what the command printed, and of the import job's log when it named one (``log: PATH``): a failed
    import says why there."""
    said = ctx.out.getvalue() if isinstance(ctx.out, io.StringIO) else ""
    m = re.search(r"log: (\S+\.out)", said)
    if not m or not Path(m.group(1)).is_file():
        return said[-3000:]
    return f"{said[-3000:]}\n--- {m.group(1)}:\n{Path(m.group(1)).read_text(errors='replace')[-3000:]}"


def storage(reg) -> Path:
    """The `lab` cluster's image storage of the staging tests' project (tests/staging/conftest.py)."""
    return Path(reg.cluster("lab").storage)
