"""shipyard.rendered: a render of plain data is kept by a key of everything it reads, so the same render again needs
no Jinja2; any changed input (a value, the order of a mapping, a template byte, the filters' code, Jinja2) renders
anew, and a context that is not plain data is never kept."""

from __future__ import annotations

import ast
import dataclasses
import marshal
import os
import shutil
import sys
from pathlib import Path

import pytest

from fixtures_pycache import new_render_process, task_processes
from shipyard import escaping, jinja_environment, rendered, templating

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Leaf:
    name: str
    values: tuple = ()


@dataclasses.dataclass(frozen=True)
class WithMethod:
    name: str

    def shout(self) -> str:
        return self.name.upper()


@dataclasses.dataclass(frozen=True)
class WithProperty:
    name: str

    @property
    def shout(self) -> str:
        return self.name.upper()


@dataclasses.dataclass(frozen=True)
class Derived(Leaf):
    extra: str = ""


class Text(str):
    pass


@dataclasses.dataclass(frozen=True)
class Holder:
    items: list


@pytest.fixture
def probe(tmp_path, monkeypatch, fresh_renders):
    """A package of the test's own with one template, ``{{ x }}!``."""
    root = tmp_path / "pkgs"
    (root / "memo_probe" / "templates").mkdir(parents=True)
    (root / "memo_probe" / "__init__.py").write_text("")
    (root / "memo_probe" / "templates" / "t.j2").write_text("{{ x }}!")
    monkeypatch.syspath_prepend(str(root))
    yield root / "memo_probe" / "templates" / "t.j2"
    sys.modules.pop("memo_probe", None)
    jinja_environment.template_environment.cache_clear()


def no_jinja(*args, **kwargs):
    raise AssertionError("rendered by Jinja2 although the text was kept")


def key(context, template="definition.def.j2", trim=False):
    return rendered.key("shipyard.definitions", template, trim, context)


def test_plain_data_has_a_key_and_every_input_changes_it():
    context = {"r": Leaf("a", (1, 2.5, True, None)), "items": [Leaf("b")], "m": {"k": "v", "j": "w"}}
    assert key(context) == key(dict(context)) is not None
    assert len({key(context),
                key({**context, "r": Leaf("a", (1, 2.5, True, "None"))}),  # a nested value
                key({**context, "r": Leaf("a", (True, 2.5, True, None))}),  # 1 and True are different values
                key({**context, "m": {"j": "w", "k": "v"}}),  # a mapping's order: templates iterate it
                key({**context, "items": (Leaf("b"),)}),  # a tuple is not a list
                key(context, template="Dockerfile.j2"),
                key(context, trim=True)}) == 7


def test_a_frozen_object_holding_a_list_is_encoded_anew_each_time():
    held = Holder(["a"])
    before = key({"h": held})
    held.items.append("b")
    assert key({"h": held}) != before


def test_objects_that_come_and_go_never_share_a_key():
    """Encodings of frozen objects are reused by identity: a thousand short-lived objects (more than are kept, their
    ids free for reuse once dropped) all keep keys of their own values."""
    keys = [key({"r": Leaf(str(i), (i,))}) for i in range(1000)]
    assert len(set(keys)) == 1000
    assert keys[:3] == [key({"r": Leaf(str(i), (i,))}) for i in range(3)]


@pytest.mark.parametrize("value", [
    rendered, Path("/x"), object(), WithMethod("a"), WithProperty("a"), Derived("a"), Text("a"), {1: "a"}, {"a"},
    [Leaf("a"), WithMethod("b")], {"deep": (Leaf("a", (Path("/x"),)),)},
], ids=["module", "path", "object", "method", "property", "subclass", "str-subclass", "int-key", "set",
        "list-with-one", "deep"])
def test_a_context_that_is_not_plain_data_is_never_kept(value):
    assert key({"v": value}) is None


def test_a_kept_render_is_served_without_jinja2(probe, monkeypatch):
    assert templating.render("memo_probe", "t.j2", x=Leaf("a")) == "Leaf(name='a', values=())!"
    rendered._save()
    new_render_process()
    monkeypatch.setattr(jinja_environment, "render", no_jinja)
    assert templating.render("memo_probe", "t.j2", x=Leaf("a")) == "Leaf(name='a', values=())!"
    with pytest.raises(AssertionError, match="although the text was kept"):
        templating.render("memo_probe", "t.j2", x=Leaf("b"))  # another value: rendered


