"""`invoke render` and `invoke lock`: definitions/ from registry.yaml, and the locks they install from.

The check gate runs here, before anything is written: `render` refuses what `invoke check ENV` refuses (the lock
included), and ``--force`` writes anyway with a warning. `--check` writes nothing and judges nothing but staleness,
so CI can run it on any registry.
"""

from __future__ import annotations

from shipyard.commands.context import Context
from shipyard.definitions import pylock
from shipyard.definitions import render as definitions


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


def lock(ctx: Context, env: str | None = None, exclude_newer: str | None = None, index_url: str | None = None) -> int:
    """`invoke lock [ENV]`: lock and re-render, then say what was written. The index: ``--index-url`` without
    credentials, else uv's index variables (:func:`shipyard.definitions.pylock.index_from`)."""
    index = pylock.index_from(index_url)
    path = definitions.relock(ctx.registry, ctx.environment(env), exclude_newer, index)
    pkgs, hashes = pylock.count_pins(path.read_text())
    ctx.say(f"wrote {path.relative_to(ctx.root)}: {pkgs} packages, {hashes} sha256 hashes, "
            f"exclude-newer {pylock.read_header(path)['exclude-newer']}")
    return 0
