"""Environment -> Recipe: a small list of build primitives that render to Apptainer or Dockerfile syntax.

The idea is hpccm's (baseimage, shell, environment, copy, label, runscript primitives rendered to either syntax), with
the lesson of its weakness applied: every version comes from the resolved :class:`~shipyard.registry.model.Environment`,
never from a code default. Both renderers read the same Recipe, so a .def and its Dockerfile cannot drift apart.

Every shell command here is one line, so the same list works as an Apptainer %post body and as a Dockerfile ``RUN``
joined with ``;``. Anything a user wrote (package names, env values, labels) is shell-quoted with ``shlex.quote``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from shipyard import __version__, facts, project
from shipyard.definitions import base_pin
from shipyard.definitions.base_pin import BasePin
from shipyard.definitions.layout import SHIPYARD_DIR, VENV
from shipyard.registry import fabric_checks
from shipyard.registry.model import AptSnapshot, BaseMirror, Environment

# The host's CA bundle and proxy settings for the downloading steps of a build (shipyard/containers/buildnet.py
# writes them; the build mounts them here only while it runs, so they never become part of the image).
BUILD_NET_MOUNT = "/mnt"
BUILD_NET_ENV = f"{BUILD_NET_MOUNT}/shipyard-build.env.sh"
BUILD_NET_CA = f"{BUILD_NET_MOUNT}/shipyard-build-ca.pem"


@dataclass(frozen=True)
class Step:
    """A commented group of one-line shell commands (one %post block / one Dockerfile RUN)."""

    comment: str
    commands: tuple[str, ...]
    # Where the docker backend runs it: "image" (the final image), "venv" (a pip step that writes only /opt/venv:
    # the discarded download stage), "both" (the Python install both stages need), "net" (sources the build's
    # network settings: the download stage only). The .def runs every step in order in one %post.
    where: str = "image"


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    expand: bool = False  # True only for our own values that reference $VARS (e.g. PATH); user values never expand


@dataclass(frozen=True)
class Recipe:
    name: str
    base: str  # the reference the definitions bootstrap from (the mirror's, with base_mirror)
    build_args: tuple[tuple[str, str], ...]
    files: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    environment: tuple[EnvVar, ...]
    post: tuple[Step, ...]
    test: tuple[str, ...]
    runscript: tuple[str, ...]
    help: str
    python: str  # interpreter path inside the image
    # what the docker backend's download stage makes and the image copies from it (/opt/venv, /opt/nccl-tests)
    copied: tuple[str, ...] = (VENV,)
    base_origin: str | None = None  # with base_mirror: the reference registry.yaml names, which the mirror serves
    mirror: str | None = None  # with base_mirror: its HOST[:PORT][/PREFIX]


def _q(s: str) -> str:
    return shlex.quote(str(s))


def lock_target(env_name: str) -> str:
    return f"{SHIPYARD_DIR}/{env_name}.lock"


def python_install(env: Environment) -> Step:
    """Install the requested CPython: the OS's own if it matches, otherwise the deadsnakes PPA build."""
    py = env.python.value
    pkgs = [f"python{py}", f"python{py}-venv"]
    cmds = ["export DEBIAN_FRONTEND=noninteractive", "apt-get update"]
    if py != env.system_python:
        cmds += [
            "apt-get install -y --no-install-recommends ca-certificates gnupg software-properties-common",
            "add-apt-repository -y ppa:deadsnakes/ppa",
            "apt-get update",
        ]
        pkgs.append(f"python{py}-dev")
    else:
        pkgs = ["ca-certificates"] + pkgs + [f"python{py}-dev"]
    cmds.append("apt-get install -y --no-install-recommends " + " ".join(pkgs))
    cmds.append(f"python{py} -m venv {VENV}")
    return Step(f"Python {py} ({'OS package' if py == env.system_python else 'deadsnakes PPA'}) in {VENV}",
                tuple(cmds), "both")


