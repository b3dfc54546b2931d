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
- Module wrappers (``invoke modules``) run one tool the same way: the cluster's binds, then the student's directory
  at the same path with ``--cd`` to it (what Apptainer does by default), the prelude with the module's variables on
  top of the image's, ``$USER`` exported when unset. That directory, like every bind destination, must exist in a
  SquashFS image or lie under a bind or ``/tmp`` (ch-run binds the host's); a path with ``:`` cannot be given to
  ``-b`` (it would split there), so the wrapper refuses it in one line.
"""

from __future__ import annotations

from pathlib import Path

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.runtimes.base import Placement, Runtime, ShellWord, Site
from shipyard.runtimes.mounts import Mount, parse_mounts

# Inside the container: the image's variables, then the job's own values back on top, then the command.
_IMAGE_ENV = ('f=/ch/environment; [ -r "$f" ] || f=/etc/environment; '
              'if [ -r "$f" ]; then while IFS= read -r l || [ -n "$l" ]; do '
              'n=${l%%=*}; case $l in *=*) ;; *) continue ;; esac; '
              "case $n in ''|[0-9]*|*[!A-Za-z0-9_]*) continue ;; esac; "
              "v=${l#*=}; case $v in \\'*\\') v=${v#\\'}; v=${v%\\'} ;; esac; "
              'export "$n=$v"; done < "$f"; fi')


def env_prelude(names: tuple[str, ...], inside: str = "") -> str:
    """The ``/bin/sh -c`` script that applies the image's environment under the job's ``names`` (shell
    identifiers, checked where they were parsed), then runs ``inside`` (a module's in-container prepend of
    host-injected path lists, the launcher's ``prepend_exports``), then execs its arguments."""
    save = "".join(f"shipyard_{i}=${{{n}-}}; " for i, n in enumerate(names))
    back = "".join(f'export {n}="$shipyard_{i}"; ' for i, n in enumerate(names))
    return f"{save}{_IMAGE_ENV}; {back}{inside + '; ' if inside else ''}exec \"$@\""


# A module wrapper's word for the student's directory, expanded by the wrapper's shell when it runs.
_CWD = ShellWord('"$PWD"')


class Charliecloud(Runtime):
    name = "charliecloud"
    title = "Charliecloud"
    suffix = "sqsh"
    needs = frozenset({"ch-run"})
    wraps_tools = True

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

    def tool_words(self, image: str, cluster: Site, tool: str, env_names: tuple[str, ...] = (),
                   inside: str = "") -> list[str]:
        """``ch-run -b BIND... -b "$PWD" --cd "$PWD" IMAGE -- /bin/sh -c PRELUDE shipyard-ch-env TOOL``: the cluster's
        binds (parsed as the launcher parses them, so pyxis flags are refused the same way, and spelled without
        ``:ro``, which ch-run lacks) and the host injection's, then the student's directory; the module's variables
        (``env_names``, set outside) win over the image's, then ``inside`` prepends the injected path lists."""
        argv = ["ch-run"]
        for i, bind in enumerate(cluster.binds):
            if not bind.startswith("/"):
                raise ShipyardError(f"clusters.{cluster.name}.binds[{i}]: {bind!r} is relative; a module wrapper runs "
                                    "from any directory, so give an absolute path")
        injection = getattr(cluster, "host_injection", None) or {}
        mounts = [*parse_mounts(list(cluster.binds), Path("/"), f"clusters.{cluster.name}.binds"),
                  *(Mount(b, b, ro=True) for b in injection.get("binds") or ())]
        for m in mounts:
            argv += ["-b", self.mount(m)]
        argv += ["-b", _CWD, "--cd", _CWD, image, "--", "/bin/sh", "-c"]
        return [*argv, env_prelude(env_names, inside), "shipyard-ch-env", tool]

    def tool_how(self) -> str:
        return f"`ch-run` (Charliecloud >= {facts.load('doctor')['ch_run_min']} on PATH)"

    def tool_setup(self) -> list[str]:
        return [*self.batch_lines(),
                'case $PWD in *:*) echo "${0##*/}: ch-run cannot bind a directory whose path has a \':\' ($PWD);'
                ' run it from another directory" >&2; exit 2 ;; esac']

    def tool_notes(self) -> tuple[str, ...]:
        return ("-b binds the cluster's binds and this directory at the same path (--cd there); each must exist in",
                "the image or lie under a bind or /tmp. The /bin/sh prelude applies the image's environment",
                "(/ch/environment, else /etc/environment), then this module's variables on top; then the tool.")
