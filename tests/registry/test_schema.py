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


@pytest.mark.parametrize("extra, key, valid", [
    (", cpus_per_node: " + "9" * 31, "clusters.c.cpus_per_node", "1 to 65533"),
    (", cpus_per_node: 65534", "clusters.c.cpus_per_node", "1 to 65533"),
    (", nodes: 4294967294", "clusters.c.nodes", "1 to 4294967293"),
    (", gpus: [{model: H100, arch: sm_90}], gpus_per_node: 70000", "clusters.c.gpus_per_node", "0 to 65533"),
    (", scheduler: {partition: p, build_cpus: 100000}", "clusters.c.scheduler.build_cpus", "1 to 65533"),
    (", scheduler: {partition: p, max_array_size: 4000002}", "clusters.c.scheduler.max_array_size",
     "1 to 4000001"),
    (", scheduler: {partition: p, partitions: {p: {cpus_per_node: 70000}}}",
     "clusters.c.scheduler.partitions.p.cpus_per_node", "1 to 65533"),
])
def test_integers_slurm_reads_are_bounded_by_slurm(extra, key, valid):
    text = "environments: {a: {torch: \"2.3.1\"}}\nclusters: {c: {runtime: host, fabric: ib, gpus_per_node: 1, " \
        "scheduler: {partition: p}%s}}\n" % extra
    text = text.replace("scheduler: {partition: p}, scheduler:", "scheduler:")
    if "gpus_per_node: 70000" in extra:
        text = text.replace("gpus_per_node: 1, ", "")
    with pytest.raises(ShipyardError) as exc:
        load(text)
    msg = str(exc.value)
    assert f": {key}:" in msg and f"valid is {valid}" in msg and "\n" not in msg, msg
    assert "9" * 31 not in msg


def test_the_largest_values_slurm_takes_load():
    load("environments: {a: {torch: \"2.3.1\"}}\nclusters: {c: {runtime: host, fabric: ib, gpus_per_node: 65533, "
         "cpus_per_node: 65533, nodes: 4294967293, scheduler: {partition: p, max_array_size: 4000001}}}\n")


def test_a_memory_size_beyond_slurms_is_one_line():
    assert loader.mem_mb("8388607T") == 8388607 * 1024 * 1024
    for text in ("9" * 31 + "G", "9223372036854775808", "9000000000000T"):
        with pytest.raises(ShipyardError, match="Slurm reads") as exc:
            loader.mem_mb(text)
        assert "\n" not in str(exc.value)


def test_a_text_that_passed_is_not_validated_again_and_any_other_text_is(bytecode_folder, monkeypatch):
    valid = "environments: {a: {torch: \"2.3.1\"}}\n" + CLUSTER % ""
    calls = []
    validate = loader.validate
    monkeypatch.setattr(loader, "validate", lambda *a: calls.append(a[2]) or validate(*a))

    def load_text(text):
        data, lines = loader.parse_yaml(text, "t.yaml")
        loader.validate_text(data, lines, "t.yaml", text)

    load_text(valid)
    load_text(valid)
    assert calls == ["t.yaml"]  # the second time, the kept hash stood in for the validation
    with pytest.raises(ShipyardError, match="environments.a.torch"):
        load_text(valid.replace('"2.3.1"', '"2.3.1\\n"'))  # one character more: validated, and refused
    with pytest.raises(ShipyardError, match="environments.a.torch"):
        load_text(valid.replace('"2.3.1"', '"2.3.1\\n"'))  # a refused text is never kept
    assert len(calls) == 3
