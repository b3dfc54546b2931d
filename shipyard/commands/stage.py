"""`invoke stage ENV --cluster C`: the image into the cluster's storage, with the record its launchers check.

The command resolves the environment and the cluster once, refuses a request that cannot stage anything (a runtime
without images, a bad ``--from`` or ``--mode``) before the checks, runs the check gate for the environment on the
cluster, and hands the objects and the overridden errors (``--force``) to :func:`shipyard.staging.stage.stage`.
"""

from __future__ import annotations

from pathlib import Path

from shipyard import project
from shipyard.commands import remote as remote_commands
from shipyard.commands.context import Context
from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError
from shipyard.remote import transport
from shipyard.staging import history
from shipyard.staging import stage as staging


def stage(ctx: Context, env: str | None = None, cluster: str | None = None, *, source: str = "auto",
          registry: str | None = None, tag: str | None = None, mode: str | None = None, link: bool = False,
          force: bool = False, list_: bool = False, rollback: bool = False, prune: bool = False) -> int:
    """`invoke stage`; with ``list_``, ``rollback`` or ``prune`` the staged versions instead (no check gate: they
    stage nothing new)."""
    environment, where = ctx.environment(env), ctx.cluster(cluster)
    if transport.is_remote(where):  # the images and the stage record live on the cluster's storage
        return remote_commands.forward(ctx, where)
    actions = [name for name, on in (("--list", list_), ("--rollback", rollback), ("--prune", prune)) if on]
    if actions:
        return versions_action(ctx, environment, where, actions, force)
    rt, _ = staging.request(where, source, mode or None)
    forced = ctx.gate(environment, where, what=f"stage {environment.name}", force=force)
    if source in ("auto", "containers"):
        built_from_today(ctx, environment, rt.suffix, force)
    staging.stage(ctx.registry, environment, where, source=source, registry_name=registry or None, tag=tag or None,
                  mode=mode or None, link=link, forced=forced, force=force, out=ctx.out)
    return 0


def versions_action(ctx: Context, environment, where, actions: list[str], force: bool) -> int:
    """One of --list, --rollback, --prune on the image's staged versions."""
    if len(actions) > 1:
        raise ShipyardError(f"{' and '.join(actions)}: give one of them at a time")
    rt, _ = staging.request(where)
    dest = Path(rt.image(ctx.registry.root, environment.name, where))
    if actions == ["--list"]:
        for line in history.list_lines(dest):
            ctx.say(line)
    elif actions == ["--rollback"]:
        history.rollback(dest, ctx.out)
    else:
        history.prune(dest, force=force, out=ctx.out)
    return 0


def built_from_today(ctx: Context, environment, fmt: str, force: bool) -> None:
    """Refuse to stage a build in containers/ made from another spec than registry.yaml's environment today (it
    changed since, and the build may even have failed since): one line; ``force`` goes on and says so."""
    if not project.artifact_path(ctx.registry, environment.name, fmt).is_file():
        return
    try:
        m = mf.read_manifest(project.manifest_path(ctx.registry, environment.name))
    except (ShipyardError, OSError):
        return
    if not m.spec_hash or m.spec_hash == environment.spec_hash:
        return
    now = {k: p.value for k, p in environment.pins().items()}
    diff = ", ".join(f"{k} {(m.pins or {}).get(k)} -> {v}" for k, v in now.items() if m.pins and m.pins.get(k) != v)
    what = diff or f"spec sha256 {m.spec_hash[:12]}, registry.yaml's is {environment.spec_hash[:12]}"
    line = (f"containers/{environment.name}.{fmt} was built from another spec of environments.{environment.name} "
            f"than registry.yaml's today ({what})")
    if not force:
        raise ShipyardError(f"{line}; `invoke build {environment.name}` first, or --force to stage it anyway")
    print(f"WARNING: {line}; staging it anyway (--force)", file=ctx.err)