def torch_install(env: Environment, locked: bool) -> tuple[Step, ...]:
    """torch/torchvision/torchaudio with == pins from the right index, then the NCCL that was asked for."""
    pip = f"{VENV}/bin/python -m pip install --no-cache-dir"
    steps = []
    if locked:
        steps.append(Step(
            f"Every Python package from the hash-locked closure ({env.name}.lock); pip refuses any other bytes",
            (f"{pip} --require-hashes --no-deps -r {lock_target(env.name)}",), "venv",
        ))
        return tuple(steps)
    reqs = [f"torch=={env.torch.value}"]
    if env.torchvision.value:
        reqs.append(f"torchvision=={env.torchvision.value}")
    if env.torchaudio.value:
        reqs.append(f"torchaudio=={env.torchaudio.value}")
    index = f" --index-url {_q(env.torch_index.value)}" if env.torch_index.value else ""
    where = env.torch_index.value or "PyPI (the default CUDA variant)"
    steps.append(Step(f"PyTorch {env.torch.value} for CUDA {env.cuda.value} from {where}",
                      (f"{pip}{index} " + " ".join(_q(r) for r in reqs),), "venv"))
    if env.nccl_override and env.nccl_package:
        steps.append(Step(
            f"NCCL override: torch {env.torch.value} pins {env.nccl_package}=={env.nccl_default}; "
            f"{env.nccl.value} is installed on purpose, without deps (pip check reports this mismatch)",
            (f"{pip} --no-deps {_q(f'{env.nccl_package}=={env.nccl.value}')}",), "venv",
        ))
    if env.pip:
        steps.append(Step("Extra pip packages (exact pins from registry.yaml)",
                          (f"{pip} " + " ".join(_q(p) for p in env.pip),), "venv"))
    return tuple(steps)


def fabric_data() -> dict:
    """shipyard/data/fabrics.yaml: packages, installer and library paths of the fast-fabric userspace."""
    return facts.load("fabrics")


def fabric_install(env: Environment) -> tuple[Step, ...]:
    """The fast-fabric userspace the environment carries (env.fabrics): rdma-core's verbs userspace for InfiniBand,
    the EFA installer at the cluster's version in container mode (libfabric + aws-ofi-nccl) for EFA.

    Without it NCCL finds no libibverbs / no net plugin and silently falls back to TCP sockets."""
    data = fabric_data()
    steps = []
    why = f"environments.{env.name}.fabrics: {', '.join(env.fabrics)} ({env.fabrics_source})"
    if "ib" in env.fabrics:
        steps.append(Step(f"InfiniBand userspace (rdma-core: verbs, providers, rdmacm); {why}", (
            "export DEBIAN_FRONTEND=noninteractive",
            "apt-get update",
            "apt-get install -y --no-install-recommends " + " ".join(_q(p) for p in data["ib"]["apt"]),
        )))
    if "efa" in env.fabrics and env.efa_installer:
        efa = data["efa"]
        tarball = f"aws-efa-installer-{env.efa_installer}.tar.gz"
        steps.append(Step(f"EFA userspace: EFA installer {env.efa_installer} (sha256-checked) in container mode "
                          f"(no kernel module), bringing libfabric and aws-ofi-nccl; {why}", (
            "export DEBIAN_FRONTEND=noninteractive",
            "apt-get update",
            "apt-get install -y --no-install-recommends " + " ".join(_q(p) for p in efa["apt"]),
            "cd /tmp",
            *efa_fetch(env.efa_installer, env.efa_installer_sha256),
            "cd aws-efa-installer",
            "./efa_installer.sh " + " ".join(_q(f) for f in efa["flags"]),
            "cd /",
            f"rm -rf /tmp/aws-efa-installer /tmp/{_q(tarball)}",
        )))
    return tuple(steps)


