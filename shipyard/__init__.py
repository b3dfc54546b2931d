"""shipyard: registry.yaml -> pinned definitions -> verifiable images -> Slurm launchers."""

from shipyard import dataclass_code

__version__ = "0.1.0"

dataclass_code.install()  # before any of shipyard's dataclasses is created
