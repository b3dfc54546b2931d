"""The container runtimes, one module each: every module in this package but ``base`` defines ``RUNTIME``.

Why discovered from the files: adding a runtime (say Charliecloud) is adding ``charliecloud.py`` with a
:class:`~shipyard.launch.runtimes.base.Runtime` subclass; ``--runtime``, its help text and its error messages, the
launchers, ``invoke shell``, ``invoke modules`` and ``invoke doctor`` pick it up from here. (A cluster profile's
``runtime:`` is also checked by registry.schema.json, which lists the names itself.)
"""

from __future__ import annotations

import importlib
import pkgutil

from shipyard.errors import ShipyardError
from shipyard.launch.runtimes.base import Placement, Runtime, storage_dir

__all__ = ["NAMES", "Placement", "Runtime", "get", "storage_dir"]


def _discover() -> dict[str, Runtime]:
    found: dict[str, Runtime] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        runtime = importlib.import_module(f"{__name__}.{info.name}").RUNTIME
        found[runtime.name] = runtime
    return dict(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))


_RUNTIMES = _discover()
NAMES: tuple[str, ...] = tuple(_RUNTIMES)


def get(name: str, flag: str = "--runtime") -> Runtime:
    """The runtime called ``name``; an unknown name is one error line naming ``flag`` and the valid names."""
    try:
        return _RUNTIMES[name]
    except KeyError:
        raise ShipyardError(f"{flag} {name!r}: unknown runtime (valid: {', '.join(NAMES)})") from None
