"""shipyard: registry.yaml -> pinned definitions -> verifiable images -> Slurm launchers."""

__version__ = "0.1.0"
