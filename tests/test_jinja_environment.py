"""shipyard.jinja_environment: a template's compiled code is kept beside the package's bytecode, and an edited template
compiles anew."""

from __future__ import annotations

import jinja2
import pytest

from shipyard import jinja_environment


def environment(source: str) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.DictLoader({"t.j2": source}),
                              bytecode_cache=jinja_environment.PackageBytecodeCache("shipyard", "keep"))


def test_a_compiled_template_is_kept_and_checked_against_its_source(bytecode_folder, monkeypatch):
    assert environment("{{ x }}!").get_template("t.j2").render(x=1) == "1!"
    assert [p.name.split(".", 1)[1] for p in bytecode_folder.iterdir()] == [f"keep-jinja2-{jinja2.__version__}.jinja2"]

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled although its code was kept")

    with monkeypatch.context() as m:
        m.setattr(jinja2.Environment, "_compile", no_compiling)
        assert environment("{{ x }}!").get_template("t.j2").render(x=2) == "2!"  # from the kept code
        with pytest.raises(AssertionError, match="compiled although"):
            environment("{{ x }}?").get_template("t.j2")  # an edited source is compiled, not taken from the file
    assert environment("{{ x }}?").get_template("t.j2").render(x=3) == "3?"


def test_every_package_environment_keeps_its_compiled_templates():
    env = jinja_environment.template_environment("shipyard.launch", True)
    assert isinstance(env.bytecode_cache, jinja_environment.PackageBytecodeCache)
    assert env.bytecode_cache.variant != jinja_environment.template_environment("shipyard.launch", False).bytecode_cache.variant