def efa_fetch(version: str, given: str | None = None) -> tuple[str, ...]:
    """Download EFA installer ``version`` into the working directory, check its sha256 against the one a cluster
    gives (``fabric_options.efa_installer_sha256``) or else the recorded one (shipyard/data/fabrics.yaml
    ``efa.sha256``), and only then unpack it. Any other bytes, or an installer with no known sha256, end the build
    with one line before anything from the archive runs."""
    tarball = f"aws-efa-installer-{version}.tar.gz"
    where = ("registry.yaml clusters.*.fabric_options.efa_installer_sha256" if given
             else f"shipyard/data/fabrics.yaml efa.sha256[{version}]")
    sha = given or fabric_checks.efa_installer_sha256(version)
    if sha is None:
        return (_fail(f"shipyard: no sha256 of EFA installer {version} is known ({where}, or a cluster's "
                      "fabric_options.efa_installer_sha256); refusing to download and unpack unverified bytes"),)
    return (
        f"curl --fail --silent --show-error --location --retry 3 --max-time 600 -o {_q(tarball)} "
        f"{_q(fabric_data()['efa']['url'].format(version=version))}",
        f"echo {_q(sha + '  ' + tarball)} | sha256sum --check --status - || "
        + _fail(f"shipyard: {tarball} does not have the sha256 recorded in {where}; not unpacking it"),
        f"tar -xzf {_q(tarball)}",
    )


def _fail(message: str) -> str:
    """One shell command that prints ``message`` on stderr and fails the step (%post and RUN both stop on it)."""
    return f"{{ echo {_q(message)} >&2; exit 1; }}"


def fabric_environment(env: Environment) -> list[EnvVar]:
    """EFA: the installer's libfabric and aws-ofi-nccl on the loader's path (NCCL looks for its net plugin there)."""
    if "efa" not in env.fabrics or not env.efa_installer:
        return []
    dirs = ":".join(fabric_data()["efa"]["ld_library_path"])
    return [EnvVar("LD_LIBRARY_PATH", dirs + "${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}", expand=True)]


def fabric_tests(env: Environment, python: str) -> list[str]:
    """%test of the fabric userspace: the libraries are there and load (no device needed to dlopen them)."""
    data = fabric_data()
    out = []
    if "ib" in env.fabrics:
        libs = data["ib"]["libraries"]
        code = "import ctypes; " + "; ".join(f"ctypes.CDLL({lib!r})" for lib in libs)
        out.append(f'{python} -c "{code}"')
        out.append(f'ls {data["ib"]["provider_glob"]} > /dev/null || '
                   '{ echo "shipyard: no mlx5 verbs provider (ibverbs-providers)" >&2; exit 1; }')
    if "efa" in env.fabrics and env.efa_installer:
        efa = data["efa"]
        out.append(f'{python} -c "import ctypes; ctypes.CDLL({efa["libfabric"]!r})"')
        names = " ".join(f"{d}/{p}" for d in efa["plugin_dirs"] for p in efa["plugins"])
        tuners = " ".join(f"{d}/{efa['tuner']}" for d in efa["plugin_dirs"])
        for what, paths in (("aws-ofi-nccl net plugin", names), ("aws-ofi-nccl tuner plugin", tuners)):
            out.append(f"found=; for f in {paths}; do if [ -e \"$f\" ]; then found=$f; fi; done; "
                       f'[ -n "$found" ] || {{ echo "shipyard: no {what} under /opt/amazon/ofi-nccl" >&2; exit 1; }}')
    return out


def nccl_tests_data() -> dict:
    """shipyard/data/nccl_tests.yaml: the pinned releases, the compiler wheels, the MPI packages."""
    return facts.load("nccl_tests")


def _nccl_dir(env: Environment) -> str:
    """The NCCL torch uses: the nvidia-nccl wheel in the venv (nccl-tests compiles and links against it)."""
    return f"{VENV}/lib/python{env.python.value}/site-packages/nvidia/nccl"


def nccl_tests_runtime(env: Environment) -> tuple[Step, ...]:
    """In the image itself: the MPI the binaries link (when built with MPI), and no second NCCL beside torch's."""
    nt = env.nccl_tests
    if nt is None:
        return ()
    cmds = ["export DEBIAN_FRONTEND=noninteractive"]
    mpi_apt = nccl_tests_data()["mpi"][nt.mpi].get("apt", [])
    if mpi_apt:
        cmds += ["apt-get update", "apt-get install -y --no-install-recommends " + " ".join(_q(p) for p in mpi_apt)]
    # nvidia/cuda images carry the OS's libnccl2 (and libnccl-dev in devel): torch and nccl-tests use the wheel's
    cmds.append("for p in libnccl-dev libnccl2; do if dpkg -s \"$p\" > /dev/null 2>&1; then "
                "apt-get purge -y \"$p\"; fi; done")
    return (Step(f"nccl-tests {nt.version} at run time: MPI ({nt.mpi}), and one NCCL in the image (torch's wheel)",
                 tuple(cmds)),)


