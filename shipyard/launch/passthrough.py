"""``--sbatch KEY=VALUE``: extra Slurm options passed through to the job.

Which options pass, and the pattern each value must match, are data (``sbatch_passthrough`` in
shipyard/data/launch.yaml); options shipyard writes itself are refused with the flag to use instead
(``sbatch_owned``), anything else as unknown. A value also passes the ``#SBATCH`` rule of
:func:`shipyard.escaping.sbatch_value`, so that what `invoke launch` writes is what sbatch reads. The same pairs become
``#SBATCH --KEY=VALUE`` lines in a launcher and ``--KEY=VALUE`` words of `invoke shell`'s srun.
"""

from __future__ import annotations

import re
from typing import Sequence

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.escaping import sbatch_value

FLAG = "--sbatch"
_KEY = re.compile(r"[a-z][a-z-]{0,39}")
_ALSO = {"constraint": "&|"}  # characters a key's syntax needs beyond the #SBATCH word (see escaping.sbatch_value)


def allowed() -> dict[str, str]:
    return facts.load("launch")["sbatch_passthrough"]


def owned() -> dict[str, str]:
    return facts.load("launch")["sbatch_owned"]


def also(key: str) -> str:
    return _ALSO.get(key, "")


def parse(items: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``--sbatch KEY=VALUE`` (repeatable) -> checked pairs in order; a later KEY wins. Bad input: one line."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not _KEY.fullmatch(key):
            raise ShipyardError(f"{FLAG} {item!r}: expected KEY=VALUE with KEY an sbatch option without '--' "
                                "(e.g. --sbatch mail-type=END)")
        if key in owned():
            instead = owned()[key]
            raise ShipyardError(f"{FLAG} {key}=...: shipyard sets --{key} itself"
                                + (f"; use {instead}" if instead else "; it cannot be overridden"))
        pattern = allowed().get(key)
        if pattern is None:
            raise ShipyardError(f"{FLAG} {key}=...: not an option shipyard passes through (allowed: "
                                f"{', '.join(sorted(allowed()))}; the list is sbatch_passthrough in "
                                "shipyard/data/launch.yaml)")
        if not re.fullmatch(pattern, value):
            raise ShipyardError(f"{FLAG} {key}={value!r}: not a valid --{key} value (must match {pattern})")
        out[key] = line_value(key, value)
    return tuple(out.items())


def line_value(key: str, value: str) -> str:
    """``value`` as it may stand in ``#SBATCH --KEY=VALUE`` (the escaping rule; raises when it may not)."""
    return sbatch_value(value, f"{FLAG} {key}", also=also(key))


def words(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """The pairs as ``--KEY=VALUE`` words (srun and sbatch take the same spelling)."""
    return [f"--{k}={line_value(k, v)}" for k, v in pairs]
