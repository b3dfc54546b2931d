"""Property: no mutated registry makes the loader or `check` raise anything but a one-line ShipyardError."""

from __future__ import annotations

import copy

import pytest
import yaml
from fuzz_budget import examples
from helpers_registry import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shipyard import registry
from shipyard.definitions import render as definitions
from shipyard.errors import ShipyardError
from shipyard.registry import compat

SHIPPED = yaml.safe_load((ROOT / "registry.yaml").read_text())
SHIPPED_TEXT = (ROOT / "registry.yaml").read_text()
# CI (CI=true, .ci/run) tries 600 mutated registries, a developer's run a fifth of that (tests/fuzz_budget.py; each
# is a load, a check and a render of every environment). A failure hypothesis finds is replayed first on every later
# run from its example database (.hypothesis/, git-ignored), whatever the count.
MUTATION_EXAMPLES = examples(600)

values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["2.3.1", "12.4", "13.0", "3.11", "ubuntu24.04", "sm_70", "efa", "pyxis", "pytorch-2.3",
                     "numpy==1", "numpy", "{{ X }}", "nvidia/cuda:12.4.0-cudnn8-runtime-ubuntu22.04", "580"]),
    st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
)


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


ALL_PATHS = [p for p in paths(SHIPPED) if p]


def mutate(doc, path, op, value, key):
    doc = copy.deepcopy(doc)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if op == "set":
        parent[last] = value
    elif op == "delete":
        del parent[last]
    elif op == "rename" and isinstance(parent, dict):
        parent[str(last) + key] = parent.pop(last)
    elif op == "add" and isinstance(parent[last], dict):
        parent[last][key or "x"] = value
    return doc


# one to four edits of the shipped registry: (path, set|delete|rename|add, value, key suffix)
mutations = st.lists(st.tuples(st.sampled_from(ALL_PATHS), st.sampled_from(["set", "delete", "rename", "add"]), values,
                               st.text(max_size=4)), min_size=1, max_size=4)


def mutated(muts) -> dict:
    """The shipped registry with ``muts`` applied (an edit that does not fit the document is skipped)."""
    doc = SHIPPED
    for path, op, value, key in muts:
        try:
            doc = mutate(doc, path, op, value, key)
        except (KeyError, IndexError, TypeError):
            continue
    return doc


@settings(max_examples=MUTATION_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(muts=mutations)
def test_mutated_registries_never_traceback(muts):
    doc = mutated(muts)
    text = yaml.safe_dump(doc, sort_keys=False)
    try:
        reg = registry.load_text(text, "fuzz.yaml")
        problems = compat.check_all(reg)
        rendered = {name: definitions.render_definition(env) for name, env in reg.environments.items()}
    except ShipyardError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.yaml")
        return
    accepted(doc, reg, problems, rendered)


def accepted(doc: dict, reg, problems: list, rendered: dict) -> None:
    """What a registry the loader accepted must give: the document's environments and clusters, defaults that name
    one of each, findings that say where and what in one line, and a definition per environment that names it."""
    assert set(reg.environments) == set(doc["environments"]) and set(reg.clusters) == set(doc["clusters"])
    defaults = doc.get("defaults") if isinstance(doc.get("defaults"), dict) else {}
    if defaults.get("environment") is not None:  # without one, a command must be given the name
        assert reg.environment(None).name in reg.environments
    if defaults.get("cluster") is not None:
        assert reg.cluster(None).name in reg.clusters
    for pr in problems:
        assert pr.severity in (compat.ERROR, compat.WARN) and pr.environment in ("", *reg.environments), pr
        assert pr.key and pr.message and "\n" not in pr.message, pr
    for name, text in rendered.items():
        assert f"(environment {name})" in text.splitlines()[0], text[:200]


def test_the_shipped_registry_passes_what_an_accepted_one_must():
    """The success branch's assertions hold for the unmutated registry, and fail for a wrong result."""
    reg = registry.load_text(SHIPPED_TEXT, "fuzz.yaml")
    rendered = {name: definitions.render_definition(env) for name, env in reg.environments.items()}
    accepted(SHIPPED, reg, compat.check_all(reg), rendered)
    name = next(iter(rendered))
    with pytest.raises(AssertionError):
        accepted(SHIPPED, reg, [], {**rendered, name: "# a definition of another environment\n"})


@settings(max_examples=examples(200), deadline=None)
@given(pos=st.integers(0, len(SHIPPED_TEXT) - 1), junk=st.text(min_size=1, max_size=3))
def test_corrupted_yaml_text_never_tracebacks(pos, junk):
    text = SHIPPED_TEXT[:pos] + junk + SHIPPED_TEXT[pos + 1:]
    try:
        reg = registry.load_text(text, "fuzz.yaml")
        compat.check_all(reg)
    except ShipyardError as exc:
        assert "\n" not in str(exc)
