"""definitions/<env>.lock: inputs from the model, the uv argument contract, real resolutions against the package
index (marked pypi, each with the fixed cut-off CUTOFF so the answer cannot drift; deterministic, hashed, installable by pip with --require-hashes), staleness, and a definition that installs from
the lock passing spython and shellcheck."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_lock import CUTOFF, REGISTRY_TEXT
from helpers_registry import sections, shellcheck
from spython.main.parse.parsers import SingularityParser

from shipyard import project as paths
from shipyard.commands.context import Context
from shipyard.commands.definitions import render as render_cmd
from shipyard.definitions import pylock as lock
from shipyard.definitions import render as definitions
from shipyard.errors import ShipyardError


def test_inputs_come_from_the_model(lock_project):
    reg = lock_project()
    assert lock.lock_inputs(reg.environment("e")) == [
        "torch==2.3.1", "torchvision==0.18.1", "torchaudio==2.3.1", "numpy==1.26.4"]
    env = reg.environment("nccl-override")
    assert lock.lock_inputs(env) == ["torch==2.3.1", "torchvision==0.18.1", "nvidia-nccl-cu12==2.21.5"]
    assert lock.lock_overrides(env) == ["nvidia-nccl-cu12==2.21.5"]
    assert lock.lock_inputs(reg.environment("tiny")) == ["six==1.16.0"], "stack: base locks only the extras"
    assert lock.lock_overrides(reg.environment("e")) == []


def test_uv_argv_contract(lock_project):
    reg = lock_project()
    argv = lock.uv_argv("uv", reg.environment("nccl-override"), CUTOFF)
    assert argv[:4] == ["uv", "pip", "compile", "requirements.in"]
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--python-platform"] == "x86_64-manylinux_2_28"
    assert pairs["--python-version"] == "3.11"
    assert pairs["--exclude-newer"] == CUTOFF
    assert "--default-index" not in argv, "index URLs (credentials) go through uv's environment, not argv"
    # no index named: uv's own default (PyPI); a site mirror given with --index-url goes through the environment
    assert "UV_DEFAULT_INDEX" not in lock.uv_environ(reg.environment("nccl-override"), base={"UV_DEFAULT_INDEX": "x"})
    assert lock.uv_environ(reg.environment("nccl-override"), "https://mirror.example/simple",
                           base={})["UV_DEFAULT_INDEX"] == "https://mirror.example/simple"
    assert pairs["--override"] == "overrides.txt"
    assert "--generate-hashes" in argv and "--no-config" in argv
    assert "--extra-index-url" not in argv, "the default CUDA variant comes from PyPI alone"


def test_non_default_cuda_variant_adds_the_pytorch_index(lock_project):
    env = lock_project().environment("cu118")
    argv = lock.uv_argv("uv", env, CUTOFF)
    pairs = dict(zip(argv, argv[1:]))
    assert lock.uv_environ(env, base={"UV_INDEX": "x"}) == {
        "UV_EXTRA_INDEX_URL": "https://download.pytorch.org/whl/cu118"}
    assert pairs["--index-strategy"] == "unsafe-best-match"
    assert pairs["--python-version"] == "3.10"


@pytest.mark.parametrize("value,want", [("2026-11-01", "2026-11-01T00:00:00Z"),
                                        ("2026-11-01T12:30:00Z", "2026-11-01T12:30:00Z")])
def test_cutoff_is_normalized_to_utc_timestamp(value, want):
    assert lock.normalize_cutoff(value) == want


@pytest.mark.parametrize("value", ["yesterday", "2026-13-01", "2026-11-01 12:00", "2026-11-01T12:00:00+01:00"])
def test_bad_cutoff_is_a_one_line_error(value):
    with pytest.raises(ShipyardError, match="--exclude-newer"):
        lock.normalize_cutoff(value)


def _requirement_blocks(text: str) -> dict[str, list[str]]:
    """name==version -> its hashes, from a lock body."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][^ ]*==[^ ]+) \\$", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur and line.strip().startswith("--hash=sha256:"):
            out[cur].append(line.strip().split(":", 1)[1].rstrip(" \\"))
    return out


