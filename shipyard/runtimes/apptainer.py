"""Apptainer: ``apptainer exec --nv --no-home --bind ... --pwd <project> <storage>/<env>.sif`` starts the command on the node.

Why these words (launcher-rules.md rule 8): ``--nv`` is not optional (without it CUDA silently sees no GPU); no
``--contain``/``--containall`` (they hide /dev/infiniband and give a 64 MiB tmpfs HOME and /tmp); ``--no-home`` for
batch steps (Apptainer mounts the user's home by default; ``invoke shell`` keeps it). The image's
variables win over the host's, so the batch script exports ``APPTAINERENV_<NAME>`` for every variable it sets.
Apptainer usually comes as a site module: the cluster's modules are loaded before srun.
"""

from __future__ import annotations

from shipyard.errors import ShipyardError
from shipyard.runtimes.base import Placement, Runtime, Site


class Apptainer(Runtime):
    name = "apptainer"
    title = "Apptainer"
    suffix = "sif"
    needs = frozenset({"apptainer", "fakeroot"})
    env_prefix = "APPTAINERENV_"
    wraps_tools = True

    def _words(self, verb: str, p: Placement) -> list[str]:
        # Apptainer mounts the user's home by default: a batch step gets --no-home (Placement.home)
        return ["apptainer", verb, "--nv", *(() if p.home else ("--no-home",)), "--bind",
                ",".join(self.mount(m) for m in p.mounts), "--pwd", p.workdir, p.image]

    def exec_words(self, p: Placement) -> list[str]:
        return self._words("exec", p)

    def shell_words(self, p: Placement) -> list[str]:
        return self._words("shell", p)

    def modules(self, cluster: Site) -> tuple[str, ...]:
        return tuple(cluster.modules)

    def tool_words(self, image: str, cluster: Site, tool: str, env_names: tuple[str, ...] = (),
                   inside: str = "") -> list[str]:
        """``apptainer exec --nv [--bind B]... IMAGE TOOL``: each site bind as written, in apptainer's own
        ``src[:dst[:ro|rw]]`` syntax; pyxis-only mount flags (``+rprivate``) are refused rather than dropped.
        With ``inside`` (a host-injected path list), ``IMAGE /bin/sh -c 'INSIDE; exec "$@"' shipyard-env TOOL``, as
        the launcher's step: Apptainer drops the host's LD_LIBRARY_PATH and an ``APPTAINERENV_`` one would replace
        the image's, so only a shell in the container can put the injected path in front of the image's."""
        argv = ["apptainer", "exec", "--nv"]
        for i, bind in enumerate(cluster.binds):
            if "+" in bind:
                raise ShipyardError(f"clusters.{cluster.name}.binds[{i}]: {bind!r} has pyxis mount flags; "
                                    "apptainer binds take src[:dst[:ro|rw]]")
            argv += ["--bind", bind]
        # fabric_options.host_injection: the host's fabric userspace, read-only at the same path, as in a launcher
        # (runtimes/mounts.py: job_mounts); a wrapper without it runs NCCL on an image that need not carry them
        for b in (getattr(cluster, "host_injection", None) or {}).get("binds") or ():
            argv += ["--bind", f"{b}:{b}:ro"]
        if inside:
            return [*argv, image, "/bin/sh", "-c", f'{inside}; exec "$@"', "shipyard-env", tool]
        return [*argv, image, tool]

    def tool_how(self) -> str:
        return "`apptainer exec --nv` (the host's NVIDIA driver)"

    def tool_notes(self) -> tuple[str, ...]:
        return ("--nv binds the host's NVIDIA driver (without it CUDA silently sees no GPU); --bind gives the "
                "cluster's storage.",)
