"""The compiled code of the methods :mod:`dataclasses` writes for shipyard's classes, kept across processes.

The dataclass decorator writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and (frozen)
``__setattr__``/``__delattr__`` as source text and compiles it while the class is created, on every import: up to
Python 3.12 one compile per method. shipyard's model is frozen dataclasses, and `invoke launch` creates about fifty
of them, which cost about as much CPU as the rest of its own imports (bench/start_time.py).

:func:`install` gives the dataclasses module an ``exec`` that, for a class of a ``shipyard`` module, looks the text
up before compiling it. The key is the whole text, so a hit runs exactly the code that compiling the text gives; a
miss compiles it as the builtin does (no future flags inherited, file name ``<string>``). Any other text, and any
other module's class, goes to the builtin unchanged. The code is kept where Python keeps shipyard's own bytecode
(:mod:`shipyard.pycache`: the same owner checks, never written where .pyc files are not), one file per module and
interpreter version, since marshalled code loads only into the version that wrote it. A missing, foreign or damaged
file is no error: its texts are compiled again.
"""

from __future__ import annotations

import atexit
import builtins
import dataclasses
import marshal
import sys
import types

from shipyard import pycache

_kept: dict[str, dict[str, types.CodeType]] = {}  # module -> text -> code
_used: dict[str, set[str]] = {}  # module -> texts this process ran
_compiled: set[str] = set()  # modules with a text compiled in this process


def file_name(module: str) -> str:
    return f"dataclass-methods.{module}.{sys.implementation.cache_tag}.marshal"


def _read(module: str) -> dict[str, types.CodeType]:
    return pycache.read_mapping("shipyard", file_name(module), types.CodeType)


def _exec(source, globals=None, locals=None, /):
    """The builtin ``exec``; for a text run in a shipyard module's namespace, its compiled code looked up first."""
    if globals is None:  # the builtin's defaults: the caller's namespaces
        caller = sys._getframe(1)
        globals, locals = caller.f_globals, (caller.f_locals if locals is None else locals)
    module = globals.get("__name__") if isinstance(globals, dict) else None
    if not (isinstance(source, str) and isinstance(module, str)
            and (module == "shipyard" or module.startswith("shipyard."))):
        return builtins.exec(source, globals, locals)
    kept = _kept.get(module)
    if kept is None:
        kept = _kept[module] = _read(module)
    code = kept.get(source)
    if code is None:
        code = kept[source] = compile(source, "<string>", "exec", dont_inherit=True)
        _compiled.add(module)
    _used.setdefault(module, set()).add(source)
    return builtins.exec(code, globals, locals)


def _save() -> None:
    """Write each module's file where a text was compiled: the texts this process ran, so a changed class's old
    methods leave with the next write."""
    for module in sorted(_compiled):
        pycache.write("shipyard", file_name(module),
                      marshal.dumps({text: _kept[module][text] for text in _used[module]}))
    _compiled.clear()


def install() -> None:
    """Route the dataclasses module's compiles through the kept code, once per process."""
    if getattr(dataclasses, "exec", None) is _exec:
        return
    dataclasses.exec = _exec  # a global of that module: found before the builtin, and by that module alone
    atexit.register(_save)
