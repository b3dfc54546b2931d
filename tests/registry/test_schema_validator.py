"""The generated schema validator (shipyard/registry/schema_validator.py) is current with registry.schema.json and
never accepts a registry that jsonschema rejects; the start-up commands import no heavy library."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import yaml
from helpers_registry import ROOT
from hypothesis import HealthCheck, given, settings
from test_registry_fuzz import mutated, mutations

from shipyard.dev import schema_codegen
from shipyard.registry import loader, schema_validator


def test_generated_validator_is_from_the_current_schema():
    assert schema_validator.SCHEMA_SHA256 == schema_codegen.schema_sha256(), \
        "registry.schema.json changed: run `python -m shipyard.dev.schema_codegen`"


@pytest.mark.skipif(importlib.util.find_spec("fastjsonschema") is None, reason="fastjsonschema (test extras) missing")
def test_generated_validator_is_what_codegen_writes():
    import fastjsonschema  # lazy: only here, where the generator runs

    if fastjsonschema.VERSION != schema_validator.VERSION:
        pytest.skip(f"fastjsonschema {fastjsonschema.VERSION} installed, module made with {schema_validator.VERSION}")
    assert schema_codegen.TARGET.read_text() == schema_codegen.generate()


def jsonschema_errors(data) -> list:
    import jsonschema  # lazy: the reference implementation, as the loader uses it for errors

    return list(jsonschema.Draft202012Validator(loader.schema()).iter_errors(data))


def fast_accepts(data) -> bool:
    try:
        schema_validator.validate(data)
    except schema_validator.JsonSchemaValueException:
        return False
    return True


def test_shipped_registry_passes_both():
    data, _ = loader.parse_yaml((ROOT / "registry.yaml").read_text(), "registry.yaml")
    assert fast_accepts(data) and jsonschema_errors(data) == []


@pytest.mark.parametrize("text", [
    "environments: {a: {torch: '2.3.1\\n'}}\nclusters: {c: {runtime: host, fabric: ib, gpus_per_node: 1, "
    "scheduler: {partition: p}}}\n",
    "environments: {a: {torchvision: 0}}\nclusters: {}\n",
    "environments: {a: {torchvision: false}}\nclusters: {c: {runtime: host, fabric: ib, gpus_per_node: 1.0, "
    "scheduler: {partition: p}}}\n",
])
def test_corners(text):
    """A trailing newline (jsonschema's `$` allows it), 0 for `const: false`, 1.0 as an integer."""
    data, _ = loader.parse_yaml(text, "t.yaml")
    if fast_accepts(data):
        assert jsonschema_errors(data) == []


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(muts=mutations)
def test_generated_validator_accepts_only_what_jsonschema_accepts(muts):
    data, _ = loader.parse_yaml(yaml.safe_dump(mutated(muts), sort_keys=False), "fuzz.yaml")
    # the other way round is allowed (the loader then asks jsonschema, which finds nothing): only slower
    if fast_accepts(data):
        assert jsonschema_errors(data) == []


HEAVY = ("jsonschema", "docker", "requests", "oras", "matplotlib", "spython")


@pytest.mark.parametrize("argv", [["render", "--all", "--check"], ["check"],
                                  ["launch", "--dry-run", "--", "examples/train.py"]], ids=" ".join)
def test_start_up_commands_import_no_heavy_library(argv):
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
            f"sys.argv = ['invoke', *{argv!r}]\n"
            "from invoke.main import program\n"
            "program.run()\n")
    env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "HEAVY []"
