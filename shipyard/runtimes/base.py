"""What every container runtime answers: the protocol (:class:`Runtime`), the job it places (:class:`Placement`) and
where a cluster keeps its images (:func:`storage_dir`).

Why one object per runtime: the launchers, ``invoke shell``, ``invoke modules`` and ``invoke doctor`` all need to know
where the image lives, how mounts are spelled, how variables reach the container, which words go on the srun line
and which start the command, and which site modules to load. Asked of one object, they cannot disagree, and a new
runtime is one file beside this one (see ``__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from shipyard.errors import ShipyardError
from shipyard.runtimes.mounts import Mount, spec as mount_spec


class Site(Protocol):
    """What a runtime reads from a cluster profile (a :class:`shipyard.registry.model.Cluster`). A protocol rather
    than the class so that ``tasks.py`` can import the runtimes (for help texts) without loading the registry."""

    name: str
    storage: str | None
    binds: tuple[str, ...]
    modules: tuple[str, ...]
    # fabric_options.host_injection ({"binds": [...], "env": {...}} or None): a property of Cluster


@dataclass(frozen=True)
class Placement:
    """One command placed in a container: the image, what is mounted, the working directory, and the names of the
    variables the batch script sets (the runtime makes them win over the image's values).

    ``home``: keep the user's home directory as the runtime mounts it by default. Interactive shells do (dotfiles,
    editors); batch steps do not, so that a job does not depend on what happens to be in ``$HOME``.
    """

    image: str | None
    mounts: tuple[Mount, ...]
    workdir: str
    env_names: tuple[str, ...] = ()
    home: bool = False
    # A name for the unpacked container that later steps/jobs on the same node reuse (pyxis --container-name):
    # <env>-<image sha256 prefix>, so a restaged image is never mistaken for the old one. None: no reuse.
    container_name: str | None = None


def storage_dir(root: Path | None, cluster: Site) -> Path | None:
    """The cluster's image storage as the nodes see it (None when the profile has none); relative = under the
    project root, which ``root=None`` (no project known) refuses."""
    if not cluster.storage:
        return None
    p = Path(cluster.storage)
    if p.is_absolute():
        return p
    if root is None:
        raise ShipyardError(f"clusters.{cluster.name}.storage: {cluster.storage!r} is relative; use an absolute path")
    return root / p


class ShellWord(str):
    """A word of a module wrapper's command that the wrapper's own shell expands when it runs (``"$PWD"``: the
    student's directory is known only then), so it is written as it is, never quoted. Only runtimes make these, from
    fixed text: a value from the registry never becomes one."""


class Runtime:
    """The defaults describe a runtime without a container (host); a container runtime overrides what it changes."""

    name: ClassVar[str]
    title: ClassVar[str] = ""  # the runtime's name in prose (generated comments): "Apptainer"
    suffix: ClassVar[str | None] = None  # image file suffix on the cluster's storage; None: the runtime has no image
    needs: ClassVar[frozenset[str]] = frozenset()  # what `invoke doctor` checks for: pyxis, enroot, apptainer, fakeroot
    env_prefix: ClassVar[str | None] = None  # the batch script exports <prefix><NAME> for every variable it sets
    wraps_tools: ClassVar[bool] = False  # `invoke modules` can write wrappers that run a tool in the image

    @property
    def containerised(self) -> bool:
        return self.suffix is not None

    def image(self, root: Path | None, env_name: str, cluster: Site, override_flag: str | None = None) -> str | None:
        """``<cluster.storage>/<env>.<suffix>``; None without a container. A missing storage is one error line naming
        ``clusters.<name>.storage`` (and ``override_flag``, the flag that would make it unnecessary, if any)."""
        if self.suffix is None:
            return None
        storage = storage_dir(root, cluster)
        if storage is None:
            if override_flag:
                raise ShipyardError(f"clusters.{cluster.name}.storage is not set: give {override_flag} (a path or "
                                    f"registry image) for the {self.name} runtime")
            raise ShipyardError(f"clusters.{cluster.name}.storage is not set: the {self.name} runtime looks for "
                                f"{env_name}.{self.suffix} there (e.g. storage: /scratch/projects/NAME/images)")
        return str(storage / f"{env_name}.{self.suffix}")

    def mount(self, m: Mount) -> str:
        """One mount in this runtime's syntax (pyxis and apptainer both take ``SRC:DST[:ro]``)."""
        return mount_spec(m)

    def srun_words(self, p: Placement) -> list[str]:
        """Options for the ``srun`` line itself (a SPANK plugin's flags)."""
        return []

    def exec_words(self, p: Placement) -> list[str]:
        """The words that run a command inside the container on the node, before the command."""
        return []

    def image_path_prelude(self) -> str:
        """Shell run first inside the container of an external ``--image``, to give it the image's own PATH where
        the runtime loses it (empty: nothing to do)."""
        return ""

    def batch_lines(self) -> list[str]:
        """Shell lines the batch script runs before srun, for what the runtime needs in the job's environment."""
        return []

    def shell_words(self, p: Placement) -> list[str]:
        """What an interactive shell on the node runs."""
        return [*self.exec_words(p), "bash"]

    def modules(self, cluster: Site) -> tuple[str, ...]:
        """The cluster's modules to ``module load`` before srun (only runtimes that come as a module need them)."""
        return ()

    def tool_words(self, image: str, cluster: Site, tool: str, env_names: tuple[str, ...] = (),
                   inside: str = "") -> list[str]:
        """argv that runs ``tool`` from ``image`` (what a module wrapper execs, the student's arguments after it);
        only if :attr:`wraps_tools`. A :class:`ShellWord` is left for the wrapper's shell to expand. ``env_names``:
        the module's variables, set outside (where the runtime lets the image's win, they are put back on top);
        ``inside``: shell run in the container just before the tool, the launcher's in-container prepend of the
        host injection's path lists (``launch.fabric.prepend_exports``); empty: the tool is run directly."""
        raise ShipyardError(f"the {self.name} runtime cannot wrap tools in modules")

    def tool_how(self) -> str:
        """How a module wrapper starts the tool, in a few words for the modulefile's comment and help."""
        return ""

    def tool_setup(self) -> list[str]:
        """Shell lines a module wrapper runs before it execs :meth:`tool_words` (what the runtime needs first)."""
        return []

    def tool_notes(self) -> tuple[str, ...]:
        """What a module wrapper does, one comment line each (the generated files and ``module help`` say it)."""
        return ()
