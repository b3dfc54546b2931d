"""The registry's schema keeps JSON Schema's meaning when Python checks it: a pattern's ``$`` is the end of the
value (ECMA-262), so a value that ends in a line break is refused, never let through to a generated file."""

from __future__ import annotations

import pytest

from shipyard.errors import ShipyardError
from shipyard.registry import loader

CLUSTER = "clusters: {c: {runtime: host, fabric: ib, gpus_per_node: 1, scheduler: {partition: p}%s}}\n"


def load(text: str) -> None:
    data, lines = loader.parse_yaml(text, "t.yaml")
    loader.validate(data, lines, "t.yaml")


@pytest.mark.parametrize("text, where", [
    ("environments: {a: {torch: \"2.3.1\\n\"}}\n" + CLUSTER % "", "t.yaml:1: environments.a.torch:"),
    ("environments: {a: {torch: \"2.3.1\"}}\n" + CLUSTER % ", env: {NCCL_DEBUG: \"INFO\\n\"}",
     "t.yaml:2: clusters.c.env.NCCL_DEBUG:"),
])
def test_a_value_ending_in_a_line_break_is_refused(text, where):
    with pytest.raises(ShipyardError) as exc:
        load(text)
    assert str(exc.value).startswith(where) and "(a line break at its end?)" in str(exc.value)
    load(text.replace("\\n", ""))  # the same value without it is valid


@pytest.mark.parametrize("pattern, value, matches", [
    ("^[0-9]+$", "12", True),
    ("^[0-9]+$", "12\n", False),
    ("^[$]+$", "$$", True),
    (r"^a\$$", "a$", True),
    (r"^a\$$", "a$\n", False),
])
def test_dollar_is_the_end_of_the_value(pattern, value, matches):
    import re

    assert bool(re.search(loader._ecma_dollar(pattern), value)) is matches
