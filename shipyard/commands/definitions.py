"""`invoke render` and `invoke lock`: definitions/ from registry.yaml, and the locks they install from.

The check gate runs here, before anything is written: `render` refuses what `invoke check ENV` refuses (the lock
included), and ``--force`` writes anyway with a warning. `--check` writes nothing and judges nothing but staleness,
so CI can run it on any registry.
"""

from __future__ import annotations

from shipyard.commands.context import Context
from shipyard.definitions import pylock
from shipyard.definitions import render as definitions
from shipyard.errors import ShipyardError


def render(ctx: Context, env: str | None = None, all_envs: bool = False, check: bool = False,
           force: bool = False) -> int:
    """`invoke render [ENV|--all] [--check] [--force]`: write (or, with ``check``, compare) definitions; 1 when
    ``check`` finds stale files."""
    reg = ctx.registry
    envs = list(reg.environments.values()) if all_envs else [ctx.environment(env)]
    if check:
        stale = definitions.stale(reg, envs, all_envs)
        if stale:
            ctx.say("stale definitions (run `invoke render --all`):")
            for line in stale:
                ctx.say(f"  {line}")
            return 1
        ctx.say(f"definitions/ is up to date ({len(envs)} environment(s))")
        return 0
    for e in envs:
        ctx.gate(e, what=f"render {e.name}", force=force, locks=True)
    written = definitions.write(reg, envs)
    for path in written:
        ctx.say(f"wrote {path.relative_to(reg.root)}")
    if not written:
        ctx.say(f"definitions/ already up to date ({len(envs)} environment(s))")
    return 0


def lock(ctx: Context, env: str | None = None, exclude_newer: str | None = None, index_url: str | None = None,
         update_base: bool = False) -> int:
    """`invoke lock [ENV] [--update-base]`: lock and re-render, then say what was written. The index:
    ``--index-url`` without credentials, else uv's index variables (:func:`shipyard.definitions.pylock.index_from`).

    The base image: a digest the lock records for the same base is kept (a relock does not move it); otherwise,
    and always with ``update_base``, its tag is looked up (:func:`shipyard.containers.base_digest.resolve`).
    ``update_base`` changes only the lock's base lines."""
    from shipyard.containers import base_digest  # lazy: the registry client (oras, TLS) is not render's to load

    e = ctx.environment(env)
    if update_base:
        if exclude_newer or index_url:
            raise ShipyardError("--update-base moves only the base image's pin; give --exclude-newer/--index-url "
                                "without it (a relock keeps the recorded base)")
        pin = base_digest.resolve(ctx.registry, e, ctx.err)
        if pin is None:
            raise ShipyardError(f"environments.{e.name}: names no base image, so there is no base to pin")
        path = definitions.repin(ctx.registry, e, pin)
        ctx.say(f"wrote {path.relative_to(ctx.root)}: {_base_words(pin)}")
        return 0
    index = pylock.index_from(index_url)
    if exclude_newer:
        pylock.normalize_cutoff(exclude_newer)  # a bad flag is said before any network
    if not pylock.lock_inputs(e):
        raise ShipyardError(f"environments.{e.name}: nothing to lock (stack: base and no pip packages)")
    try:
        pin = pylock.recorded_base(ctx.registry, e)
    except ShipyardError:  # a garbled pin: this relock records the base afresh
        pin = None
    if pin is None or pin.digest is None or pin.reference != (e.base.value or ""):
        pin = base_digest.resolve(ctx.registry, e, ctx.err)
    path = definitions.relock(ctx.registry, e, exclude_newer, index, base=pin)
    pkgs, hashes = pylock.count_pins(path.read_text())
    ctx.say(f"wrote {path.relative_to(ctx.root)}: {pkgs} packages, {hashes} sha256 hashes, "
            f"exclude-newer {pylock.read_header(path)['exclude-newer']}" + (f"; {_base_words(pin)}" if pin else ""))
    return 0


def _base_words(pin) -> str:
    if pin.digest:
        return f"base {pin.reference} pinned at {pin.digest}"
    return f"base {pin.reference} UNPINNED (by tag only: {pin.why})"