@pytest.mark.pypi
def test_lock_is_deterministic_complete_and_hashed(lock_project):
    reg = lock_project()
    path = definitions.relock(reg, reg.environment("e"), exclude_newer=CUTOFF)
    first = path.read_bytes()
    path.unlink()
    second = definitions.relock(reg, reg.environment("e"), exclude_newer=CUTOFF).read_bytes()
    assert first == second
    text = first.decode()
    blocks = _requirement_blocks(text)
    for req in ("torch==2.3.1", "torchvision==0.18.1", "torchaudio==2.3.1", "numpy==1.26.4",
                "nvidia-nccl-cu12==2.20.5", "triton==2.3.1"):
        assert req in blocks, f"{req} missing from the closure"
    for req, hashes in blocks.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), req
    header = lock.read_header(path)
    assert header["exclude-newer"] == CUTOFF and header["python"] == "3.11"
    assert header["inputs-sha256"] == lock.inputs_digest(reg.environment("e"))
    assert str(path.parent) not in text and "/tmp" not in text, "temporary paths leaked into the lock"
    assert not list(path.parent.glob("*.tmp"))


@pytest.mark.pypi
def test_relock_keeps_the_recorded_cutoff(lock_project):
    reg = lock_project()
    definitions.relock(reg, reg.environment("tiny"), exclude_newer="2025-06-01")
    path = definitions.relock(reg, reg.environment("tiny"))  # no --exclude-newer: the lock's own cut-off, not today
    assert lock.read_header(path)["exclude-newer"] == "2025-06-01T00:00:00Z"


@pytest.mark.pypi
def test_garbled_cutoff_in_header_names_the_lock(lock_project):
    reg = lock_project()
    path = definitions.relock(reg, reg.environment("tiny"), exclude_newer=CUTOFF)
    path.write_text(path.read_text().replace(CUTOFF, "last tuesday"))
    with pytest.raises(ShipyardError, match=r"tiny.lock: header exclude-newer 'last tuesday'"):
        definitions.relock(reg, reg.environment("tiny"))


@pytest.mark.pypi
def test_nccl_override_is_locked_and_visible(lock_project):
    reg = lock_project()
    text = definitions.relock(reg, reg.environment("nccl-override"), exclude_newer=CUTOFF).read_text()
    blocks = _requirement_blocks(text)
    assert "nvidia-nccl-cu12==2.21.5" in blocks and "nvidia-nccl-cu12==2.20.5" not in blocks
    assert "torchaudio==2.3.1" not in blocks
    assert "# overrides (replace what the torch wheel pins; install the lock with --no-deps):" in text


@pytest.mark.pypi
def test_stale_reason(lock_project):
    reg = lock_project()
    env = reg.environment("tiny")
    assert lock.stale_reason(reg, env) is None, "no lock: not stale"
    definitions.relock(reg, reg.environment("tiny"), exclude_newer=CUTOFF)
    assert lock.stale_reason(reg, env) is None
    reg2 = lock_project(REGISTRY_TEXT.replace("six==1.16.0", "six==1.17.0"))
    reason = lock.stale_reason(reg2, reg2.environment("tiny"))
    assert reason and "invoke lock tiny" in reason and "\n" not in reason
    path = paths.lock_path(reg, "tiny")
    path.write_text("six==1.16.0\n")
    assert "no shipyard-lock header" in lock.stale_reason(reg, env)


@pytest.mark.pypi
def test_unresolvable_pin_is_one_line_error_and_writes_nothing(lock_project):
    """Refused because the pin does not exist: the same call with a pin that exists locks, and the refusal names
    the missing version (offline, or with the index down, both pins would fail alike and prove nothing)."""
    reg = lock_project()
    assert definitions.relock(reg, reg.environment("tiny"), exclude_newer=CUTOFF).exists(), "six==1.16.0 exists and must lock"
    paths.lock_path(reg, "tiny").unlink()
    reg = lock_project(REGISTRY_TEXT.replace("six==1.16.0", "six==99.0.0"))
    with pytest.raises(ShipyardError, match=r"environments.tiny: uv could not lock") as exc:
        definitions.relock(reg, reg.environment("tiny"), exclude_newer=CUTOFF)
    assert "\n" not in str(exc.value)
    assert "no version of six==99.0.0" in str(exc.value), str(exc.value)
    assert not paths.lock_path(reg, "tiny").exists()


