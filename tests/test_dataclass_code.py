"""shipyard.dataclass_code: the methods dataclasses writes for shipyard's classes are compiled once and kept beside
the package's bytecode; a class made from kept code behaves as one made by a fresh compile, and nothing else changes
(other modules' classes, a damaged or foreign file)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest

from shipyard import dataclass_code

MODULE = "shipyard.dataclass_code_probe"  # a shipyard module name of the test's own
SOURCE = '''
from dataclasses import dataclass, field

@dataclass(frozen=True)
class Point:
    """A frozen class: __init__, __repr__, __eq__, __hash__, __setattr__, __delattr__ are all written."""
    x: int
    y: str = "a"
    tags: tuple = field(default=())

@dataclass
class Box:
    """A plain class with a default factory."""
    items: list = field(default_factory=list)
'''


@pytest.fixture
def fresh(bytecode_folder, monkeypatch):
    """This process's kept code forgotten (as in a new process), the probe module's namespace made anew by
    ``make()``; returns ``make``."""
    def reset():
        monkeypatch.setattr(dataclass_code, "_kept", {})
        monkeypatch.setattr(dataclass_code, "_used", {})
        monkeypatch.setattr(dataclass_code, "_compiled", set())

    def make(source: str = SOURCE, name: str = MODULE, new_process: bool = True):
        if new_process:
            reset()
        module = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, module)
        exec(compile(source, name, "exec", dont_inherit=True), module.__dict__)
        return module

    dataclass_code.install()
    reset()
    return make


def behaves(module) -> None:
    p = module.Point(1, tags=("t",))
    assert repr(p) == "Point(x=1, y='a', tags=('t',))"
    assert p == module.Point(1, "a", ("t",)) and p != module.Point(2)
    assert hash(p) == hash(module.Point(1, "a", ("t",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.y
    with pytest.raises(TypeError):
        module.Point()
    # compiled as the dataclasses module compiles it: the annotations are the types, not strings (no future flag
    # inherited from the module that compiles)
    assert module.Point.__init__.__annotations__["x"] is int
    b = module.Box()
    b.items.append(1)
    assert module.Box().items == [] and b == module.Box([1])


def test_the_dataclasses_module_compiles_through_the_kept_code_once_shipyard_is_imported():
    assert dataclasses.exec is dataclass_code._exec
    dataclass_code.install()  # a second install changes nothing
    assert dataclasses.exec is dataclass_code._exec


def test_a_class_made_from_kept_code_behaves_as_a_freshly_compiled_one(fresh, bytecode_folder, monkeypatch):
    behaves(fresh())
    dataclass_code._save()
    kept = bytecode_folder / dataclass_code.file_name(MODULE)
    assert kept.is_file()

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled although the code was kept")

    monkeypatch.setattr(dataclass_code, "compile", no_compile, raising=False)
    module = fresh()  # a new process: the kept file is read, nothing is compiled
    behaves(module)
    assert dataclass_code._compiled == set()
    assert module.Point.__init__.__qualname__ == "Point.__init__"


def test_the_generated_code_equals_a_fresh_compile(fresh):
    fresh()
    # up to Python 3.12 one text per method (Point: six, Box: three), from 3.13 one per class
    assert len(dataclass_code._kept[MODULE]) == (2 if sys.version_info >= (3, 13) else 9)
    for text, code in dataclass_code._kept[MODULE].items():
        assert code == compile(text, "<string>", "exec", dont_inherit=True)
        assert not code.co_flags & __import__("__future__").annotations.compiler_flag


def test_another_modules_classes_are_left_to_the_builtin(fresh, bytecode_folder):
    fresh(name="not_shipyard_probe")
    dataclass_code._save()
    assert dataclass_code._kept == {}
    assert list(bytecode_folder.iterdir()) == []


@pytest.mark.parametrize("content", [b"", b"not marshal at all", b"\x00" * 40,
                                     __import__("marshal").dumps({"text": 1}), __import__("marshal").dumps([1, 2])])
def test_a_damaged_or_foreign_file_is_compiled_again(fresh, bytecode_folder, content):
    (bytecode_folder / dataclass_code.file_name(MODULE)).write_bytes(content)
    behaves(fresh())
    assert dataclass_code._compiled == {MODULE}


def test_a_changed_class_leaves_its_old_methods_behind_at_the_next_write(fresh, bytecode_folder):
    fresh()
    dataclass_code._save()
    before = set(dataclass_code._kept[MODULE])
    changed = fresh(SOURCE.replace("    y: str", "    z: str"))
    assert repr(changed.Point(1)) == "Point(x=1, z='a', tags=())"
    dataclass_code._save()
    after = set(dataclass_code._read(MODULE))
    assert after == dataclass_code._used[MODULE]
    assert before - after and after - before  # Point's texts replaced
    assert before & after  # Box's kept


def test_exec_keeps_the_builtins_meaning_for_other_callers(fresh):
    namespace: dict = {"__name__": MODULE}
    dataclass_code._exec("z = 1 + 1", namespace)
    assert namespace["z"] == 2
    dataclass_code._exec(compile("w = 3", "<x>", "exec"), namespace)  # code, not text: passed on
    assert namespace["w"] == 3

    def caller():
        local = {}
        dataclass_code._exec("v = __name__", None, local)  # no globals given: the caller's, as the builtin does
        return local["v"]

    assert caller() == __name__


def test_a_real_command_reads_the_model_classes_kept_by_an_earlier_one(tmp_path):
    """Two processes, as two commands: the second creates shipyard's model classes from the first one's kept code,
    compiles none, and its objects compare, hash and print as the first one's did."""
    script = (
        "import json, shipyard.registry.model as m, shipyard.launch.options as o\n"
        "from shipyard import dataclass_code as d\n"
        "p = m.Pin('2.3.1', 'explicit')\n"
        "print(json.dumps([sorted(d._compiled), repr(p), hash(p) == hash(m.Pin('2.3.1', 'explicit')),"
        " repr(o.Options())]))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "prefix")
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True,
                                      text=True, timeout=60).stdout) for _ in range(2)]
    first, second = runs
    assert "shipyard.registry.model" in first[0] and "shipyard.launch.options" in first[0]
    assert second[0] == []  # nothing compiled: every method came from the kept files
    assert first[1:] == second[1:] and first[2] is True
