"""The image check as a script of its own: what runs an image outside a batch launcher (module wrappers, `invoke
shell`, STUDENTS.md's interactive line, a Snakefile's ``onstart``) calls it before it starts the image.

Why a script beside the caller and not beside the image: the script holds the expected sha256, so it must live where
only its owner writes (the module prefix, the project's ``launch/``, the handout), never in the shared storage whose
image it checks. It is the batch launcher's own check (``templates/image_check.sh.j2``, included by the launcher
inline): the stage record's hashes, the identity stamp of shipyard/identity.py, and the content hash, verified once
per image file and cached in the user's own 0700 cache. It is generated once per staged version (its name carries
the sha256's first 16 digits where several versions may sit side by side).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from shipyard import __version__, identity, templating
from shipyard.errors import ShipyardError
from shipyard.staging import record as staged
from shipyard.staging import versions

_HEX64 = re.compile(r"[0-9a-f]{64}")
SCRIPT = "check-image.sh"  # the handout's and a module set's name for it (one staged version each)


@dataclass(frozen=True)
class Check:
    """The staged image a caller is bound to: where it is, and what it must hash to."""

    image: str
    sha256: str
    input_hash: str
    bound_from: str  # "stage record <path>" | "build manifest <path>"

    @property
    def record(self) -> str:
        return str(staged.record_path(self.image))


def bound(root: Path, env_name: str, image: str | None, suffix: str | None) -> Check | None:
    """The binding the batch launcher would take for ``image`` (its stage record, else the local build manifest);
    None when nothing is staged or built, or the hashes are not 64 hex digits."""
    if not image or not suffix:
        return None
    image = versions.resolve(image)  # stage's pointer names a version: the check and what runs name that file
    b = staged.binding(root, env_name, image, suffix)
    if b is None or not (_HEX64.fullmatch(b.sha256) and _HEX64.fullmatch(b.input_hash)):
        return None
    return Check(image, b.sha256, b.input_hash, " ".join(b.source.split()))


def require(check: Check | None, image: str | None, env_name: str, cluster: str, what: str) -> Check:
    """``check``, or one line: an image with nothing to check it against is not run (as `invoke launch` refuses)."""
    if check is not None:
        return check
    raise ShipyardError(f"{image}: no image to check {what} against (no stage record beside it, no build manifest "
                        f"containers/{env_name}.json); run `invoke build {env_name}` and `invoke stage {env_name} "
                        f"--cluster {cluster}` first")


def script_name(check: Check, env_name: str) -> str:
    """``ENV-<sha256[:16]>.check-image.sh``: one per staged version, for folders that keep several (``launch/``)."""
    return f"{env_name}-{check.sha256[:16]}.{SCRIPT}"


def render(check: Check, env_name: str, by: str, callers: str) -> str:
    """The check script's text (pure): ``by`` the command that wrote it, ``callers`` what runs it."""
    return templating.render("shipyard.launch", "image_check_script.sh.j2", trim_blocks=True,
                             version=__version__, by=by, env=env_name, callers=callers, bound_from=check.bound_from,
                             image=check.image, record=check.record, want_sha=check.sha256,
                             want_input=check.input_hash, standalone=True,
                             identity=identity.shell_rule())
