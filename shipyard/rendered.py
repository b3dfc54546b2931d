"""Rendered text kept by a key of everything the render read, so that rendering the same thing again needs no Jinja2.

A render is a pure function of its inputs: the template files of its package (one may include another), the
context, the filters (:mod:`shipyard.escaping`) and the environment's settings (:mod:`shipyard.templating`,
:mod:`shipyard.jinja_environment`), and Jinja2 itself. The key is the sha256 of all of them, contents and never
times, so a changed byte anywhere renders anew.

Only a context of plain data has a key: strings, numbers, booleans, None, lists, tuples, dicts with string keys, and
dataclasses that hold nothing but their fields (no methods, properties or class attributes of their own, no base
class; their module's source is in the key as well). A template can then read nothing the key does not hold. Any
other context (a module, a path, an object with methods) has no key and is rendered every time. The definitions'
context is a :class:`~shipyard.definitions.recipe.Recipe`, a launcher's its fields and parts
(:func:`shipyard.launch.launcher.render`): plain data by design.

Kept texts live where Python keeps the package's bytecode (:mod:`shipyard.pycache`: owner-checked, never written
where .pyc files are not), one small file per text, named by its key: a render reads the one text it needs, however
many others are kept (a big registry's definitions, every launcher a course wrote). At most :data:`MAX_KEPT` per
package: past it, a process that wrote new ones removes the oldest written that it did not use. A missing, foreign or
damaged file is no error: the text is rendered again.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import marshal
import os
import sys
from pathlib import Path

from shipyard import pycache
from shipyard.files import sha256_file

FORMAT = "shipyard-rendered-2"  # part of every key and of every file: a change of either starts afresh
PREFIX = "rendered-"  # a kept text's file: PREFIX + its key
MAX_KEPT = 1024  # texts per package (every definition of 300 environments)
# the modules whose code shapes a render beside the templates: the filters, the environment's settings, this key
CODE = ("templating.py", "jinja_environment.py", "escaping.py", "errors.py", "rendered.py")
# what a dataclass has of its own when it holds nothing but fields (the methods the decorator writes included)
_DATACLASS_OWN = frozenset({
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__", "__slots__",
    "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__init__", "__repr__", "__eq__", "__hash__",
    "__setattr__", "__delattr__", "__lt__", "__le__", "__gt__", "__ge__", "__getstate__", "__setstate__",
    "__static_attributes__", "__firstlineno__",
})

_new: dict[str, dict[str, str]] = {}  # package -> key -> text this process rendered, written at its end
_used: dict[str, set[str]] = {}  # package -> the keys this process rendered or read


class _NotPlain(Exception):
    pass


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...] | None:
    """The fields of a dataclass that holds nothing but them, else None."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    if cls.__bases__ == (object,) and all(k in names or k in _DATACLASS_OWN for k in vars(cls)):
        return names
    return None


_SCALARS = (int, float, bool, type(None))
# the encodings of frozen dataclass instances that hold nothing mutable, by id, with the instance (kept alive, so its
# id names no other object): a definition, its Dockerfile and its test script encode the same recipe
_FROZEN: dict[int, tuple[object, list[str], set[str]]] = {}
_FROZEN_MAX = 256


def _encode(value, out: list[str], modules: set[str]) -> bool:
    """Append ``value``'s encoding to ``out``, naming every type and length (so no two values encode alike), or
    raise :class:`_NotPlain`; ``modules`` collects the dataclasses' modules. True when nothing in it can change
    (no list, no dict)."""
    kind = type(value)
    if kind is str:
        out.append(f"s{len(value)}:{value}")
        return True
    if kind in _SCALARS:
        out.append(f"{kind.__name__}:{value!r}")
        return True
    if kind is tuple or kind is list:
        out.append(f"{kind.__name__}{len(value)}")
        fixed = kind is tuple
        for item in value:
            fixed = _encode(item, out, modules) and fixed
        return fixed
    if kind is dict:
        out.append(f"dict{len(value)}")
        for k, item in value.items():  # in order: templates iterate it
            if type(k) is not str:
                raise _NotPlain
            out.append(f"s{len(k)}:{k}")
            _encode(item, out, modules)
        return False
    names = _field_names(kind) if dataclasses.is_dataclass(kind) else None
    if names is None:
        raise _NotPlain
    frozen = kind.__dataclass_params__.frozen
    kept = _FROZEN.get(id(value)) if frozen else None
    if kept is not None and kept[0] is value:
        out.extend(kept[1])
        modules.update(kept[2])
        return True
    own, own_modules = [f"dataclass {kind.__module__}.{kind.__qualname__}"], {kind.__module__}
    fixed = frozen
    for name in names:
        fixed = _encode(getattr(value, name), own, own_modules) and fixed
    out.extend(own)
    modules.update(own_modules)
    if fixed:
        if len(_FROZEN) >= _FROZEN_MAX:
            _FROZEN.clear()
        _FROZEN[id(value)] = (value, own, own_modules)
    return fixed