def nccl_tests_install(env: Environment) -> tuple[Step, ...]:
    """nccl-tests from its pinned release (sha256-checked), compiled against torch's NCCL wheel, into
    /opt/nccl-tests/bin; the compiler from where the image gets CUDA (a devel base's /usr/local/cuda, or pip's CUDA
    compiler wheels in a throw-away directory). libcudart is linked statically; torch's libnccl.so.2 is found through
    the binaries' run path (its absolute path in the venv). A "venv" step: the docker backend runs it in the
    download stage (it downloads) and copies /opt/nccl-tests into the image."""
    nt = env.nccl_tests
    if nt is None:
        return ()
    data = nccl_tests_data()
    prefix, work, nccl = data["prefix"], "/tmp/nccl-tests-build", _nccl_dir(env)
    build_apt = list(data["build_apt"])
    mpi = data["mpi"][nt.mpi]
    cmds = [
        "export DEBIAN_FRONTEND=noninteractive",
        "apt-get update",
        "new=; for p in " + " ".join(_q(p) for p in build_apt) + "; do "
        "dpkg -s \"$p\" > /dev/null 2>&1 || new=\"$new $p\"; done",
        "apt-get install -y --no-install-recommends " + " ".join(_q(p) for p in build_apt + list(mpi.get("apt", []))),
        f"mkdir -p {work}/src {work}/nccl/lib",
        f"cd {work}",
        f"curl --fail --silent --show-error --location --retry 3 --max-time 600 -o src.tar.gz {_q(nt.url)}",
        f"echo {_q(nt.sha256 + '  src.tar.gz')} | sha256sum -c -",
        "tar -xzf src.tar.gz -C src --strip-components=1",
    ]
    if nt.compiler == "pip":
        pc = data["pip_compiler"][env.cuda.value]
        cmds += [f"{VENV}/bin/python -m pip install --no-cache-dir --no-deps --target {work}/cuda "
                 + " ".join(_q(p) for p in pc["packages"]),
                 f"cuda={work}/cuda/{pc['home']}",
                 'ln -s lib "$cuda/lib64"']
    else:
        cmds.append(f"cuda={data['cuda_image_home']}")
    # LD_RUN_PATH: GNU ld's run path when the link gives none (nccl-tests' non-DSO link gives none): the binaries
    # find torch's libnccl.so.2 by its absolute path, with no LD_LIBRARY_PATH
    make = (f'LD_RUN_PATH={nccl}/lib make -C src -j"$(nproc)" CUDA_HOME="$cuda" NCCL_HOME={work}/nccl '
            f"CUDARTLIB=cudart_static BUILDDIR={work}/build")
    make += f' MPI=1 MPI_HOME="{mpi["home"]}"' if mpi.get("apt") else " MPI=0"
    cmds += [
        f"ln -s {nccl}/include {work}/nccl/include",
        f"ln -s {nccl}/lib/libnccl.so.2 {work}/nccl/lib/libnccl.so",
        make,
        f"install -d {prefix}/bin",
        f"cp {work}/build/*_perf {prefix}/bin/",
        "cd /",
        f"rm -rf {work}",
        'if [ -n "$new" ]; then apt-get purge -y --auto-remove $new; fi',
    ]
    return (Step(f"nccl-tests {nt.version} (commit {nt.commit}, sha256-checked) against torch's NCCL, MPI: {nt.mpi}, "
                 f"compiler: {'/usr/local/cuda of the devel base' if nt.compiler == 'cuda-image' else 'pip wheels'}",
                 tuple(cmds), "venv"),)


