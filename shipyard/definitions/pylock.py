"""Hash-locked Python dependencies: ``definitions/<env>.lock`` from the environment's pins.

Why a lock: an image rebuilt next semester must install the same bytes. The definition installs from the lock with
``pip install --require-hashes``, so every wheel is pinned by version *and* sha256.

Why uv (``uv pip compile``) and not our own resolver: uv resolves for a *target* platform and Python
(``--python-platform x86_64-manylinux_2_28 --python-version X.Y``) without installing anything, emits every
candidate file's sha256 (``--generate-hashes``), supports overrides (the NCCL override below) and a time cut-off
(``--exclude-newer``). It ships as a PyPI wheel with its binary inside, found with ``uv.find_uv_bin()``.

Reproducibility of the resolution itself. uv reads live PyPI, so "the newest version that fits" moves every day.
The lock therefore records a cut-off timestamp in its header (``exclude-newer``) and passes it to uv: files uploaded
after it do not exist for the resolver. Re-locking (after a registry change, or on another machine) reuses the
cut-off of the existing lock, so unrelated packages do not drift; ``--exclude-newer`` moves it deliberately. The
value is a full RFC 3339 UTC timestamp, never a bare date, because uv reads a bare date in the local time zone.
Why the header and not registry.yaml: the cut-off is a fact about *this resolution*, like the hashes; keeping it
beside them means the lock alone reproduces itself, and registry.yaml keeps describing what is wanted.

The base image. The header also records the base image's digest (:mod:`shipyard.definitions.base_pin`): the lock is
the one file that says which bytes a rebuild must get, and the base is most of them.

Staleness. The header also carries ``inputs-sha256``: the sha256 of what the registry asks for (the requirement
lines, the overrides, the Python version, the platform and the torch variant index). :func:`stale_reason` recomputes
it from the model, so ``render --check`` can tell a stale lock without any network.

CUDA variants. The default CUDA variant of a torch release is on PyPI and locks here. Other variants live on the
PyTorch index (``environment.torch_index``, e.g. https://download.pytorch.org/whl/cu118), which this machine cannot
reach; :func:`uv_argv` adds it as ``--extra-index-url`` with ``--index-strategy unsafe-best-match`` (so the
``+cu118`` local version wins over PyPI's plain one while everything else still comes from PyPI). A site that can
reach that index runs the same ``invoke lock ENV`` there.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from shipyard import project
from shipyard.definitions import base_pin
from shipyard.definitions.base_pin import BasePin
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write
from shipyard.registry.model import Environment, Registry

PLATFORM = "x86_64-manylinux_2_28"
# No index named: uv resolves against its own default, PyPI, and the lock says so in words (a package registry's host
# name is never written into a user's files).
DEFAULT_INDEX = None
DEFAULT_INDEX_WORDS = "PyPI (uv's default index)"
HEADER_PREFIX = "# shipyard-lock"
_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact(text: str) -> str:
    """Drop ``user:token@`` from every URL in ``text``: index credentials never reach the lock or a message."""
    return _USERINFO.sub("***@", text)



def lock_inputs(env: Environment) -> list[str]:
    """The requirement lines the lock resolves: torch, torchvision, torchaudio, the NCCL override, extra pip pins.

    With ``stack: base`` the base image already carries torch and its companions, so only the extra pins are
    locked. An NCCL that differs from the one the torch wheel pins is listed here *and* passed to uv as an override
    (:func:`lock_overrides`): without the override the resolver would refuse it against torch's exact pin.
    """
    lines: list[str] = []
    if env.stack != "base":
        lines.append(f"torch=={env.torch.value}")
        for pin, name in ((env.torchvision, "torchvision"), (env.torchaudio, "torchaudio")):
            if pin.value:
                lines.append(f"{name}=={pin.value}")
    lines += list(env.pip)
    lines += lock_overrides(env)
    return lines


def lock_overrides(env: Environment) -> list[str]:
    """Requirements that replace what any package asks for (today: an explicit NCCL override)."""
    if env.stack != "base" and env.nccl_override and env.nccl_package:
        return [f"{env.nccl_package}=={env.nccl.value}"]
    return []


def inputs_digest(env: Environment) -> str:
    """sha256 of everything in the registry that decides the lock's content (see module docstring)."""
    blob = {
        "requirements": lock_inputs(env),
        "overrides": lock_overrides(env),
        "python": env.python.value,
        "platform": PLATFORM,
        "torch_index": env.torch_index.value if env.stack != "base" else None,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_header(path: Path) -> dict[str, str]:
    """``key: value`` pairs of the lock's ``# shipyard-lock`` header block ({} when the file has none)."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    lines = text.splitlines()
    if not lines or not lines[0].startswith(HEADER_PREFIX):
        return out
    for line in lines[1:]:
        if not line.startswith("# ") or ":" not in line:
            break
        key, _, value = line[2:].partition(":")
        out[key.strip()] = value.strip()
    return out


def stale_reason(reg: Registry, env: Environment) -> str | None:
    """None when ``definitions/<env>.lock`` is absent or matches the registry; else one line saying why it is stale."""
    path = project.lock_path(reg, env.name)
    if not path.exists():
        return None
    header = read_header(path)
    if "inputs-sha256" not in header:
        return f"{path}: no shipyard-lock header with inputs-sha256; regenerate it with `invoke lock {env.name}`"
    try:
        base_pin.lock_format(header, path)
        pin = base_pin.from_header(header, path)
    except ShipyardError as exc:
        return str(exc)
    if header["inputs-sha256"] != inputs_digest(env):
        return (f"{path}: locked for other inputs than environments.{env.name} now asks for "
                f"(torch/companions/NCCL/pip/python changed); run `invoke lock {env.name}`")
    if pin is not None and pin.reference != (env.base.value or ""):
        return (f"{path}: records the base image {pin.reference}, environments.{env.name}.base is "
                f"{env.base.value or 'none'}; run `invoke lock {env.name} --update-base`")
    return None


def recorded_base(reg: Registry, env: Environment) -> BasePin | None:
    """The base pin ``definitions/<env>.lock`` records (None: no lock, or one that records none)."""
    path = project.lock_path(reg, env.name)
    return base_pin.from_header(read_header(path), path)


def with_base(text: str, pin: BasePin | None) -> str:
    """The lock ``text`` with its header's base lines replaced by ``pin``'s (and ``lock-format`` set): the Python
    closure below is kept byte for byte, so the base moves without re-resolving anything else."""
    lines = text.splitlines(keepends=True)
    if not lines or not lines[0].startswith(HEADER_PREFIX):
        raise ShipyardError("not a shipyard lock (no shipyard-lock header)")
    end = 1
    while end < len(lines) and lines[end].startswith("# ") and ":" in lines[end]:
        end += 1
    keep = [ln for ln in lines[1:end] if ln[2:].partition(":")[0].strip() not in _BASE_KEYS]
    new = [f"# lock-format: {base_pin.FORMAT}\n"] + [ln + "\n" for ln in (pin.lines() if pin else [])]
    return lines[0] + "".join(new + keep + lines[end:])


_BASE_KEYS = ("lock-format", "base", "base-digest", "base-source", "base-unpinned")


def normalize_cutoff(value: str) -> str:
    """Accept ``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM:SSZ``; return the UTC timestamp form uv reads unambiguously."""
    if _DATE.match(value):
        value += "T00:00:00Z"
    if not _TS.match(value):
        raise ShipyardError(f"--exclude-newer {value!r}: expected a UTC date YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ")
    try:
        _dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise ShipyardError(f"--exclude-newer {value!r}: not a valid date") from None
    return value


def today_cutoff(now: _dt.datetime | None = None) -> str:
    """Midnight UTC of today: the cut-off of a first lock (day granularity, so same-day relocks agree)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y-%m-%dT00:00:00Z")


# uv's own variables for the index it resolves against, in uv's order: the whole URL, credentials included, may be
# given here instead of on shipyard's command line (an environment is readable only by its user and root)
INDEX_ENV = ("UV_DEFAULT_INDEX", "UV_INDEX_URL")


def index_from(flag: str | None, environ: dict | None = None) -> str | None:
    """The index ``invoke lock`` resolves against: ``--index-url`` (which must carry no credentials: a command line
    is readable by every user of the machine, and shipyard's stays there for the whole lock), else uv's own
    ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL`` from the environment, else None (PyPI). Credentials for an index given
    without them come from where uv itself reads them: ``~/.netrc`` (or ``$NETRC``) and ``uv auth login``."""
    environ = os.environ if environ is None else environ
    if flag is not None:
        if _USERINFO.search(flag):
            raise ShipyardError(f"--index-url {redact(flag)}: credentials in the URL stay in shipyard's command line, "
                                "which every user of this machine can read (ps); give the URL without them and put the "
                                "credentials in ~/.netrc (or $NETRC) or `uv auth login HOST`, or give the whole URL in "
                                "$UV_DEFAULT_INDEX instead of the flag")
        return flag
    return next((environ[k] for k in INDEX_ENV if environ.get(k)), None)


def uv_argv(uv_bin: str, env: Environment, cutoff: str) -> list[str]:
    """The ``uv pip compile`` command line, run in a directory holding requirements.in (and overrides.txt).

    Pure, so that the argument contract (platform, Python, hashes, cut-off, variant index) is unit-tested.
    ``--no-config`` keeps a user's uv.toml from changing the result; ``--no-header`` drops uv's own header, which
    would name temporary paths; shipyard writes its own. The index URLs are *not* on it: they may carry
    ``user:token@`` and a command line is readable by every user of the machine (``ps``); :func:`uv_environ` passes
    them through uv's environment variables instead.
    """
    argv = [
        uv_bin, "pip", "compile", "requirements.in",
        "--no-config", "--no-header", "--quiet",
        "--python-platform", PLATFORM,
        "--python-version", str(env.python.value),
        "--generate-hashes",
        "--exclude-newer", cutoff,
    ]
    if lock_overrides(env):
        argv += ["--override", "overrides.txt"]
    if env.stack != "base" and env.torch_index.value:
        argv += ["--index-strategy", "unsafe-best-match"]
    return argv


# index variables of uv that would otherwise mix a user's own indexes into the resolution
_UV_INDEX_VARS = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")


def uv_environ(env: Environment, index_url: str | None = DEFAULT_INDEX, base: dict | None = None) -> dict[str, str]:
    """uv's environment: ``base`` (the caller's) without its own index variables, plus the default index and, for a
    non-default CUDA variant, the PyTorch index as ``UV_DEFAULT_INDEX`` / ``UV_EXTRA_INDEX_URL``: credentials in a
    URL reach uv through its environment (readable only by the user and root), never its argv."""
    environ = {k: v for k, v in (os.environ if base is None else base).items() if k not in _UV_INDEX_VARS}
    if index_url:
        environ["UV_DEFAULT_INDEX"] = index_url
    if env.stack != "base" and env.torch_index.value:
        environ["UV_EXTRA_INDEX_URL"] = env.torch_index.value
    return environ


def render_header(env: Environment, cutoff: str, index_url: str | None, base: BasePin | None = None) -> str:
    """The comment block that makes the lock self-describing and its staleness decidable."""
    lines = [
        f"{HEADER_PREFIX} for environment {env.name}: written by `invoke lock {env.name}`; do not edit.",
        f"# lock-format: {base_pin.FORMAT}",
        *(base.lines() if base else []),
        f"# inputs-sha256: {inputs_digest(env)}",
        f"# exclude-newer: {cutoff}",
        f"# python: {env.python.value}",
        f"# platform: {PLATFORM}",
        f"# index: {redact(index_url) if index_url else DEFAULT_INDEX_WORDS}",
    ]
    if env.stack != "base" and env.torch_index.value:
        lines.append(f"# torch-index: {env.torch_index.value}")
    lines.append("#")
    lines.append("# requirements:")
    lines += [f"#   {r}" for r in lock_inputs(env)]
    if lock_overrides(env):
        lines.append("# overrides (replace what the torch wheel pins; install the lock with --no-deps):")
        lines += [f"#   {r}" for r in lock_overrides(env)]
    return "\n".join(lines) + "\n"


def _uv_bin() -> str:
    try:
        import uv  # lazy: only `invoke lock` runs uv
    except ImportError:  # pragma: no cover - uv is a declared dependency
        raise ShipyardError("the 'uv' Python package is not installed: pip install uv") from None
    return uv.find_uv_bin()


def compile_lock(env: Environment, cutoff: str, index_url: str | None = DEFAULT_INDEX,
                 uv_bin: str | None = None, base: BasePin | None = None) -> str:
    """Resolve ``env`` with uv and return the full lock text (header + pinned, hashed requirements)."""
    if not lock_inputs(env):
        raise ShipyardError(f"environments.{env.name}: nothing to lock (stack: base and no pip packages)")
    uv_bin = uv_bin or _uv_bin()
    with tempfile.TemporaryDirectory(prefix="shipyard-lock-") as tmp:
        Path(tmp, "requirements.in").write_text("\n".join(lock_inputs(env)) + "\n")
        if lock_overrides(env):
            Path(tmp, "overrides.txt").write_text("\n".join(lock_overrides(env)) + "\n")
        proc = subprocess.run(uv_argv(uv_bin, env, cutoff), cwd=tmp, capture_output=True, text=True,
                              env=uv_environ(env, index_url))
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        detail = redact(" ".join(lines[:6]))[:600] or f"uv exited {proc.returncode}"
        raise ShipyardError(f"environments.{env.name}: uv could not lock the dependencies "
                            f"(exclude-newer {cutoff}): {detail}")
    if "--hash=sha256:" not in proc.stdout:
        raise ShipyardError(f"environments.{env.name}: uv produced a lock without hashes; refusing to write it")
    return render_header(env, cutoff, index_url, base) + proc.stdout


def lock(reg: Registry, env_name: str | None = None, exclude_newer: str | None = None,
         index_url: str | None = None, base: BasePin | None = None) -> Path:
    """Write ``definitions/<env>.lock`` atomically and return its path. The definitions install from the lock and
    carry its sha256 as a label, so callers re-render afterwards (:func:`shipyard.definitions.render.relock`).

    The cut-off is, in order: ``exclude_newer``; the one in the existing lock; midnight UTC today. ``base``: the
    base image's pin to record (the caller resolves it: that takes the network, which this floor does not reach).
    """
    env = reg.environment(env_name)
    path = project.lock_path(reg, env.name)
    if exclude_newer:
        cutoff = normalize_cutoff(exclude_newer)
    else:
        previous = read_header(path).get("exclude-newer")
        try:
            cutoff = normalize_cutoff(previous) if previous else today_cutoff()
        except ShipyardError:
            raise ShipyardError(f"{path}: header exclude-newer {previous!r} is not a UTC timestamp; "
                                "pass --exclude-newer YYYY-MM-DD") from None
    text = compile_lock(env, cutoff, index_url or DEFAULT_INDEX, base=base)
    atomic_write(path, text)
    return path


def repin_base(reg: Registry, env: Environment, base: BasePin) -> Path:
    """Record ``base`` in the existing ``definitions/<env>.lock`` (`invoke lock ENV --update-base`): only the base
    lines change, so the Python closure does not drift with it."""
    path = project.lock_path(reg, env.name)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ShipyardError(f"{path}: no lock to move the base of; run `invoke lock {env.name}` first") from None
    try:
        new = with_base(text, base)
    except ShipyardError as exc:
        raise ShipyardError(f"{path}: {exc}; run `invoke lock {env.name}`") from None
    atomic_write(path, new)
    return path


def count_pins(text: str) -> tuple[int, int]:
    """(packages, sha256 hashes) in a lock text: for the task's summary line."""
    pkgs = sum(1 for ln in text.splitlines() if re.match(r"^[A-Za-z0-9][^ ]*==", ln))
    return pkgs, text.count("--hash=sha256:")
