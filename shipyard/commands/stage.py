"""`invoke stage ENV --cluster C`: the image into the cluster's storage, with the record its launchers check.

The command resolves the environment and the cluster once, refuses a request that cannot stage anything (a runtime
without images, a bad ``--from`` or ``--mode``) before the checks, runs the check gate for the environment on the
cluster, and hands the objects and the overridden errors (``--force``) to :func:`shipyard.staging.stage.stage`.
"""

from __future__ import annotations

from shipyard.commands import remote as remote_commands
from shipyard.commands.context import Context
from shipyard.remote import transport
from shipyard.staging import stage as staging


def stage(ctx: Context, env: str | None = None, cluster: str | None = None, *, source: str = "auto",
          registry: str | None = None, tag: str | None = None, mode: str | None = None, link: bool = False,
          force: bool = False) -> int:
    """`invoke stage`."""
    environment, where = ctx.environment(env), ctx.cluster(cluster)
    if transport.is_remote(where):  # the images and the stage record live on the cluster's storage
        return remote_commands.forward(ctx, where)
    staging.request(where, source, mode or None)
    forced = ctx.gate(environment, where, what=f"stage {environment.name}", force=force)
    staging.stage(ctx.registry, environment, where, source=source, registry_name=registry or None, tag=tag or None,
                  mode=mode or None, link=link, forced=forced, force=force, out=ctx.out)
    return 0
