"""One shape for every invoke task: its flags (name, default, help), its docstring, and one command call.

A :class:`Spec` is data; :func:`make` turns it into the invoke task, so no task holds logic of its own: the flags
become the task's parameters in the order given (invoke derives the short flags from that order), and the task
imports its command module only when it runs (``invoke --list`` and ``--help`` load no command module). ``call``
is one call of the command with values read from :class:`Flags`: what the task was given, plus the few ways of
passing them on that several tasks share (the registry's context, the launch options, the words after ``--``).

Every task is wrapped in ``task_guard``: a user error prints one line and exits 2, never a traceback.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from invoke import task

from shipyard import collector
from shipyard.cli import argv_after_dashdash, task_guard
from shipyard.launch import options as launch_options

REQUIRED = inspect.Parameter.empty  # a flag's default when the task cannot run without it (a positional)


class Flags:
    """The values a task was given, by flag name (``f.env``), and what several commands are handed built from them."""

    def __init__(self, values: dict[str, Any]):
        self._values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"no flag {name!r}") from None

    def context(self):
        """The command's context: the registry (the task's --registry, else $SHIPYARD_REGISTRY or ./registry.yaml)."""
        from shipyard.commands.context import Context  # lazy: start-up of every task

        return Context.load(self._values.get("registry"))

    def options(self, *names: str):
        """The launch options model of the flags ``names`` (default: every flag of the task)."""
        return launch_options.Options(**{k: v for k, v in self._values.items() if not names or k in names})

    @staticmethod
    def after_dashdash() -> list[str]:
        """The words after ``--`` on the command line, exactly as given (a training command, a Slurm client's)."""
        return argv_after_dashdash(sys.argv)


@dataclass(frozen=True)
class Spec:
    """One task. ``flags``: parameter name -> (default, help), in the order of the task's parameters (a trailing
    ``_`` is dropped from the flag, as invoke does); :data:`REQUIRED` for one it needs. ``command``:
    ``"module:function"``, imported when the task runs. ``call(command, flags)``: the one call of the command."""

    name: str
    doc: str
    flags: dict[str, tuple[Any, str]]
    command: str
    call: Callable[[Callable, Flags], Any]
    positional: tuple[str, ...] = ()
    iterable: tuple[str, ...] = ()
    auto_shortflags: bool = True
    extra: dict = field(default_factory=dict)  # invoke's own @task keywords, as a model of options gives them


def _signature(spec: Spec) -> inspect.Signature:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter("c", kind),
                              *(inspect.Parameter(n, kind, default=d) for n, (d, _) in spec.flags.items())])


def make(spec: Spec):
    """The invoke task of ``spec``."""

    def body(c, **values):
        module, _, function = spec.command.partition(":")
        try:
            command = getattr(importlib.import_module(module), function)
        finally:  # the program has loaded what it runs: freeze it, collect what the command creates
            collector.settle()
        raise SystemExit(spec.call(command, Flags(values)))

    body.__name__ = body.__qualname__ = spec.name.replace("-", "_")
    body.__doc__ = spec.doc
    body.__signature__ = _signature(spec)
    helps = {n.rstrip("_") if n.endswith("_") else n: h for n, (_, h) in spec.flags.items() if h}
    kwargs = dict(name=spec.name, positional=list(spec.positional), help=helps)
    if spec.iterable:
        kwargs["iterable"] = list(spec.iterable)
    if not spec.auto_shortflags:
        kwargs["auto_shortflags"] = False
    return task(task_guard(body), **(kwargs | spec.extra))
