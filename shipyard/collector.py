"""The cyclic garbage collector while a command starts.

A command's start loads invoke, shipyard's task table and the command's modules: well over 100,000 objects (modules,
classes, functions, code, compiled patterns) that live until the process ends and are not garbage. The cyclic
collector walks them anyway: dozens of young and several middle collections while they load, and a full collection
as the interpreter exits. That last one alone costs about a fifth of invoke's own start here (bench/start_time.py).

So the program holds the collector from its first line (:func:`hold`). Once the task's command module is imported
(:func:`settle`, from the task's body), what exists then is frozen (:func:`gc.freeze`: moved to a generation that
no collection walks, the exit's included) and the collector runs again, as usual, for what the command itself
creates. A long command (a build, a stage, the test suite) is collected as before from that point on.

Only a program's entry holds the collector: ``python -m shipyard`` and the ``shipyard`` command
(``shipyard/__main__.py``), and ``invoke`` in the checkout (its tasks.py, when the process is the invoke program).
A test or a library that imports shipyard's tasks, or runs them in its own process, keeps its collector as it is:
:func:`settle` does nothing where :func:`hold` did not run.

The cost: a reference cycle that became garbage during the start (few do) is kept until the process exits.
"""

from __future__ import annotations

import gc
import os
import sys

_held = False


def hold() -> None:
    """No collection until :func:`settle`; nothing if the collector is already off (someone else's choice)."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def hold_in(*programs: str) -> None:
    """:func:`hold` when this process is one of ``programs`` (``sys.argv[0]`` is its script, or its package's
    ``__main__.py`` under ``python -m``), not a test or tool that imported the module calling this."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    name = os.path.basename(script)
    if name in programs or (name == "__main__.py" and os.path.basename(os.path.dirname(script)) in programs):
        hold()


def settle() -> None:
    """Freeze what exists and turn the collector back on, where :func:`hold` turned it off; else nothing."""
    global _held
    if _held:
        _held = False
        gc.freeze()
        gc.enable()
