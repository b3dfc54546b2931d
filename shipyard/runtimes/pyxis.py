"""pyxis (the enroot SPANK plugin): the container is requested with flags on the ``srun`` line.

Why on ``srun`` and not in ``#SBATCH`` lines: there pyxis would run the batch script itself in the container, where
``scontrol`` (needed to find the head node) is absent. Images are enroot squashfs files, ``<storage>/<env>.sqsh``
(``--image`` may also name a registry image such as ``nvcr.io#nvidia/pytorch:24.01-py3``). ``--container-env``
names every variable the batch script sets: without it the image's value wins (launcher-rules.md rule 6).
"""

from __future__ import annotations

from shipyard.runtimes.base import Placement, Runtime


class Pyxis(Runtime):
    name = "pyxis"
    suffix = "sqsh"
    needs = frozenset({"pyxis", "enroot"})

    def image_path_prelude(self) -> str:
        """enroot starts the container through a login shell (ENROOT_LOGIN_SHELL defaults to yes, and pyxis clears
        the environment it runs enroot with), so a Debian image's /etc/profile resets PATH and pyxis hands that to
        every task: found with the real enroot 4.1.2 + pyxis 0.24.0 (`all_reduce_perf: not found`). `enroot import`
        writes the image's ENV to /etc/environment; its PATH goes back in front. Images shipyard builds carry
        /etc/profile.d/shipyard-path.sh instead (shipyard/definitions/recipe.py), so only an external image needs
        this."""
        return 'p=$(sed -n "s/^PATH=//p" /etc/environment 2>/dev/null | tail -n 1); [ -z "$p" ] || PATH="$p:$PATH"'

    def srun_words(self, p: Placement) -> list[str]:
        argv = [f"--container-image={p.image}",
                f"--container-mounts={','.join(self.mount(m) for m in p.mounts)}",
                f"--container-workdir={p.workdir}"]
        if not p.home:
            argv.append("--no-container-mount-home")
        if p.container_name:  # unpacked once per node; chained/requeued segments reuse it
            argv.append(f"--container-name={p.container_name}")
        if p.env_names:
            argv.append(f"--container-env={','.join(p.env_names)}")  # rule 6: the image's values win unless named
        return argv
