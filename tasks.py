"""shipyard's command line: thin invoke tasks. Each parses flags and calls the package; no logic lives here.

Every task is wrapped in ``task_guard``: a user error prints one line and exits 2, never a traceback.
The registry is ./registry.yaml unless $SHIPYARD_REGISTRY names another file.

Conventions: an optional environment argument is declared ``@task(positional=["env"])`` with ``env=None``; it may be
omitted on the command line (see ``allow_optional_positionals``), and then arrives as "" or None: both mean
``defaults.environment``.
"""

from __future__ import annotations

from invoke import Collection, task

from shipyard.cli import allow_optional_positionals, task_guard

allow_optional_positionals()

# ----------------------------------------------------------------------------------------------- registry, check, render


@task(name="list")
@task_guard
def list_(c):
    """List environments and clusters as tables."""
    from shipyard import report

    print(report.list_tables())


@task(positional=["env"], help={"env": "environment name (default: defaults.environment)"})
@task_guard
def show(c, env=None):
    """Show an environment's fully resolved pins and where each came from."""
    from shipyard import report

    print(report.show(env))


@task(positional=["env"], help={"env": "only this environment (default: all)", "cluster": "only this cluster (default: all it is used on)"})
@task_guard
def check(c, env=None, cluster=None):
    """Check every environment against the compatibility data and its clusters; exit 1 on any ERROR."""
    from shipyard import report

    code = report.check(env, cluster)
    if code:
        raise SystemExit(code)


@task(
    positional=["env"],
    help={
        "env": "environment to render (default: defaults.environment)",
        "all": "render every environment",
        "check": "do not write; exit 1 and name the stale files if definitions/ differs from what the registry renders",
    }
)
@task_guard
def render(c, env=None, all=False, check=False):
    """Render definitions/<env>.def (and .Dockerfile) from registry.yaml."""
    from shipyard import definitions

    code = definitions.render_command(env, all_envs=all, check=check)
    if code:
        raise SystemExit(code)


# ----------------------------------------------------------------------------------------------- namespace

ns = Collection(list_, show, check, render)
