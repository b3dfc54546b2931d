"""Rendered definitions: golden files, spython parsing, shellcheck of every shell section, determinism."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from helpers_registry import DATA, GOLDEN, ROOT, golden, sections, shellcheck
from spython.main.parse.parsers import SingularityParser

from shipyard import registry
from shipyard.commands.context import Context
from shipyard.commands.definitions import render as render_cmd
from shipyard.definitions import render as definitions

SHIPPED = registry.load(ROOT / "registry.yaml")
FEATURES = registry.load(DATA / "features.yaml")
MIRROR = registry.load(DATA / "mirror.yaml")
SNAPSHOT = registry.load(DATA / "snapshot.yaml")
CASES = [("shipped", SHIPPED, n) for n in SHIPPED.environments] + [("features", FEATURES, n) for n in FEATURES.environments] \
    + [("mirror", MIRROR, n) for n in MIRROR.environments] + [("snapshot", SNAPSHOT, n) for n in SNAPSHOT.environments]
IDS = [f"{kind}-{name}" for kind, _, name in CASES]


@pytest.mark.parametrize("kind,reg,name", CASES, ids=IDS)
def test_definition_golden(kind, reg, name):
    """Golden files of the tests' own (tests/golden/definitions/<kind>/), not the committed definitions/: those are
    the product, checked for staleness by `invoke render --all --check` (tests/registry/test_cli_registry.py)."""
    env = reg.environment(name)
    where = GOLDEN / "definitions" / kind
    golden(where / f"{name}.def", definitions.render_definition(env, reg))
    golden(where / f"{name}.Dockerfile", definitions.render_dockerfile(env, reg))
    golden(where / f"{name}.test.sh", definitions.render_test_script(env, reg))


@pytest.mark.parametrize("kind,reg,name", CASES, ids=IDS)
def test_definition_parses_with_spython(kind, reg, name, tmp_path):
    env = reg.environment(name)
    path = tmp_path / f"{name}.def"
    path.write_text(definitions.render_definition(env))
    recipe = SingularityParser(str(path)).recipe
    (stage,) = recipe.values()
    assert stage.fromHeader == env.base.value
    assert stage.install and stage.install[0] == "set -eu"
    assert any(line.startswith("export ") or "=" in line for line in stage.environ)
    assert stage.cmd == 'exec "$@"'
    labels = dict(line.split(" ", 1) for line in stage.labels)
    assert labels["org.shipyard.torch"] == env.torch.value
    assert labels["org.shipyard.spec-sha256"] == env.spec_hash
    text = path.read_text()
    for section in ("%labels", "%environment", "%post", "%test", "%runscript", "%help"):
        assert f"\n{section}\n" in text


@pytest.mark.parametrize("kind,reg,name", CASES, ids=IDS)
def test_shell_sections_pass_shellcheck(kind, reg, name):
    env = reg.environment(name)
    secs = sections(definitions.render_definition(env))
    for sec in ("post", "test", "runscript", "environment"):
        res = shellcheck("#!/bin/sh\n" + secs[sec])
        assert res.returncode == 0, f"%{sec} of {name}:\n{res.stdout}"
    res = shellcheck(definitions.render_test_script(env), "bash")
    assert res.returncode == 0, res.stdout


def test_pins_are_exactly_what_was_asked():
    env = SHIPPED.environment("pytorch-2.3")
    text = definitions.render_definition(env)
    assert "torch==2.3.1 torchvision==0.18.1 torchaudio==2.3.1" in text
    assert "From: nvidia/cuda:12.1.1-runtime-ubuntu22.04" in text
    assert "--index-url" not in text  # cu121 is the default variant: PyPI
    assert "python3.11 -m venv /opt/venv" in text
    assert "assert v == '2.20.5'" in text  # the NCCL torch reports
    assert "assert v == '12.1'" in text  # torch.version.cuda
    assert "nvidia-nccl" not in text  # no override: the wheel's own NCCL pin
    assert "/opt/venv/bin/python -m pip check" in text


def test_non_default_variant_uses_the_cuda_index():
    text = definitions.render_definition(FEATURES.environment("cu118-variant"))
    assert "--index-url https://download.pytorch.org/whl/cu118 torch==2.3.1" in text
    assert "From: nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04" in text


def test_nccl_override_is_visible_not_silent():
    text = definitions.render_definition(FEATURES.environment("nccl-override"))
    assert "NCCL override: torch 2.3.1 pins nvidia-nccl-cu12==2.20.5; 2.21.5 is installed on purpose" in text
    assert "--no-deps nvidia-nccl-cu12==2.21.5" in text
    assert "assert v == '2.21.5'" in text
    assert "torchaudio" not in text.split("%post", 1)[1].split("%test", 1)[0]


def test_apptainer_build_args_survive_rendering():
    env = FEATURES.environment("build-args")
    text = definitions.render_definition(env)
    assert "%arguments\n    DATA_DIR=/data\n" in text
    assert "export DATASET_ROOT='{{ DATA_DIR }}/imagenet'" in text
    docker = definitions.render_dockerfile(env)
    assert 'ENV DATASET_ROOT="${DATA_DIR}/imagenet"' in docker
    assert 'ARG DATA_DIR="/data"' in docker
    assert 'ENV TRICKY="it\'s \\$HOME and \\"quotes\\""' in docker


def test_stack_base_installs_no_torch():
    text = definitions.render_definition(FEATURES.environment("ngc-base"))
    post = text.split("%post", 1)[1].split("%test", 1)[0]
    assert "torch==" not in post and "venv" not in post
    assert "python3 -m pip install --no-cache-dir wandb==0.17.0" in post
    assert "From: nvcr.io/nvidia/pytorch:24.05-py3" in text


def test_rendering_is_deterministic_across_processes():
    code = ("from shipyard import registry; from shipyard.definitions import render as d; r = registry.load('registry.yaml'); "
            "print(''.join(d.render_definition(e, r) + d.render_dockerfile(e, r) for e in r.environments.values()))")
    a = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": "1", "PATH": "/usr/bin:/bin"}).stdout
    b = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": "2", "PATH": "/usr/bin:/bin"}).stdout
    assert a == b and len(a) > 1000


def test_render_check_detects_stale_and_render_fixes(tmp_path):
    shutil.copy(DATA / "features.yaml", tmp_path / "registry.yaml")
    reg = registry.load(tmp_path / "registry.yaml")
    out = open(tmp_path / "out.txt", "w")
    assert render_cmd(Context(reg, out=out), all_envs=True, check=True) == 1
    # no locks beside this registry, which `invoke check` refuses: --force renders anyway
    assert render_cmd(Context(reg, out=out), all_envs=True, force=True) == 0
    assert render_cmd(Context(reg, out=out), all_envs=True, check=True) == 0
    stale = tmp_path / "definitions" / "child.def"
    stale.write_text(stale.read_text().replace("2.21.5", "2.20.5"))
    (tmp_path / "definitions" / "gone.def").write_text("x")
    out.close()
    with open(tmp_path / "out2.txt", "w") as out2:
        assert render_cmd(Context(reg, out=out2), all_envs=True, check=True) == 1
    msg = (tmp_path / "out2.txt").read_text()
    assert "definitions/child.def (differs from registry.yaml)" in msg
    assert "definitions/gone.def (no such environment in registry.yaml)" in msg
    assert oct((tmp_path / "definitions" / "child.test.sh").stat().st_mode & 0o777) == "0o755"


def test_committed_definitions_are_current():
    """CI's guard: definitions/ must be what registry.yaml renders (run `invoke render --all`)."""
    with open("/dev/null", "w") as devnull:
        assert render_cmd(Context(SHIPPED, out=devnull), all_envs=True, check=True) == 0
