"""The check gate: the checks of `invoke check`, enforced where they apply (render, build, stage, launch, modules,
shell). Commands reach it through :meth:`shipyard.commands.context.Context.gate`; no stage package imports it.

Why: `invoke check` refusing an environment meant nothing while `render` still wrote its definition, `build` started
a 30-minute build of it and `launch` wrote a launcher whose job would die at start. Every command that acts on an
environment (and on a cluster, where one is involved) now runs the same checks through :func:`require`, prints the
same table on an ERROR and refuses. ``--force`` goes on anyway, loudly: a warning on stderr, and the overridden
errors are returned so the caller records them (the build manifest, the launcher header, the stage record).

The locks. A lock that is missing, or was made for other pins than the registry now asks for
(:func:`shipyard.definitions.pylock.stale_reason`), is an ERROR: the definition would install something else than
registry.yaml says, and the build would find out only at its ``%test``, at the end. These checks live here rather
than in :mod:`shipyard.registry.compat` because the lock is a file of the definitions stage; `invoke check` adds them
through :func:`lock_problems`. A lock that records no digest of the base image is a WARN (:func:`base_problems`).
They apply to what reads the lock (render, build); launch, stage, modules and shell
judge the environment on the cluster, since the image they run was built already and is bound by its record.
"""

from __future__ import annotations

import sys
from typing import IO

from shipyard import project
from shipyard.cli import as_run
from shipyard.definitions import base_pin, pylock
from shipyard.errors import ShipyardError
from shipyard.registry import compat, report
from shipyard.registry.model import Cluster, Environment, Registry


def lock_problems_for(reg: Registry, env: Environment) -> list[compat.Problem]:
    """An ERROR when ``definitions/<env>.lock`` is missing or stale for the registry's pins; [] otherwise (also when
    the environment has nothing to lock: ``stack: base`` without extra pins)."""
    if not pylock.lock_inputs(env):
        return []
    path = project.lock_path(reg, env.name)
    key = f"environments.{env.name}"
    if not path.exists():
        return [compat.Problem(compat.ERROR, env.name, "", key, f"{_rel(reg, path)} is missing: the definition would "
                               f"install unhashed, unpinned wheels; run `invoke lock {env.name}`")]
    why = pylock.stale_reason(reg, env)
    if why:
        return [compat.Problem(compat.ERROR, env.name, "", key, why)]
    return base_problems(reg, env)


def base_problems(reg: Registry, env: Environment) -> list[compat.Problem]:
    """A WARN when the lock records no digest of the base image (no registry answered `invoke lock`, or the lock
    is of format 1, with no base lines): the definitions pull whatever the tag names on the day of the build."""
    base = env.base.value or ""
    if not base or base_pin.embedded_digest(base):
        return []
    pin = pylock.recorded_base(reg, env)
    if pin is not None and pin.digest:
        return []
    why = pin.why if pin is not None else "the lock records no base digest"
    return [compat.Problem(compat.WARN, env.name, "", f"environments.{env.name}.base",
                           f"base image {base} is pinned by tag only ({why}); run `invoke lock {env.name} "
                           "--update-base` where its registry (or base_mirror) answers")]


def lock_problems(reg: Registry) -> list[compat.Problem]:
    """:func:`lock_problems_for` of every environment (the ``extra`` of `invoke check`)."""
    return [p for env in reg.environments.values() for p in lock_problems_for(reg, env)]


def _rel(reg: Registry, path) -> str:
    try:
        return str(path.relative_to(reg.root))
    except ValueError:
        return str(path)


def problems(reg: Registry, env: Environment, cluster: Cluster | None = None,
             locks: bool = False) -> list[compat.Problem]:
    """What `invoke check ENV [--cluster C]` shows for one environment (and one cluster); the locks only with
    ``locks``."""
    found = compat.check_environment(env)
    if cluster is not None:
        found += compat.check_on_cluster(env, cluster)
        registered = reg.clusters.get(cluster.name)  # the cluster's own entry, not a partition's view of it
        found += compat.check_cluster(registered) if registered is not None else []
    if locks:
        found += lock_problems_for(reg, env)
    return report.select(found, env.name, cluster.name if cluster is not None else None)


def require(reg: Registry, env: Environment, cluster: Cluster | None = None, *, what: str,
            force: bool = False, locks: bool = False, out: IO[str] | None = None) -> list[str]:
    """Refuse ``what`` (e.g. "render", "launch") when the checks find an ERROR; with ``force`` go on with a warning.

    Returns the overridden errors as ``KEY: MESSAGE`` lines (empty when nothing was overridden) for the caller to
    record. The table goes to ``out`` (default stderr, so that a command's own output stays clean).
    """
    out = out or sys.stderr
    cluster_name = cluster.name if cluster is not None else None
    found = problems(reg, env, cluster, locks=locks)
    errors = [p for p in found if p.severity == compat.ERROR]
    if not errors:
        return []
    out.write(as_run(report.table_text(reg, found, 1, 1 if cluster_name else 0)[0]))
    where = f"environment {env.name}" + (f" on cluster {cluster_name}" if cluster_name else "")
    again = f"invoke check {env.name}" + (f" --cluster {cluster_name}" if cluster_name else "")
    if not force:
        raise ShipyardError(f"{what} refused: {len(errors)} error(s) for {where} (table above; `{again}`); "
                            "fix them, or give --force to go on anyway")
    print(f"WARNING: --force: {what} goes on despite {len(errors)} error(s) for {where}; this is recorded",
          file=out)
    return [f"{p.key}: {p.message}" for p in errors]
