"""`invoke list`, `show` and `check`: the registry as tables, one environment's pins, every problem
(`compat.refresh` and `cluster.import-pcluster`, which change files, are :mod:`shipyard.commands.compat` and
:mod:`shipyard.commands.pcluster`).

The pattern every command module follows: flags in (names, booleans), a :class:`Context` loaded once, names resolved
once, the stage's pure functions called with objects, the result printed on ``ctx.out``, an exit code returned.
"""

from __future__ import annotations

from shipyard.commands import gate
from shipyard.commands.context import Context
from shipyard.registry import compat, report


def list_(ctx: Context) -> int:
    """`invoke list`."""
    ctx.say(report.list_tables(ctx.registry))
    return 0


def show(ctx: Context, env: str | None, contents: bool = False) -> int:
    """`invoke show [ENV] [--contents]`: the resolved pins, or with ``contents`` what the last build's image holds."""
    if contents:
        from shipyard.commands import containers as container_commands  # lazy: the build backends cost ~0.1 s

        return container_commands.show_contents(ctx, env)
    ctx.say(report.show(ctx.environment(env)))
    ctx.say(report.facts_line())
    return 0


def check(ctx: Context, env: str | None = None, cluster: str | None = None) -> int:
    """`invoke check [ENV] [--cluster C]`: compatibility and lock problems as one table; 1 on any ERROR."""
    reg = ctx.registry
    env_name = ctx.environment(env).name if env else None  # unknown names fail with a did-you-mean
    cluster_name = ctx.cluster(cluster).name if cluster else None
    problems = report.select(compat.check_all(reg) + gate.lock_problems(reg), env_name, cluster_name)
    n_env = 1 if env_name else len(reg.environments)
    n_clusters = 1 if cluster_name else len(reg.clusters)
    text, errors = report.table_text(reg, problems, n_env, n_clusters)
    ctx.write(text + report.facts_line() + "\n")
    return 1 if errors else 0