@pytest.mark.pypi
def test_pip_installs_from_the_lock_with_require_hashes(lock_project, tmp_path):
    """The real pip accepts the lock exactly as the definition uses it (--require-hashes --no-deps)."""
    reg = lock_project()
    path = definitions.relock(reg, reg.environment("tiny"), exclude_newer=CUTOFF)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps",
                          "--target", str(tmp_path / "site"), "-r", str(path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "site" / "six.py").exists()
    # and refuses bytes that do not match the recorded hash
    path.write_text(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, path.read_text()))
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps",
                          "--target", str(tmp_path / "site2"), "-r", str(path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode != 0 and "HASH" in res.stderr.upper()


@pytest.mark.pypi
def test_definition_from_lock_parses_and_passes_shellcheck(lock_project, tmp_path):
    reg = lock_project()
    definitions.relock(reg, reg.environment("e"), exclude_newer=CUTOFF)
    env = reg.environment("e")
    text = definitions.render_definition(env, reg)
    assert "--require-hashes" in text and "e.lock" in text
    path = tmp_path / "e.def"
    path.write_text(text)
    (stage,) = SingularityParser(str(path)).recipe.values()
    assert any("--require-hashes" in line for line in stage.install)
    for name in ("post", "test"):
        body = sections(text).get(name)
        if body:
            res = shellcheck(body)
            assert res.returncode == 0, f"%{name}: {res.stdout}"


@pytest.mark.pypi
def test_invoke_lock_task_writes_and_reports(lock_project, invoke):
    reg = lock_project()
    env = {**os.environ, "SHIPYARD_REGISTRY": str(reg.path)}
    root = Path(__file__).resolve().parents[2]
    res = invoke("lock", "tiny", "--exclude-newer", "2026-11-01", cwd=root, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    # then the base image: pinned where nvcr.io answers, else unpinned with the reason (tests/containers/
    # test_base_digest.py pins one through a mirror of the tests' own)
    said = res.stdout.strip()
    assert said.startswith("wrote definitions/tiny.lock: 1 packages, 2 sha256 hashes, exclude-newer "
                           "2026-11-01T00:00:00Z; base nvcr.io/nvidia/pytorch:24.05-py3 "), said
    header = lock.read_header(paths.lock_path(reg, "tiny"))
    assert header["base"] == "nvcr.io/nvidia/pytorch:24.05-py3" and header["base-digest"] in said.lower()
    res = invoke("lock", "tiny", "--exclude-newer", "soon", cwd=root, env=env, timeout=120)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


@pytest.mark.pypi
def test_render_check_fails_on_a_stale_lock_alone(lock_project):
    """`invoke render --check` (the lead's renderer) asks stale_reason: a lock older than the registry fails it even
    when every rendered file is current."""
    import io

    reg = lock_project()
    definitions.relock(reg, reg.environment("tiny"), exclude_newer=CUTOFF)
    reg2 = lock_project(REGISTRY_TEXT.replace("six==1.16.0", "six==1.17.0"))
    with pytest.raises(ShipyardError, match="render tiny refused"):  # check refuses the stale lock ...
        render_cmd(Context(reg2, out=io.StringIO()), "tiny")
    assert render_cmd(Context(reg2, out=io.StringIO()), "tiny", force=True) == 0  # ... --force renders
    out = io.StringIO()
    assert render_cmd(Context(reg2, out=out), "tiny", check=True) == 1
    stale = [ln for ln in out.getvalue().splitlines() if ln.startswith("  ")]
    assert len(stale) == 1 and "tiny.lock" in stale[0] and "invoke lock tiny" in stale[0]
    definitions.relock(reg2, reg2.environment("tiny"))  # relock (same cut-off) -> fresh again
    assert render_cmd(Context(reg2, out=io.StringIO()), "tiny", check=True) == 0


@pytest.mark.pypi  # uv must try the (unreachable) index for real; offline it would not name it
def test_index_credentials_never_reach_the_lock_or_errors(lock_project, monkeypatch):
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    env = lock_project().environment("tiny")
    header = lock.render_header(env, CUTOFF, "https://alice:s3cret@mirror.invalid/simple")
    assert "s3cret" not in header and "alice" not in header
    assert "# index: https://***@mirror.invalid/simple" in header
    with pytest.raises(ShipyardError) as exc:  # an unreachable index (.invalid never resolves): uv fails
        lock.compile_lock(env, CUTOFF, "https://alice:s3cret@mirror.invalid/simple")
    assert "s3cret" not in str(exc.value) and "mirror.invalid" in str(exc.value)


def test_index_credentials_reach_uv_through_its_environment_not_its_argv(lock_project, tmp_path):
    """A fake uv records its argv (what `ps` shows every user) and environment; the credentials are only in the
    latter. (A URL with user:token must never be an argument.)"""
    rec = tmp_path / "rec.json"
    fake = tmp_path / "uv"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv, 'env': dict(os.environ)}}, open({str(rec)!r}, 'w'))\n"
                    "print('six==1.16.0 \\\\\\n    --hash=sha256:' + '0' * 64)\n")
    fake.chmod(0o700)
    env = lock_project().environment("tiny")
    lock.compile_lock(env, CUTOFF, "https://alice:s3cret@mirror.invalid/simple", uv_bin=str(fake))
    seen = json.loads(rec.read_text())
    assert not any("s3cret" in a for a in seen["argv"])
    assert seen["env"]["UV_DEFAULT_INDEX"] == "https://alice:s3cret@mirror.invalid/simple"