def nccl_tests_tests(env: Environment, python: str) -> list[str]:
    """%test of nccl-tests (no GPU): every binary is there and resolves its libraries; the libnccl it resolves is
    torch's file and reports torch's NCCL version; and it is the only libnccl in the image."""
    nt = env.nccl_tests
    if nt is None:
        return []
    data = nccl_tests_data()
    prefix = data["prefix"]
    bins = " ".join(data["releases"][nt.version]["binaries"])
    code = (f"import ctypes, os, re, subprocess, torch; b = '{prefix}/bin/all_reduce_perf'; "
            "out = subprocess.run(['ldd', b], capture_output=True, text=True, check=True).stdout; "
            r"m = re.search(r'libnccl\.so\S*\s+=>\s+(\S+)', out); assert m, 'all_reduce_perf links no libnccl'; "
            f"want = '{_nccl_dir(env)}/lib/libnccl.so.2'; "
            "assert os.path.realpath(m.group(1)) == os.path.realpath(want), m.group(1) + ' is not torch NCCL ' + want; "
            "v = ctypes.c_int(); ctypes.CDLL(m.group(1)).ncclGetVersion(ctypes.byref(v)); "
            "got = (v.value // 10000, v.value // 100 % 100, v.value % 100); "
            "assert got == tuple(torch.cuda.nccl.version()), 'nccl-tests NCCL %s, torch NCCL %s' % (got, "
            "torch.cuda.nccl.version())")
    return [
        f"for b in {bins}; do f={prefix}/bin/$b; [ -x \"$f\" ] || {{ echo \"shipyard: no $f\" >&2; exit 1; }}; "
        f"if ldd \"$f\" | grep -q 'not found'; then ldd \"$f\" >&2; "
        f"echo \"shipyard: $b does not resolve its libraries\" >&2; exit 1; fi; done",
        f"{python} -c {_q(code)}",
        "n=$(find / -xdev -type f -name 'libnccl.so*' | wc -l); [ \"$n\" = 1 ] || "
        "{ find / -xdev -type f -name 'libnccl.so*' >&2; echo \"shipyard: $n NCCL libraries in the image, not 1\" >&2; "
        "exit 1; }",
    ]


def apt_snapshot_sources(env: Environment, snapshot: AptSnapshot) -> Step:
    """The OS's own apt sources replaced by registry.yaml's dated snapshot mirror (shipyard/data/apt.yaml), before
    the first apt-get: a rebuild installs the Debian/Ubuntu packages of that day. The image keeps these sources, so
    what is installed into it later comes from the same day too."""
    data = facts.load("apt")["snapshot"]
    sources = data["sources"][env.os.value]
    url = snapshot.url or sources["url"]
    lines = [f"deb [check-valid-until=no] {url}/{src['archive']}/{snapshot.date} {suite} " + " ".join(src["components"])
             for src in sources["archives"] for suite in src["suites"]]
    return Step(f"apt from the snapshot of {snapshot.date} at {url} (registry.yaml apt_snapshot), not the "
                f"{env.os.value} sources of the day of the build", (
        "rm -f " + " ".join(_q(p) for p in data["replaces"][1:]),
        f"printf '%s\\n' {' '.join(_q(line) for line in lines)} > {_q(data['replaces'][0])}",
    ), "both")


def build_network() -> Step:
    """The host's CA bundle and proxy settings, when the build was given any (never stored in the image)."""
    # Apptainer runs %post under `sh -x`, whose trace of the sourced exports would put a proxy's user:password@
    # into the build log: the file is sourced with its trace (stderr) discarded
    return Step("The host's CA bundle and proxy for the downloads, when the build mounts them (not kept in the image)",
                (f"if [ -f {BUILD_NET_ENV} ]; then . {BUILD_NET_ENV} 2>/dev/null; fi",), "net")


def pip_check(env: Environment, python: str) -> Step:
    if env.nccl_override and env.nccl_package:
        # The only mismatch we accept is the NCCL override that registry.yaml asked for; anything else fails.
        return Step("pip check: only the requested NCCL override may be reported", (
            f"if ! {python} -m pip check > /tmp/pip-check.txt; then "
            f"if grep -v {_q(env.nccl_package)} /tmp/pip-check.txt | grep -q .; then cat /tmp/pip-check.txt; exit 1; fi; "
            f"echo 'shipyard: pip check reports only the requested NCCL override'; fi",
            "rm -f /tmp/pip-check.txt",
        ))
    return Step("pip check: the installed set must be consistent", (f"{python} -m pip check",))


