"""Charliecloud: ``ch-run -b SRC:DST ... --cd WORKDIR IMAGE -- /bin/sh -c ENV ...`` starts the command on the node.

Why these words (read from ch-run 0.31, Debian 12's ``charliecloud-runtime``, and its man page):

- The image is the same ``<storage>/<env>.sqsh`` a pyxis cluster stages (ch-run mounts a SquashFS itself through
  libsquashfuse, unprivileged) or an unpacked directory given with ``--image``.
- ch-run passes the host's environment through unchanged and applies the image's own variables only with a bare
  ``--set-env``, which reads ``/ch/environment`` and fails when the image has none: an image that ``enroot import``
  made (what a pyxis cluster stages) keeps its ``ENV`` in ``/etc/environment`` instead. So a short ``/bin/sh`` prelude
  inside the container applies the image's variables (``/ch/environment`` when the image has it, else
  ``/etc/environment``; each ``NAME=VALUE`` line taken literally, a pair of surrounding single quotes stripped as
  ch-run does), then puts back the values of the variables the batch script set (:attr:`Placement.env_names`: they
  win over the image's, as with pyxis ``--container-env``), then execs the command. The image's PATH is therefore
  the PATH inside (torchrun is found), and the launcher's in-container prepend (host injection) lands in front of
  the image's library path, never instead of it.
- ch-run binds are ``SRC[:DST]`` only: no read-only flag exists (0.31 up to 0.38), so a ``:ro`` mount is bound
  read-write. ch-run is fully unprivileged, so the job can write only what its user can write on the host anyway.
  With a read-only image (a SquashFS) every destination must already exist in the image.
- No ``--home`` for batch steps (ch-run mounts no home by default); ``invoke shell`` asks for it (``--home``).
"""

from __future__ import annotations

from shipyard.runtimes.base import Placement, Runtime
from shipyard.runtimes.mounts import Mount

# Inside the container: the image's variables, then the job's own values back on top, then the command.
_IMAGE_ENV = ('f=/ch/environment; [ -r "$f" ] || f=/etc/environment; '
              'if [ -r "$f" ]; then while IFS= read -r l || [ -n "$l" ]; do '
              'n=${l%%=*}; case $l in *=*) ;; *) continue ;; esac; '
              "case $n in ''|[0-9]*|*[!A-Za-z0-9_]*) continue ;; esac; "
              "v=${l#*=}; case $v in \\'*\\') v=${v#\\'}; v=${v%\\'} ;; esac; "
              'export "$n=$v"; done < "$f"; fi')


def env_prelude(names: tuple[str, ...]) -> str:
    """The ``/bin/sh -c`` script that applies the image's environment under the job's ``names`` (shell
    identifiers, checked where they were parsed), then execs its arguments."""
    save = "".join(f"shipyard_{i}=${{{n}-}}; " for i, n in enumerate(names))
    back = "".join(f'export {n}="$shipyard_{i}"; ' for i, n in enumerate(names))
    return f"{save}{_IMAGE_ENV}; {back}exec \"$@\""


class Charliecloud(Runtime):
    name = "charliecloud"
    suffix = "sqsh"
    needs = frozenset({"ch-run"})

    def mount(self, m: Mount) -> str:
        """``SRC:DST``: ch-run has no read-only bind (see the module's docstring)."""
        return f"{m.src}:{m.dst}"

    def _words(self, p: Placement) -> list[str]:
        argv = ["ch-run"]
        for m in p.mounts:
            argv += ["-b", self.mount(m)]
        argv += ["--cd", p.workdir]
        if p.home:
            argv.append("--home")
        return [*argv, p.image, "--", "/bin/sh", "-c", env_prelude(p.env_names), "shipyard-ch-env"]

    def batch_lines(self) -> list[str]:
        """ch-run stops at once without ``$USER`` ("$USER not set", ch-run.c), which a batch job submitted from a
        service or a stripped environment lacks (found by the sandbox launcher test): the job's user then."""
        return ['export USER="${USER:-$(id -un)}"  # ch-run refuses to start without $USER']

    def exec_words(self, p: Placement) -> list[str]:
        return self._words(p)

    def shell_words(self, p: Placement) -> list[str]:
        return [*self._words(p), "bash"]
