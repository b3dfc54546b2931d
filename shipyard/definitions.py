"""Render definitions/<env>.def (Apptainer) and definitions/<env>.Dockerfile from the registry.

Both come from one :class:`~shipyard.recipe.Recipe`, through Jinja2 templates kept as files. Output is a pure
function of registry.yaml (and a committed lock file, when there is one): no timestamps, so re-rendering is
byte-identical and `invoke render --check` can fail CI when definitions/ is stale.

Apptainer >= 1.2 uses ``{{ NAME }}`` for build arguments. Jinja never re-evaluates the values it inserts, so such
references in registry values reach the .def unchanged; the Dockerfile renderer maps them to ``${NAME}``.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shlex
import sys
from pathlib import Path


from shipyard import __version__
from shipyard.cli import atomic_write
from shipyard.model import Environment, Registry
from shipyard.recipe import SHIPYARD_DIR, build_recipe
from shipyard.templating import template_environment

TEST_PATH = f"{SHIPYARD_DIR}/test.sh"
_BUILD_ARG_REF = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def _envquote(value: str, expand: bool = False) -> str:
    if expand:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return shlex.quote(value)


def _dockerquote(value: str) -> str:
    """Double-quoted Dockerfile value with Docker's own $-substitution disabled."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _dockerenv(value: str, expand: bool = False) -> str:
    if expand:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    quoted = _dockerquote(value)
    return _BUILD_ARG_REF.sub(lambda m: "${" + m.group(1) + "}", quoted)


@functools.lru_cache(maxsize=1)
def _jinja():
    return template_environment("", {"envquote": _envquote, "dockerquote": _dockerquote, "dockerenv": _dockerenv,
                                     "shquote": shlex.quote})


def definition_path(reg: Registry, env_name: str) -> Path:
    return reg.root / "definitions" / f"{env_name}.def"


def dockerfile_path(reg: Registry, env_name: str) -> Path:
    return reg.root / "definitions" / f"{env_name}.Dockerfile"


def _lock_sha256(reg: Registry | None, env: Environment) -> str | None:
    """sha256 of definitions/<env>.lock when there is one (the definition then installs from it)."""
    if reg is None:
        return None
    try:
        return hashlib.sha256((reg.root / "definitions" / f"{env.name}.lock").read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def render_definition(env: Environment, reg: Registry | None = None) -> str:
    """The Apptainer definition text for ``env`` (installs from definitions/<env>.lock when it exists)."""
    recipe = build_recipe(env, lock_sha256=_lock_sha256(reg, env))
    return _jinja().get_template("definition.def.j2").render(r=recipe, version=__version__)


def render_dockerfile(env: Environment, reg: Registry | None = None) -> str:
    """The Dockerfile text for ``env``, from the same recipe as the .def."""
    recipe = build_recipe(env, lock_sha256=_lock_sha256(reg, env))
    return _jinja().get_template("Dockerfile.j2").render(
        r=recipe, version=__version__, test_path=TEST_PATH, test_dir=SHIPYARD_DIR
    )


def test_script_path(reg: Registry, env_name: str) -> Path:
    return reg.root / "definitions" / f"{env_name}.test.sh"


def render_test_script(env: Environment, reg: Registry | None = None) -> str:
    """The %test commands as a standalone script: COPYed into Docker images and run by the docker backend."""
    recipe = build_recipe(env, lock_sha256=_lock_sha256(reg, env))
    return _jinja().get_template("test.sh.j2").render(r=recipe, version=__version__)


def rendered_files(reg: Registry, env: Environment) -> dict[Path, str]:
    """Every file `render` owns for one environment, path -> text."""
    return {
        definition_path(reg, env.name): render_definition(env, reg),
        dockerfile_path(reg, env.name): render_dockerfile(env, reg),
        test_script_path(reg, env.name): render_test_script(env, reg),
    }


def _lock_stale(reg: Registry, env: Environment) -> str | None:
    try:
        from shipyard import lock
    except ImportError:
        return None
    fn = getattr(lock, "stale_reason", None)
    return fn(reg, env) if fn else None


def render_command(env_name: str | None, all_envs: bool = False, check: bool = False, registry=None,
                   out=sys.stdout) -> int:
    """`invoke render`: write (or, with check, compare) definitions; returns the exit code."""
    from shipyard.registry import load

    reg = registry if isinstance(registry, Registry) else load(registry)
    envs = list(reg.environments.values()) if all_envs else [reg.environment(env_name)]
    stale: list[str] = []
    written = 0
    for env in envs:
        for path, text in rendered_files(reg, env).items():
            rel = path.relative_to(reg.root)
            if check:
                try:
                    current = path.read_text(encoding="utf-8")
                except FileNotFoundError:
                    stale.append(f"{rel} (missing)")
                    continue
                if current != text:
                    stale.append(f"{rel} (differs from registry.yaml)")
            else:
                try:
                    if path.read_text(encoding="utf-8") == text:
                        continue
                except FileNotFoundError:
                    pass
                atomic_write(path, text, mode=0o755 if path.name.endswith(".sh") else 0o644)
                written += 1
                print(f"wrote {rel}", file=out)
        if check:
            why = _lock_stale(reg, env)
            if why:
                stale.append(f"definitions/{env.name}.lock ({why})")
    if all_envs and check:
        known = {p for e in envs for p in rendered_files(reg, e)}
        for p in sorted((reg.root / "definitions").glob("*")):
            if (p.suffix in (".def", ".Dockerfile") or p.name.endswith(".test.sh")) and p not in known:
                stale.append(f"{p.relative_to(reg.root)} (no such environment in registry.yaml)")
    if check:
        if stale:
            print("stale definitions (run `invoke render --all`):", file=out)
            for s in stale:
                print(f"  {s}", file=out)
            return 1
        print(f"definitions/ is up to date ({len(envs)} environment(s))", file=out)
        return 0
    if not written:
        print(f"definitions/ already up to date ({len(envs)} environment(s))", file=out)
    return 0