def build_recipe(env: Environment, lock_sha256: str | None = None, mirror: BaseMirror | None = None,
                 base: BasePin | None = None, apt_snapshot: AptSnapshot | None = None) -> Recipe:
    """The pure function from a resolved environment (and the sha256 of its lock file, if any, the registry's
    base_mirror, if any, and the base image's digest the lock records, if any) to build primitives.

    The lock's digest becomes a label, so re-locking changes the committed definition and shows up in review.
    """
    locked = lock_sha256 is not None
    ours = env.stack == "shipyard"
    python = f"{VENV}/bin/python" if ours else "python3"
    post: list[Step] = [Step("Fail on the first error", ("set -eu",), "both"), build_network()]
    if apt_snapshot:
        post.append(apt_snapshot_sources(env, apt_snapshot))
    apt = list(env.apt)
    if ours:
        post.append(python_install(env))
    if apt:
        post.append(Step("apt packages from registry.yaml", (
            "export DEBIAN_FRONTEND=noninteractive",
            "apt-get update",
            "apt-get install -y --no-install-recommends " + " ".join(_q(p) for p in apt),
        )))
    post.extend(fabric_install(env))
    post.extend(nccl_tests_runtime(env))
    if ours:
        post.extend(torch_install(env, locked))
        post.extend(nccl_tests_install(env))
    elif locked:
        # stack: base installs only the extras, but from the lock's hashes like everything else
        post.append(Step(f"Extra pip packages from the hash-locked closure ({env.name}.lock); pip refuses any other "
                         "bytes", (f"{python} -m pip install --no-cache-dir --require-hashes --no-deps -r "
                                   f"{lock_target(env.name)}",)))
    elif env.pip:
        post.append(Step("Extra pip packages (exact pins from registry.yaml)",
                         (f"{python} -m pip install --no-cache-dir " + " ".join(_q(p) for p in env.pip),)))
    post.append(pip_check(env, python))
    post.append(Step("Clean caches so the image carries only what it runs", (
        "rm -rf /root/.cache/pip /var/lib/apt/lists/*",
    )))

    files = [(f.src, f.dst) for f in env.files]
    if locked:
        # %files sources are relative to the project root, where the build runs
        files.insert(0, (project.lock_path(Path(), env.name).as_posix(), lock_target(env.name)))

    labels = [("org.shipyard.environment", env.name)]
    labels += [(f"org.shipyard.{k.replace('_', '-')}", p.value) for k, p in env.pins().items() if p.value]
    labels += [("org.shipyard.stack", env.stack), ("org.shipyard.locked", "true" if locked else "false")]
    if locked:
        labels.append(("org.shipyard.lock-sha256", lock_sha256))
    labels += [("org.shipyard.version", __version__), ("org.shipyard.spec-sha256", env.spec_hash)]
    labels += list(env.labels)

    environment = [EnvVar("SHIPYARD_ENV", env.name)]
    if ours:
        environment.append(EnvVar("PATH", f"{VENV}/bin:$PATH", expand=True))
    environment += fabric_environment(env)
    if env.nccl_tests:
        environment.append(EnvVar("PATH", f"{nccl_tests_data()['prefix']}/bin:$PATH", expand=True))
    environment += [EnvVar(k, v) for k, v in env.env]
    login = login_path(environment)
    if login:
        post.append(login)

    return Recipe(
        name=env.name,
        base=base_pin.pinned(mirror.rewrite(env.base.value) if mirror and env.base.value else env.base.value or "",
                             base, env.base.value or ""),
        base_origin=env.base.value if mirror and env.base.value else None,
        mirror=mirror.url if mirror and env.base.value else None,
        build_args=env.build_args,
        files=tuple(files),
        labels=tuple(labels),
        environment=tuple(environment),
        post=tuple(post),
        test=test_commands(env, python),
        runscript=('exec "$@"',),
        help=help_text(env),
        python=python,
        copied=(VENV, nccl_tests_data()["prefix"]) if env.nccl_tests else (VENV,),
    )


LOGIN_PATH_FILE = "/etc/profile.d/shipyard-path.sh"


