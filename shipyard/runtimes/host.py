"""The host runtime: no container; the command runs on the node as it is (the sandbox, bare-metal venvs).

Everything is the base class's default: no image, no mounts (the project is already there), no srun or exec words,
the variables reach the command as plain exports.
"""

from __future__ import annotations

from shipyard.runtimes.base import Runtime


class Host(Runtime):
    name = "host"
