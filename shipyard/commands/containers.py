"""`invoke build`, `push`, `pull`, `sign` and `verify`: images in ``containers/``, made, published, fetched, signed.

The command resolves the environment once, runs the check gate where the work reads the definition (build: the
lock included, so a refused environment never starts a 30-minute build), and hands the objects to
:mod:`shipyard.containers`.
"""

from __future__ import annotations

from shipyard.commands import remote as remote_commands
from shipyard.commands.context import Context
from shipyard.containers import engine, on_slurm, push as registry_io, sign as signing
from shipyard.errors import ShipyardError
from shipyard.remote import transport


def build(ctx: Context, env: str | None = None, *, backend: str | None = None, fakeroot: bool = False,
          force: bool = False, formats: str | None = None, block: bool = True, slurm: bool = False,
          cluster: str | None = None, partition: str | None = None, wait: bool = False) -> int:
    """`invoke build`: locally, or as a batch job on a cluster's build partition with ``slurm``."""
    environment = ctx.environment(env)
    if slurm and transport.is_remote(ctx.cluster(cluster)):  # the build job writes to the cluster's storage
        return remote_commands.forward(ctx, ctx.cluster(cluster))
    forced = ctx.gate(environment, what=f"build {environment.name}", force=force, locks=True)
    if slurm:
        return on_slurm.submit(ctx.registry, environment.name, cluster_name=cluster or None,
                               partition=partition or None, backend=backend or None, fakeroot=fakeroot, force=force,
                               formats=formats, wait=wait, out=ctx.out)
    if wait or partition or cluster:
        raise ShipyardError("--wait, --partition and --cluster only apply with --slurm")
    engine.build(ctx.registry, environment, backend=backend or "apptainer", fakeroot=fakeroot, force=force, formats=formats,
                 block=block, out=ctx.out, forced=forced)
    return 0


def push(ctx: Context, env: str | None = None, registry: str | None = None, tag: str | None = None) -> int:
    """`invoke push`."""
    registry_io.push(ctx.registry, ctx.environment(env), registry or None, tag or None, out=ctx.out)
    return 0


def pull(ctx: Context, env: str | None = None, registry: str | None = None, tag: str | None = None,
         force: bool = False) -> int:
    """`invoke pull`."""
    registry_io.pull(ctx.registry, ctx.environment(env), registry or None, tag or None, out=ctx.out, force=force)
    return 0


def sign(ctx: Context, env: str | None = None, keyidx: int = 0) -> int:
    """`invoke sign`."""
    sig = signing.sign(ctx.registry, ctx.environment(env), keyidx)
    new = sig["signers"][-1]
    ctx.say(f"signed with {new['fingerprint']} ({new['signer']}); recorded in the build manifest "
            f"({len(sig['signers'])} signature(s) of this image)")
    return 0


def verify(ctx: Context, env: str | None = None) -> int:
    """`invoke verify`: exit 1 (one line) unless the image verifies and every key `invoke sign` recorded signed it."""
    res = signing.verify(ctx.registry, ctx.environment(env))
    ctx.say(f"verified: signed by {signing.describe_signers(res['signers'])}")
    return 0