def _recording_uv(tmp_path):
    rec = tmp_path / "rec.json"
    fake = tmp_path / "uv"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv, 'env': dict(os.environ)}}, open({str(rec)!r}, 'w'))\n"
                    "print('six==1.16.0 \\\\\\n    --hash=sha256:' + '0' * 64)\n")
    fake.chmod(0o700)
    return fake, rec


@pytest.mark.parametrize("url", ["https://alice:s3cret@mirror.invalid/simple", "https://tok3n@mirror.invalid/simple"])
def test_an_index_url_with_credentials_on_the_command_line_is_refused(lock_project, url, monkeypatch, tmp_path):
    from shipyard.commands import definitions as definitions_commands
    reg = lock_project()
    fake, rec = _recording_uv(tmp_path)
    monkeypatch.setattr(lock, "_uv_bin", lambda: str(fake))
    monkeypatch.chdir(reg.root)
    ctx = Context.load(reg.path)
    with pytest.raises(ShipyardError, match="--index-url .*: credentials in the URL .* ~/.netrc .*UV_DEFAULT_INDEX") \
            as exc:
        definitions_commands.lock(ctx, "tiny", index_url=url)
    assert "s3cret" not in str(exc.value) and "tok3n" not in str(exc.value) and "\n" not in str(exc.value)
    assert not rec.exists()  # uv never ran


def test_the_index_with_its_credentials_comes_from_uvs_environment(lock_project, monkeypatch, tmp_path):
    """The URL with credentials in UV_DEFAULT_INDEX (or UV_INDEX_URL): it reaches uv through its environment, and the
    lock's header names it without them; a URL without credentials on the flag leaves them to uv's netrc."""
    from shipyard.commands import definitions as definitions_commands
    reg = lock_project()
    fake, rec = _recording_uv(tmp_path)
    monkeypatch.setattr(lock, "_uv_bin", lambda: str(fake))
    monkeypatch.chdir(reg.root)
    monkeypatch.delenv("UV_DEFAULT_INDEX", raising=False)
    monkeypatch.setenv("UV_INDEX_URL", "https://alice:s3cret@mirror.invalid/simple")
    definitions_commands.lock(Context.load(reg.path), "tiny")
    seen = json.loads(rec.read_text())
    assert seen["env"]["UV_DEFAULT_INDEX"] == "https://alice:s3cret@mirror.invalid/simple"
    assert "UV_INDEX_URL" not in seen["env"] and not any("s3cret" in a for a in seen["argv"])
    text = paths.lock_path(reg, "tiny").read_text()
    assert "s3cret" not in text and "# index: https://***@mirror.invalid/simple" in text
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    definitions_commands.lock(Context.load(reg.path), "tiny", index_url="https://mirror.invalid/simple")
    seen = json.loads(rec.read_text())
    assert seen["env"]["UV_DEFAULT_INDEX"] == "https://mirror.invalid/simple"
    assert seen["env"]["NETRC"] == str(tmp_path / "netrc")  # uv reads the credentials there
