"""Render definitions/<env>.def (Apptainer) and definitions/<env>.Dockerfile from the registry.

Both come from one :class:`~shipyard.definitions.recipe.Recipe`, through Jinja2 templates kept as files. Output is a pure
function of registry.yaml (and a committed lock file, when there is one): no timestamps, so re-rendering is
byte-identical and `invoke render --check` can fail CI when definitions/ is stale.

Apptainer >= 1.2 uses ``{{ NAME }}`` for build arguments. Jinja never re-evaluates the values it inserts, so such
references in registry values reach the .def unchanged; the Dockerfile renderer maps them to ``${NAME}``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from shipyard import __version__, project, templating
from shipyard.definitions import pylock
from shipyard.definitions.base_pin import BasePin
from shipyard.definitions.layout import SHIPYARD_DIR, VENV
from shipyard.definitions.recipe import BUILD_NET_MOUNT, Step, build_recipe
from shipyard.files import atomic_write
from shipyard.registry.model import Environment, Registry

TEST_PATH = f"{SHIPYARD_DIR}/test.sh"
BUILD_NET_CONTEXT = ".shipyard-build"  # the docker backend puts the build-network files here in the build context
_PKG = "shipyard.definitions"



def _lock_sha256(reg: Registry | None, env: Environment) -> str | None:
    """sha256 of definitions/<env>.lock when there is one (the definition then installs from it)."""
    if reg is None:
        return None
    try:
        return hashlib.sha256(project.lock_path(reg, env.name).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _recipe(env: Environment, reg: Registry | None):
    sha = _lock_sha256(reg, env)
    pin = pylock.recorded_base(reg, env) if sha is not None else None
    return build_recipe(env, lock_sha256=sha, mirror=reg.base_mirror if reg is not None else None, base=pin,
                        apt_snapshot=reg.apt_snapshot if reg is not None else None)


def _render_def(recipe) -> str:
    return templating.render(_PKG, "definition.def.j2", r=recipe, version=__version__)


DOWNLOAD_STAGE = "shipyard-download"


def docker_stages(recipe) -> dict:
    """The recipe's steps split for the Dockerfile. With pip steps that write only /opt/venv, a first stage
    (``shipyard-download``, discarded) runs the build-network line, the Python install and the pip steps; the final
    stage installs the same Python and the apt packages, copies /opt/venv from it and runs the rest. The docker
    classic builder has no build secrets: this is how the host's CA bundle reaches pip and never the image
    (shipyard/containers/buildnet.py). Without venv steps (``stack: base``) there is one stage."""
    steps = [s for s in recipe.post if s.commands != ("set -eu",)]
    venv_at = [i for i, s in enumerate(steps) if s.where == "venv"]
    if not venv_at:
        return {"download": None, "pre": [s for s in steps if s.where != "net"], "post": []}
    last = venv_at[-1]
    return {"download": [s for s in steps if s.where in ("net", "both", "venv")],
            "pre": [s for s in steps[:last] if s.where in ("image", "both")]
            + [Step("apt lists out of this layer (the final clean-up runs in a later layer)",
                    ("rm -rf /var/lib/apt/lists/*",))],
            "post": [s for s in steps[last:] if s.where == "image"]}


def _render_dockerfile(recipe) -> str:
    return templating.render(_PKG, "Dockerfile.j2",
        r=recipe, version=__version__, test_path=TEST_PATH, test_dir=SHIPYARD_DIR, stages=docker_stages(recipe),
        download_stage=DOWNLOAD_STAGE, venv=VENV, net_mount=BUILD_NET_MOUNT, net_context=BUILD_NET_CONTEXT,
    )


def _render_test_script(recipe) -> str:
    return templating.render(_PKG, "test.sh.j2", r=recipe, version=__version__)


def render_definition(env: Environment, reg: Registry | None = None) -> str:
    """The Apptainer definition text for ``env`` (installs from definitions/<env>.lock when it exists)."""
    return _render_def(_recipe(env, reg))


def render_dockerfile(env: Environment, reg: Registry | None = None) -> str:
    """The Dockerfile text for ``env``, from the same recipe as the .def."""
    return _render_dockerfile(_recipe(env, reg))


def render_test_script(env: Environment, reg: Registry | None = None) -> str:
    """The %test commands as a standalone script: COPYed into Docker images and run by the docker backend."""
    return _render_test_script(_recipe(env, reg))


def rendered_files(reg: Registry, env: Environment) -> dict[Path, str]:
    """Every file `render` owns for one environment, path -> text (one recipe, one read of the lock)."""
    recipe = _recipe(env, reg)
    return {
        project.definition_path(reg, env.name): _render_def(recipe),
        project.dockerfile_path(reg, env.name): _render_dockerfile(recipe),
        project.test_script_path(reg, env.name): _render_test_script(recipe),
    }


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def write(reg: Registry, envs: list[Environment]) -> list[Path]:
    """Write every file of ``envs`` whose text differs from what the registry renders; the paths written.

    The check gate is the caller's (`invoke render` runs it first; :func:`relock` does not, since the lock it just
    wrote is what changed the definition's lock label)."""
    written = []
    for env in envs:
        for path, text in rendered_files(reg, env).items():
            if _read(path) != text:
                atomic_write(path, text, mode=0o755 if path.name.endswith(".sh") else 0o644)
                written.append(path)
    return written


def stale(reg: Registry, envs: list[Environment], all_envs: bool = False) -> list[str]:
    """What `invoke render --check` names: each file of ``envs`` that is missing or differs from what the registry
    renders, each stale lock, and (``all_envs``) each definition of an environment registry.yaml no longer has;
    ``PATH (why)`` lines relative to the project."""
    found: list[str] = []
    known: set[Path] = set()
    for env in envs:
        for path, text in rendered_files(reg, env).items():
            known.add(path)
            rel = path.relative_to(reg.root)
            current = _read(path)
            if current is None:
                found.append(f"{rel} (missing)")
            elif current != text:
                found.append(f"{rel} (differs from registry.yaml)")
        why = pylock.stale_reason(reg, env)
        if why:
            found.append(f"{project.lock_path(reg, env.name).relative_to(reg.root)} ({why})")
    if all_envs:
        for p in sorted(project.definitions_dir(reg).glob("*")):
            if (p.suffix in (".def", ".Dockerfile") or p.name.endswith(".test.sh")) and p not in known:
                found.append(f"{p.relative_to(reg.root)} (no such environment in registry.yaml)")
    return found


def relock(reg: Registry, env: Environment, exclude_newer: str | None = None,
           index_url: str | None = None, base: BasePin | None = None) -> Path:
    """Write the environment's lock (:func:`shipyard.definitions.pylock.lock`), then re-render its definitions:
    they install from the lock and carry its sha256 as a label, so a new lock makes them stale."""
    path = pylock.lock(reg, env.name, exclude_newer, index_url, base=base)
    write(reg, [env])
    return path


def repin(reg: Registry, env: Environment, base: BasePin) -> Path:
    """Move the lock's base pin (:func:`shipyard.definitions.pylock.repin_base`), then re-render: the definitions
    bootstrap from the pinned reference."""
    path = pylock.repin_base(reg, env, base)
    write(reg, [env])
    return path