@functools.lru_cache(maxsize=None)
def _code() -> tuple:
    here = Path(__file__).parent
    return tuple((name, sha256_file(here / name)) for name in CODE)


@functools.lru_cache(maxsize=None)
def _jinja2() -> str:
    spec = importlib.util.find_spec("jinja2")  # found, not imported: its __init__ carries the version
    if spec is None or not spec.origin:
        raise OSError("no Jinja2")
    return sha256_file(Path(spec.origin))


@functools.lru_cache(maxsize=None)
def _module_source(module: str) -> str:
    return sha256_file(Path(sys.modules[module].__file__))


@functools.lru_cache(maxsize=None)
def _templates(package: str) -> tuple:
    folder = os.path.join(os.path.dirname(importlib.import_module(package).__file__), "templates")
    found = [os.path.join(top, name) for top, _, names in os.walk(folder) for name in names]
    return tuple((path[len(folder) + 1:], sha256_file(path)) for path in sorted(found))


def key(package: str, template: str, trim_blocks: bool, context: dict) -> str | None:
    """The key of this render, or None when its context is not plain data (or a source cannot be read)."""
    modules: set[str] = set()
    data: list[str] = []
    try:
        _encode(context, data, modules)
        parts = (FORMAT, sys.version, _jinja2(), _code(), tuple((m, _module_source(m)) for m in sorted(modules)),
                 package, _templates(package), template, bool(trim_blocks))
    except (_NotPlain, OSError, KeyError, TypeError, AttributeError):
        return None
    digest = hashlib.sha256(repr(parts).encode())
    digest.update("\n".join(data).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _name(key: str) -> str:
    return PREFIX + key


def _read(package: str, key: str) -> str | None:
    """The text kept under ``key``: a file of this format that names the same key, else None."""
    kept = pycache.read_marshal(package, _name(key))
    if type(kept) is tuple and len(kept) == 3 and kept[:2] == (FORMAT, key) and type(kept[2]) is str:
        return kept[2]
    return None


def get(package: str, key: str) -> str | None:
    """The text kept under ``key``, or None."""
    text = _new.get(package, {}).get(key)
    if text is None:
        text = _read(package, key)
    if text is not None:
        _used.setdefault(package, set()).add(key)
    return text


def put(package: str, key: str, text: str) -> None:
    """Keep ``text`` under ``key``; written when the process ends."""
    if not _new:
        atexit.register(_save)
    _new.setdefault(package, {})[key] = text
    _used.setdefault(package, set()).add(key)


def _save() -> None:
    for package, texts in sorted(_new.items()):
        for key, text in texts.items():
            pycache.write(package, _name(key), marshal.dumps((FORMAT, key, text)))
        kept = pycache.listing(package, PREFIX)
        if len(kept) > MAX_KEPT:
            for name in _eviction_order(kept, package, texts)[:len(kept) - MAX_KEPT]:
                pycache.remove(package, name)
    _new.clear()


def _eviction_order(kept: dict[str, int], package: str, written: dict[str, str]) -> list[str]:
    """Which kept files go first: those this process did not use, the oldest written first; then those it read;
    then those it wrote, in the order it wrote them (a time stamp is coarser than one process's writes)."""
    written_names = [_name(k) for k in written]
    used, wrote = {_name(k) for k in _used.get(package, ())}, set(written_names)
    others = sorted((mtime, name) for name, mtime in kept.items() if name not in used)
    read = sorted((mtime, name) for name, mtime in kept.items() if name in used and name not in wrote)
    return [n for _, n in others] + [n for _, n in read] + [n for n in written_names if n in kept]