def _path_dirs(environment: list[EnvVar]) -> list[str]:
    """The directories our own ``PATH=DIR:$PATH`` entries put in front, in the order they apply."""
    return [e.value[: -len(":$PATH")] for e in environment if e.name == "PATH" and e.value.endswith(":$PATH")]


def login_path(environment: list[EnvVar]) -> Step | None:
    """The image's own PATH for login shells, which read /etc/profile: Debian's resets PATH to the OS default.

    Found with the real enroot (ENROOT_LOGIN_SHELL defaults to yes: the container's init runs as a login shell) and
    pyxis, which gives every task the container init's environment: a Debian image's ``ENV PATH=/opt/venv/bin:...``
    was gone and ``torchrun`` was not found. /etc/profile sources /etc/profile.d/*.sh after it sets PATH."""
    dirs = _path_dirs(environment)
    if not dirs:
        return None
    lines = ["# Written by shipyard: the PATH of this image for login shells (see its definition)",
             *(f'case ":$PATH:" in *:{d}:*) ;; *) PATH="{d}:$PATH" ;; esac' for d in dirs), "export PATH"]
    return Step("Login shells (enroot starts containers through one) reset PATH from /etc/profile: put the image's "
                "own directories back in front",
                (f"printf '%s\\n' {' '.join(_q(line) for line in lines)} > {LOGIN_PATH_FILE}",))


def test_commands(env: Environment, python: str) -> tuple[str, ...]:
    """Build-time assertions of the pins: python, torch, torch.version.cuda, the NCCL torch reports, imports.

    They need no GPU (``torch.cuda.nccl.version()`` reads the linked library), as %test runs at build time.
    """
    def check(mod: str, expr: str, want: str, what: str) -> str:
        code = f"import {mod}; v = {expr}; assert v == '{want}', '{what} is ' + str(v) + ', expected {want}'"
        # Values are schema-validated versions and names; double quotes keep the line readable. Anything the shell
        # would interpret inside double quotes falls back to strict single quoting.
        return f'{python} -c "{code}"' if not set('"$`\\!') & set(code) else f"{python} -c {_q(code)}"

    cmds = ["set -eu",
            check("sys", "'%d.%d' % sys.version_info[:2]", env.python.value, "python")]
    cmds.append(check("torch", "torch.__version__.split('+')[0]", env.torch.value, "torch"))
    cmds.append(check("torch", "torch.version.cuda", env.cuda.value, "torch.version.cuda"))
    if env.nccl.value:
        cmds.append(check("torch", "'.'.join(map(str, torch.cuda.nccl.version()))", env.nccl.value, "NCCL"))
    if env.torchvision.value:
        cmds.append(check("torchvision", "torchvision.__version__.split('+')[0]", env.torchvision.value,
                          "torchvision"))
    if env.torchaudio.value:
        cmds.append(check("torchaudio", "torchaudio.__version__.split('+')[0]", env.torchaudio.value, "torchaudio"))
    for req in env.pip:
        name, ver = req.split("==", 1)
        name = name.split("[")[0]
        cmds.append(check("importlib.metadata", f"importlib.metadata.version({name!r})", ver, name))
    if env.stack == "shipyard":  # a login shell (enroot's) finds the image's python first, as torchrun needs
        cmds.append(f'test "$(env -i /bin/sh -lc "command -v python")" = {python} || {{ echo "shipyard: %test: a '
                    f'login shell does not find {python} first ({LOGIN_PATH_FILE})" >&2; exit 1; }}')
    cmds += fabric_tests(env, python)
    cmds += nccl_tests_tests(env, python)
    cmds.append(f"echo {_q(f'shipyard: %test passed for {env.name}')}")
    return tuple(cmds)


def help_text(env: Environment) -> str:
    lines = [f"shipyard environment {env.name}" + (f": {env.description}" if env.description else "")]
    for k, p in env.pins().items():
        lines.append(f"  {k:<12} {p.value if p.value else '-'}")
    if env.pip:
        lines.append("  pip          " + " ".join(env.pip))
    lines.append("Run a command in it: apptainer exec --nv IMAGE.sif python train.py")
    lines.append(f"Made by shipyard {__version__} from registry.yaml; see `invoke show {env.name}`.")
    return "\n".join(lines)
