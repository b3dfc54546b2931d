"""The container runtimes, one module and one class each, listed in :data:`RUNTIMES`.

Why a package below the stages: where an image lives on a cluster (staging), how mounts and variables reach the
container and what goes on the srun line (launch, shell, modules, doctor) are all answers of one runtime object, so
staging and launch both ask it without one of them importing the other. Adding a runtime (as Charliecloud was) is a
module with a :class:`~shipyard.runtimes.base.Runtime` subclass, one entry in :data:`RUNTIMES`, and its name in
registry.schema.json (a test keeps the two lists equal).
"""

from __future__ import annotations

from shipyard.errors import ShipyardError
from shipyard.runtimes.apptainer import Apptainer
from shipyard.runtimes.base import Placement, Runtime, storage_dir
from shipyard.runtimes.charliecloud import Charliecloud
from shipyard.runtimes.host import Host
from shipyard.runtimes.pyxis import Pyxis

__all__ = ["NAMES", "RUNTIMES", "Placement", "Runtime", "get", "storage_dir"]

# In the order help texts and error messages list them ("valid: ..."): the usual choice first.
RUNTIMES: tuple[Runtime, ...] = (Pyxis(), Apptainer(), Charliecloud(), Host())
_BY_NAME = {rt.name: rt for rt in RUNTIMES}
NAMES: tuple[str, ...] = tuple(_BY_NAME)


def get(name: str, flag: str = "--runtime") -> Runtime:
    """The runtime called ``name``; an unknown name is one error line naming ``flag`` and the valid names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ShipyardError(f"{flag} {name!r}: unknown runtime (valid: {', '.join(NAMES)})") from None