def test_an_edited_template_renders_anew_even_with_its_size_and_time_kept(probe):
    assert templating.render("memo_probe", "t.j2", x=1) == "1!"
    rendered._save()
    stat = probe.stat()
    probe.write_text("{{ x }}?")
    os.utime(probe, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    new_render_process()
    assert templating.render("memo_probe", "t.j2", x=1) == "1?"


@pytest.mark.parametrize("source", ["escaping.py", "templating.py", "jinja_environment.py", "jinja2/__init__.py",
                                    Path(__file__).name])
def test_a_changed_source_changes_the_key(fresh_renders, monkeypatch, source):
    """The filters, the environment's settings, Jinja2 (its __init__ carries its version) and the module of a
    dataclass in the context: an edit of any of them gives another key."""
    real = rendered.sha256_file

    def key_when(content: str) -> str:
        new_render_process()
        monkeypatch.setattr(rendered, "sha256_file",
                            lambda p: content if os.fspath(p).endswith("/" + source) else real(p))
        return key({"r": Leaf("a")})

    assert key_when("one") != key_when("two")
    assert key_when("one") == key_when("one")


def kept_texts(package: str) -> list[str]:
    """The texts kept for ``package``, as a new process would read them."""
    folder = rendered.pycache._places(package)[1]
    return sorted(rendered._read(package, p.name[len(rendered.PREFIX):])
                  for p in folder.glob(rendered.PREFIX + "*")) if folder.is_dir() else []


def probe_key(x) -> str:
    return rendered.key("memo_probe", "t.j2", False, {"x": x})


@pytest.mark.parametrize("content", [
    b"", b"not marshal", b"\x00" * 32, marshal.dumps({"k": 1}), marshal.dumps(["k"]), marshal.dumps(("a", "b", "c")),
    marshal.dumps((rendered.FORMAT, "0" * 64, "forged!")),  # another key's text under this key's name
    marshal.dumps(("shipyard-rendered-1", "KEY", "an older format!")), marshal.dumps((rendered.FORMAT, "KEY", b"1!")),
], ids=lambda c: c[:24].hex() or "empty")
def test_a_damaged_or_foreign_kept_file_is_rendered_again(probe, content):
    folder = rendered.pycache._places("memo_probe")[1]
    folder.mkdir(parents=True, exist_ok=True)
    key = probe_key(1)
    (folder / (rendered.PREFIX + key)).write_bytes(content.replace(b"KEY", key.encode()))
    assert templating.render("memo_probe", "t.j2", x=1) == "1!"
    rendered._save()
    assert kept_texts("memo_probe") == ["1!"]


def test_a_render_reads_only_its_own_kept_text(probe, monkeypatch):
    """However many texts are kept, a render opens the one file named by its key."""
    for i in range(20):
        templating.render("memo_probe", "t.j2", x=i)
    rendered._save()
    new_render_process()
    opened = []
    real = rendered.pycache.read_marshal
    monkeypatch.setattr(rendered.pycache, "read_marshal", lambda pkg, name: opened.append(name) or real(pkg, name))
    monkeypatch.setattr(jinja_environment, "render", no_jinja)
    assert templating.render("memo_probe", "t.j2", x=7) == "7!"
    assert opened == [rendered.PREFIX + probe_key(7)]


def test_kept_texts_are_bounded_the_oldest_others_go_first(probe, monkeypatch):
    monkeypatch.setattr(rendered, "MAX_KEPT", 3)
    for i in range(5):  # one process wrote more than the bound: its last three stay
        templating.render("memo_probe", "t.j2", x=i)
    rendered._save()
    assert kept_texts("memo_probe") == ["2!", "3!", "4!"]
    folder = rendered.pycache._places("memo_probe")[1]
    for age, i in enumerate((2, 3, 4)):  # written 2 first, then 3, then 4 (as a time stamp says it)
        os.utime(folder / (rendered.PREFIX + probe_key(i)), ns=(10**18 + age, 10**18 + age))
    new_render_process()
    templating.render("memo_probe", "t.j2", x=2)  # the oldest, used again: stays over the others
    templating.render("memo_probe", "t.j2", x=9)
    rendered._save()
    assert kept_texts("memo_probe") == ["2!", "4!", "9!"]


def test_nothing_is_kept_where_python_writes_no_bytecode(probe, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    templating.render("memo_probe", "t.j2", x=1)
    rendered._save()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert kept_texts("memo_probe") == []


def test_jinja2s_random_global_is_gone():
    """A render must be a function of its inputs; lipsum() is random text."""
    assert "lipsum" not in jinja_environment.template_environment("shipyard.definitions").globals


def test_the_filters_code_is_all_in_the_key():
    """The key holds the sources of CODE: every filter must come from them (or the standard library), and the
    escaping module must read no other shipyard module, or an edit there would go unseen."""
    modules = {f.__module__ for f in jinja_environment.FILTERS.values()}
    assert modules <= {"shipyard.escaping", "shlex"}
    tree = ast.parse(Path(escaping.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.startswith("shipyard")} == {"shipyard.errors"}
    assert {Path(m.__file__).name for m in (templating, jinja_environment, escaping, rendered)} <= set(rendered.CODE)


def test_the_definitions_context_is_plain_data(make_project):
    """What `invoke render` keeps: every environment's definition, Dockerfile and test script have a key."""
    from shipyard.definitions import render

    reg = make_project("repo")
    calls = []
    real = rendered.key

    def spy(package, template, trim, context):
        calls.append((template, real(package, template, trim, context)))
        return calls[-1][1]

    with pytest.MonkeyPatch.context() as m:
        m.setattr(rendered, "key", spy)
        for env in reg.environments.values():
            render.rendered_files(reg, env)
    assert calls and all(k is not None for _, k in calls)
    assert {t for t, _ in calls} == {"definition.def.j2", "Dockerfile.j2", "test.sh.j2"}


def test_a_second_render_all_loads_no_jinja2_and_writes_the_same_files(tmp_path):
    """Two `render --all` processes in a project of the test's own: the second takes every text from the first's
    kept file (Jinja2 is never imported) and leaves definitions/ byte for byte as the first did."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(ROOT / "registry.yaml", proj)
    shutil.copytree(ROOT / "definitions", proj / "definitions")

    def same_definitions():
        assert {p.name: p.read_bytes() for p in (proj / "definitions").iterdir()} == \
            {p.name: p.read_bytes() for p in (ROOT / "definitions").iterdir()}

    runs = task_processes(proj, tmp_path / "prefix", ["render", "--all"], after=same_definitions)
    seen = [jinja for _, jinja in runs]
    assert seen == [True, False]
