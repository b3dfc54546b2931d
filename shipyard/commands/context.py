"""What every command starts from: the registry loaded once, names resolved once, the check gate, the output.

A command builds one :class:`Context` (``Context.load(path)``), resolves the names its flags gave with
:meth:`Context.environment` and :meth:`Context.cluster` (``None`` or ``""``: the registry's default), runs
:meth:`Context.gate` where it acts on an environment, and passes the objects down. Stages never see a name that still
needs resolving, so an environment is looked up once per command, not once per stage it passes through.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import IO

from shipyard import registry
from shipyard.cli import as_run
from shipyard.commands import gate
from shipyard.registry.model import Cluster, Environment, Registry


@dataclass
class Context:
    """One command's registry and streams. ``out`` gets the command's result, ``err`` warnings and check tables."""

    registry: Registry
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    err: IO[str] = field(default_factory=lambda: sys.stderr)

    @classmethod
    def load(cls, registry_path=None, out: IO[str] | None = None, err: IO[str] | None = None) -> Context:
        """Load ``registry_path`` (default ``$SHIPYARD_REGISTRY``, else ./registry.yaml) once for this command."""
        return cls(registry.load(registry_path), out or sys.stdout, err or sys.stderr)

    @property
    def root(self):
        """The project directory: the folder that holds the registry file."""
        return self.registry.root

    def environment(self, name: str | None = None) -> Environment:
        """The environment ``name`` (the registry's default for None or ""); an unknown name is one error line."""
        return self.registry.environment(name or None)

    def cluster(self, name: str | None = None) -> Cluster:
        """The cluster ``name`` (the registry's default for None or ""); an unknown name is one error line."""
        return self.registry.cluster(name or None)

    def gate(self, env: Environment, cluster: Cluster | None = None, *, what: str, force: bool = False,
             locks: bool = False) -> list[str]:
        """The checks of `invoke check ENV [--cluster C]` before ``what``: refuse on an ERROR, or with ``force`` warn
        and return the overridden errors (``KEY: MESSAGE`` lines) for the caller to record."""
        return gate.require(self.registry, env, cluster, what=what, force=force, locks=locks, out=self.err)

    def say(self, text: str = "") -> None:
        """One line (or block) of the command's result on ``out``, naming the program the user runs (`shipyard
        TASK` under the installed command, `invoke TASK` in the checkout: shipyard.cli.as_run)."""
        print(as_run(text), file=self.out)

    def write(self, text: str) -> None:
        """``text`` as it is (a report that ends its own lines) on ``out``, with :meth:`say`'s program name rule."""
        self.out.write(as_run(text))
