"""Lmod modulefiles and wrappers: golden files, shellcheck, --nv never missing, loading in real Lmod and running a
wrapper in a real SIF with the real Apptainer 1.4.5 (the site's `apptainer` module puts it on PATH); the image's
`python` is a stand-in that reports what it sees inside. Charliecloud's wrappers run real ch-run in
tests/launch/test_modules_charliecloud.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_invoke import invoke_cli
from fixtures_launch import replace_staged_image, stage_record
from fuzz_budget import examples
from helpers_registry import GOLDEN, ROOT, golden, shellcheck
from hypothesis import given, settings
from hypothesis import strategies as st

from shipyard import escaping, registry
from shipyard.errors import ShipyardError
from shipyard.launch import image_check, modules
from shipyard.registry.model import Cluster

SHIPPED = registry.load(ROOT / "registry.yaml")
COURSE = registry.load(ROOT / "examples" / "course" / "registry.yaml")
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
PREFIX = Path("/sw/shipyard")  # fixed prefix for golden files: rendering does not touch it


def fixed_check(image: str) -> image_check.Check:
    """A staged image's binding with fixed hashes (golden files: rendering reads no record)."""
    return image_check.Check(image, "ab" * 32, "cd" * 32, f"stage record {image}.json")


def apptainer_clusters(reg):
    return [c for c in reg.clusters.values() if c.runtime == "apptainer"]


def all_cases():
    for label, reg in (("shipped", SHIPPED), ("course", COURSE)):
        for cluster in apptainer_clusters(reg):
            for env in modules.environments_on(reg, cluster):
                yield label, reg, cluster, env


def charliecloud_cluster() -> Cluster:
    """grete as a Charliecloud site (no cluster in the shipped registries runs ch-run): a read-only bind, and a
    host injection whose library path must be prepended inside, never replace the image's."""
    base = SHIPPED.cluster("grete")
    inj = {"binds": ["/opt/amazon/efa"], "env": {"FI_PROVIDER": "efa", "LD_LIBRARY_PATH": "/opt/amazon/efa/lib"}}
    return Cluster(**{**base.__dict__, "name": "grete-ch", "runtime": "charliecloud",
                      "binds": (*base.binds, "/sw/data:/data:ro"),
                      "fabric_options": {**base.fabric_options, "host_injection": inj}})


APPTAINER_CASES = list(all_cases())
CASES = [*APPTAINER_CASES, ("charliecloud", SHIPPED, charliecloud_cluster(), SHIPPED.environment("pytorch-2.3"))]
IDS = [f"{label}-{c.name}-{e.name}" for label, _, c, e in CASES]
APPTAINER_IDS = IDS[:len(APPTAINER_CASES)]


@pytest.mark.parametrize("label,reg,cluster,env", CASES, ids=IDS)
def test_module_files_golden(label, reg, cluster, env):
    image = modules.image_path(reg, cluster, env)
    files = modules.module_files(env, cluster, PREFIX, image, fixed_check(image))
    for path, text in files.items():
        golden(GOLDEN / "modules" / label / cluster.name / path.relative_to(PREFIX), text)
    res = shellcheck(files[modules.check_path(PREFIX, env.name)], shell="bash")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("label,reg,cluster,env", APPTAINER_CASES, ids=APPTAINER_IDS)
def test_wrappers_pass_shellcheck_and_always_pass_nv(label, reg, cluster, env):
    image = modules.image_path(reg, cluster, env)
    for tool in modules.TOOLS:
        text = modules.render_wrapper(env, cluster, tool, image, modules.check_path(PREFIX, env.name))
        res = shellcheck(text, shell="bash")
        assert res.returncode == 0, res.stdout + res.stderr
        (exec_line,) = [ln for ln in text.splitlines() if ln.startswith("exec ")]
        (check_line,) = [ln for ln in text.splitlines() if ln.startswith("bash ")]
        assert text.index(check_line) < text.index(exec_line)
        assert shlex.split(check_line) == ["bash", str(modules.check_path(PREFIX, env.name)), "||", "exit"]
        words = shlex.split(exec_line)
        assert words[:4] == ["exec", "apptainer", "exec", "--nv"]
        assert words[-3:] == [image, tool, "$@"]
        assert words[4:-3] == [w for b in cluster.binds for w in ("--bind", b)]


_path_part = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._- '$\"`;&|", min_size=1, max_size=12)


@settings(max_examples=examples(60), deadline=None)
@given(storage=st.lists(_path_part, min_size=1, max_size=3), binds=st.lists(_path_part, max_size=3))
def test_wrapper_quotes_any_site_value_and_keeps_nv(storage, binds):
    """Site values with spaces, quotes or shell metacharacters reach apptainer as single, unchanged words."""
    env = SHIPPED.environment("pytorch-2.3")
    base = SHIPPED.cluster("grete")
    cluster = Cluster(**{**base.__dict__, "binds": tuple("/" + b for b in binds),
                         "storage": "/" + "/".join(storage)})
    image = modules.image_path(None, cluster, env)
    text = modules.render_wrapper(env, cluster, "torchrun", image)
    (exec_line,) = [ln for ln in text.splitlines() if ln.startswith("exec ")]
    words = shlex.split(exec_line)
    assert words[:4] == ["exec", "apptainer", "exec", "--nv"]
    assert words[4:-3] == [w for b in cluster.binds for w in ("--bind", b)]
    assert words[-3] == image


def test_modulefile_lua_strings_escape_quotes_and_newlines():
    assert escaping.lua_string('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'


def test_charliecloud_wrappers_pass_shellcheck_and_run_ch_run_in_this_directory():
    """ch-run with the cluster's binds (no :ro: ch-run has none) and the injection's, then the student's directory
    at the same path and --cd there, expanded when the wrapper runs; the prelude; the tool; the student's "$@"."""
    cluster = charliecloud_cluster()
    image = modules.image_path(SHIPPED, cluster, SHIPPED.environment("pytorch-2.3"))
    assert image.endswith("/pytorch-2.3.sqsh")
    for tool in modules.TOOLS:
        text = modules.render_wrapper(SHIPPED.environment("pytorch-2.3"), cluster, tool, image)
        res = shellcheck(text, shell="bash")
        assert res.returncode == 0, res.stdout + res.stderr
        assert any(ln.startswith('export USER="${USER:-$(id -un)}"') for ln in text.splitlines())
        (exec_line,) = [ln for ln in text.splitlines() if ln.startswith("exec ")]
        assert ' -b "$PWD" --cd "$PWD" ' in exec_line
        words = shlex.split(exec_line)
        assert words[:8] == ["exec", "ch-run", "-b", "/scratch:/scratch", "-b", "/mnt/lustre-grete:/mnt/lustre-grete",
                             "-b", "/sw/data:/data"]
        assert words[8:15] == ["-b", "/opt/amazon/efa:/opt/amazon/efa", "-b", "$PWD", "--cd", "$PWD", image]
        assert words[15:18] == ["--", "/bin/sh", "-c"] and words[19:] == ["shipyard-ch-env", tool, "$@"]


def test_charliecloud_wrapper_refuses_what_ch_run_would_misread():
    base = charliecloud_cluster()
    for binds, why in ((("data",), r"binds\[0\]: 'data' is relative"),
                       (("/data:/data:ro+rprivate",), r"binds.*mount flag 'ro\+rprivate' is not valid")):
        with pytest.raises(ShipyardError, match=why):
            modules.wrapper_argv("/i.sqsh", Cluster(**{**base.__dict__, "binds": binds}), "python")


def test_refuses_non_apptainer_cluster_with_valid_choices():
    with pytest.raises(ShipyardError, match=r"--cluster aws-pcluster: runtime is pyxis, but module wrappers need "
                                            r"runtime: apptainer or charliecloud; use --cluster grete"):
        modules.write_modules(SHIPPED, [SHIPPED.environment("pytorch-2.3")], SHIPPED.cluster("aws-pcluster"),
                              "/nonexistent")


def test_refuses_pyxis_mount_flags_in_apptainer_binds():
    base = SHIPPED.cluster("grete")
    cluster = Cluster(**{**base.__dict__, "binds": ("/data:/data:ro+rprivate",)})
    with pytest.raises(ShipyardError, match=r"clusters.grete.binds\[0\].*pyxis mount flags"):
        modules.wrapper_argv("/i.sif", cluster, "python")


def _staged_grete(tmp_path) -> tuple[Cluster, Path]:
    """grete with its storage under tmp_path and a staged image there (its stage record beside it)."""
    cluster = Cluster(**{**SHIPPED.cluster("grete").__dict__, "storage": str(tmp_path / "storage")})
    image = Path(modules.image_path(SHIPPED, cluster, SHIPPED.environment("pytorch-2.3")))
    image.parent.mkdir(parents=True)
    image.write_bytes(b"staged image\n" * 1000)
    stage_record(image)
    return cluster, image


def test_write_modules_writes_executable_wrappers_and_their_check(tmp_path):
    cluster, _ = _staged_grete(tmp_path)
    paths = modules.write_modules(SHIPPED, [SHIPPED.environment("pytorch-2.3")], cluster, tmp_path / "site")
    assert modules.modulefile_path(tmp_path / "site", "pytorch-2.3") in paths
    for tool in modules.TOOLS:
        p = modules.wrapper_dir(tmp_path / "site", "pytorch-2.3") / tool
        assert p in paths and os.access(p, os.X_OK)
    assert os.access(modules.check_path(tmp_path / "site", "pytorch-2.3"), os.X_OK)
    assert not list(tmp_path.rglob("*.tmp"))


def test_write_modules_refuses_an_image_with_nothing_to_check_it_against(tmp_path):
    with pytest.raises(ShipyardError, match=r"no image to check the module shipyard/pytorch-2.3 against"):
        modules.write_modules(SHIPPED, [SHIPPED.environment("pytorch-2.3")], SHIPPED.cluster("grete"), tmp_path)


@pytest.mark.parametrize("cluster", ["apptainer", "charliecloud"])
def test_a_replaced_image_is_refused_by_every_wrapper(tmp_path, cluster):
    """The wrappers run the image check first: the staged image runs (the runtime here is a stand-in that prints
    what it was asked to run); a replaced one, its record rewritten to match its new stamp, stops with one line and
    exit 3 before the runtime starts."""
    staged, image = _staged_grete(tmp_path)
    if cluster == "charliecloud":
        staged = Cluster(**{**charliecloud_cluster().__dict__, "storage": staged.storage})
        image = Path(modules.image_path(SHIPPED, staged, SHIPPED.environment("pytorch-2.3")))
        image.write_bytes(b"staged image\n" * 1000)
        stage_record(image)
    modules.write_modules(SHIPPED, [SHIPPED.environment("pytorch-2.3")], staged, tmp_path / "site")
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for runtime in ("apptainer", "ch-run"):
        (bin_dir / runtime).write_text("#!/bin/sh\necho ran-image\n")
        (bin_dir / runtime).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    wrappers = modules.wrapper_dir(tmp_path / "site", "pytorch-2.3")
    ok = subprocess.run([str(wrappers / "python"), "-c", "1"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout == "ran-image\n", ok.stderr
    replace_staged_image(image)
    for tool in modules.TOOLS:
        res = subprocess.run([str(wrappers / tool)], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert res.returncode == 3 and "ran-image" not in res.stdout, (tool, res.stdout, res.stderr)
        assert res.stderr.count("shipyard: error:") == 1 and f"staged image {image}" in res.stderr


# ------------------------------------------------------------------------------------------ real Lmod


# The image's `python`: reports where it runs, whether --nv bound the host's GPU userspace (this machine has no NVIDIA
# driver: real `--nv` then binds the host's libglvnd libraries into /.singularity.d/libs, and exits 0 silently), the
# library path and the variables it sees inside, a file the host names in $CHECK_FILE (a bind), then its arguments.
IMAGE_TOOL = """#!/bin/sh
echo "inside=$APPTAINER_CONTAINER"
if [ -e /.singularity.d/libs/libGLX.so.0 ]; then echo nv=bound; else echo nv=none; fi
echo "ld=$LD_LIBRARY_PATH"
echo "fi=$FI_PROVIDER"
if [ -n "$CHECK_FILE" ]; then echo "check=$(cat "$CHECK_FILE")"; fi
for a in "$@"; do printf 'arg=[%s]\\n' "$a"; done
"""
# the %environment of shipyard's images: the image's own PATH and library path
IMAGE_ENV = """    export PATH=/opt/image/bin:$PATH
    export LD_LIBRARY_PATH=/opt/image/lib
"""


@pytest.fixture(scope="module")
def tool_sif(real_apptainer, tmp_path_factory) -> Path:
    """A real SIF (the real Apptainer's build): static busybox and the ``python`` stand-in (IMAGE_TOOL)."""
    from fixtures_runtimes import build_sif

    busybox = shutil.which("busybox")
    assert busybox, "busybox-static is in shipyard/data/test-packages.txt"
    d = tmp_path_factory.mktemp("tool-sif")
    rootfs = d / "rootfs"
    for sub in ("bin", "etc", "opt/image/bin"):
        (rootfs / sub).mkdir(parents=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for tool in ("sh", "cat", "printf"):
        (rootfs / "bin" / tool).symlink_to("busybox")
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    (rootfs / "opt" / "image" / "bin" / "python").write_text(IMAGE_TOOL)
    (rootfs / "opt" / "image" / "bin" / "python").chmod(0o755)
    return build_sif(real_apptainer, rootfs, d / "tool.sif", environment=IMAGE_ENV)


def _has_libglvnd() -> bool:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    return "libGLX.so.0 " in out


@pytest.fixture
def lmod_site(tmp_path, real_apptainer, tool_sif):
    """A module tree with our modules for grete (its storage and binds moved under tmp_path, the image there) plus a
    site `apptainer` module that puts the real Apptainer on PATH; returns (tmp_path, the cluster)."""
    if not LMOD_INIT.exists():
        pytest.fail("Lmod is required: apt-get install lmod (`invoke test` installs it)")
    grete = SHIPPED.cluster("grete")
    for sub in ("storage", "scratch", "lustre"):
        (tmp_path / sub).mkdir()
    cluster = Cluster(**{**grete.__dict__, "storage": str(tmp_path / "storage"),
                         "binds": (str(tmp_path / "scratch"), f"{tmp_path / 'lustre'}:/mnt/lustre-grete")})
    for env in modules.environments_on(SHIPPED, grete):  # staged: the wrappers check the image they run
        image = Path(modules.image_path(SHIPPED, cluster, env))
        shutil.copy(tool_sif, image)
        stage_record(image)
    modules.write_modules(SHIPPED, modules.environments_on(SHIPPED, grete), cluster, tmp_path / "site")
    site = tmp_path / "sitemods" / "apptainer"
    site.mkdir(parents=True)
    (site / "1.3.lua").write_text(f'prepend_path("PATH", "{real_apptainer}")\n')
    return tmp_path, cluster


def _lmod(script: str, tmp_path: Path, extra_env=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LMOD", "MODULE", "_LMFILES_", "LOADEDMODULES"))}
    env.update(extra_env or {})
    full = (f"set -e; source {LMOD_INIT}; module use {tmp_path}/sitemods; "
            f"module use {tmp_path}/site/modulefiles; {script}")
    return subprocess.run(["bash", "-c", full], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)


@pytest.mark.real_apptainer
def test_lmod_loads_module_and_wrapper_runs_in_the_real_container(lmod_site, real_apptainer):
    tmp, cluster = lmod_site
    image = modules.image_path(SHIPPED, cluster, SHIPPED.environment("pytorch-2.3"))
    (tmp / "lustre" / "in.txt").write_text("lustre\n")
    script = (
        "module load shipyard/pytorch-2.3; "
        "module -t list 2>&1; "
        'echo "which=$(command -v torchrun)"; echo "image=$SHIPYARD_IMAGE"; echo "hca=$NCCL_IB_HCA"; '
        "python 'two words' '$HOME' ';x' ''; "
        "module unload shipyard/pytorch-2.3; "
        'echo "after=$(command -v torchrun || echo none)"'
    )
    res = _lmod(script, tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "apptainer/1.3" in out, "depends_on('apptainer') did not load the site's apptainer module"
    assert f"which={modules.wrapper_dir(tmp / 'site', 'pytorch-2.3') / 'torchrun'}" in out
    assert f"image={image}" in out and "hca=mlx5" in out
    lines = res.stdout.splitlines()
    start = lines.index(f"inside={image}")  # the image's python ran in the container
    assert lines[start + 2:start + 8] == ["ld=/opt/image/lib:/.singularity.d/libs", "fi=", "arg=[two words]",
                                          "arg=[$HOME]", "arg=[;x]", "arg=[]"]
    after = out.split("after=")[1].strip()
    assert after != f"{modules.wrapper_dir(tmp / 'site', 'pytorch-2.3') / 'torchrun'}", "unload left the wrappers on PATH"
    # the cluster's binds reach the container, at their destinations: the wrapper's own apptainer words
    wrapper = modules.wrapper_dir(tmp / "site", "pytorch-2.3") / "python"
    words = shlex.split([ln for ln in wrapper.read_text().splitlines() if ln.startswith("exec ")][0])
    assert words[:4] == ["exec", "apptainer", "exec", "--nv"]
    res = subprocess.run([*words[1:words.index(image) + 1], "/bin/cat", "/mnt/lustre-grete/in.txt"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{real_apptainer}:{os.environ['PATH']}"})
    assert res.returncode == 0 and res.stdout == "lustre\n", res.stderr


@pytest.mark.real_apptainer
def test_lmod_family_swaps_between_environments(lmod_site):
    res = _lmod("module load shipyard/pytorch-2.3; module load shipyard/pytorch-2.5; "
                'echo "env=$SHIPYARD_ENVIRONMENT"; module -t list 2>&1', lmod_site[0])
    assert res.returncode == 0, res.stdout + res.stderr
    listed = res.stdout.split("env=")[1].split()
    assert listed[0] == "pytorch-2.5"
    assert "shipyard/pytorch-2.5" in listed and "shipyard/pytorch-2.3" not in listed


@pytest.mark.real_apptainer
def test_wrappers_nv_binds_the_hosts_gpu_userspace_and_a_lost_nv_shows(lmod_site):
    """A wrapper that lost --nv would run on without a GPU. On this machine (no NVIDIA driver) the real `--nv` exits
    0 and binds the host's libglvnd libraries into /.singularity.d/libs: the container sees them only with --nv."""
    if not _has_libglvnd():
        pytest.fail("libglvnd is needed to observe --nv here: apt-get install libglx0 (shipyard/data/test-packages.txt)")
    tmp, _ = lmod_site
    res = _lmod("module load shipyard/pytorch-2.3; python", tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "nv=bound" in res.stdout.splitlines()
    wrapper = modules.wrapper_dir(tmp / "site", "pytorch-2.3") / "python"
    wrapper.write_text(wrapper.read_text().replace(" --nv", ""))
    res = _lmod("module load shipyard/pytorch-2.3; python", tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "nv=none" in res.stdout.splitlines()


def _invoke(*args):
    env = {**os.environ, "SHIPYARD_REGISTRY": str(ROOT / "registry.yaml")}
    return invoke_cli(*args, cwd=ROOT, env=env, timeout=120)


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_invoke_modules_task(tmp_path):
    res = _invoke("modules", "pytorch-2.3", "--cluster", "grete", "--prefix", str(tmp_path))
    assert res.returncode == 2 and "no image to check the module shipyard/pytorch-2.3 against" in res.stderr
    assert res.stderr.count("\n") == 1 and not list(tmp_path.iterdir())
    res = _invoke("modules", "--prefix", str(tmp_path))  # defaults.cluster is the host-runtime sandbox
    assert res.returncode == 2 and "runtime is host" in res.stderr and res.stderr.count("\n") == 1


@settings(max_examples=8, deadline=None)
@given(values=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n\r"),
                               max_size=20), min_size=1, max_size=6))
def test_lua_strings_round_trip_through_real_lmod(values, tmp_path_factory):
    """Whatever a cluster's env values contain, real Lmod sets exactly that value (quotes, backslashes, newlines,
    Lua's own [[ ]] and %, shell metacharacters, non-ASCII)."""
    if not LMOD_INIT.exists():
        pytest.fail("Lmod is required: apt-get install lmod")
    tmp = tmp_path_factory.mktemp("lua")
    (tmp / "mods" / "t").mkdir(parents=True)
    body = "".join(f"setenv({escaping.lua_string(f'SHIPYARD_T{i}')}, {escaping.lua_string(v)})\n"
                   for i, v in enumerate(values))
    (tmp / "mods" / "t" / "1.lua").write_text(body, encoding="utf-8")
    dump = ("import json, os; print(json.dumps([os.environ.get(f'SHIPYARD_T{i}') for i in range(%d)]))"
            % len(values))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LMOD", "MODULE", "_LMFILES_", "LOADEDMODULES"))}
    res = subprocess.run(["bash", "-c", f"source {LMOD_INIT}; module use {tmp}/mods; module load t/1; "
                          f"{shlex.quote(sys.executable)} -c {shlex.quote(dump)}"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == values


def test_line_breaks_in_cluster_env_are_refused():
    """Lmod 8.6 turns a value with a newline into broken shell code (seen with real Lmod): refuse it up front."""
    base = SHIPPED.cluster("grete")
    cluster = Cluster(**{**base.__dict__, "env": (("NCCL_DEBUG", "INFO\nrm -rf /"),)})
    with pytest.raises(ShipyardError, match=r"clusters.grete.env.NCCL_DEBUG: .* line break"):
        modules.render_modulefile(SHIPPED.environment("pytorch-2.3"), cluster, "/i.sif", "/b")


def test_wrappers_and_modulefile_carry_host_injection():
    """fabric_options.host_injection: a launcher binds the host's fabric libraries and exports their variables
    (runtimes/mounts.py, launch/fabric.py); a module's wrappers did neither, so NCCL in `module load` fell back to
    sockets on an image that (rightly) carries no fabric userspace."""
    env = SHIPPED.environment("pytorch-2.3")
    base = SHIPPED.cluster("grete")
    inj = {"binds": ["/opt/amazon/efa", "/usr/lib/x86_64-linux-gnu/libibverbs"], "env": {"FI_PROVIDER": "efa"}}
    cluster = Cluster(**{**base.__dict__, "fabric_options": {**base.fabric_options, "host_injection": inj}})
    image = modules.image_path(None, cluster, env)
    text = modules.render_wrapper(env, cluster, "torchrun", image)
    assert shellcheck(text, shell="bash").returncode == 0
    (exec_line,) = [ln for ln in text.splitlines() if ln.startswith("exec ")]
    words = shlex.split(exec_line)
    assert words[4:-3] == [w for b in cluster.binds for w in ("--bind", b)] + \
        [w for b in inj["binds"] for w in ("--bind", f"{b}:{b}:ro")]
    lua = modules.render_modulefile(env, cluster, image, "/sw/bin")
    assert 'setenv("FI_PROVIDER", "efa")' in lua
    bad = Cluster(**{**base.__dict__, "fabric_options": {"host_injection": {"env": {"X": "a\nb"}}}})
    with pytest.raises(ShipyardError, match="host_injection.env.X"):
        modules.render_modulefile(env, bad, image, "/sw/bin")


# ------------------------------------------------------------------------------------------ host-injected path lists

INJECTED = "/opt/efa/lib"  # fabric_options.host_injection.env.LD_LIBRARY_PATH: the site's fabric libraries
HOST_LD = "/host/lib:/other/module/lib"  # the student's shell before `module load` (other modules' paths)


def injected_cluster(**over) -> Cluster:
    """grete with a host injection that has a path list (prepended) and a plain variable (set)."""
    base = SHIPPED.cluster("grete")
    inj = {"binds": over.pop("inj_binds", ["/opt/efa"]), "env": {"FI_PROVIDER": "efa", "LD_LIBRARY_PATH": INJECTED}}
    return Cluster(**{**base.__dict__, "fabric_options": {**base.fabric_options, "host_injection": inj}, **over})


def test_modulefile_prepends_injected_path_lists_and_sets_the_rest():
    """setenv would replace the shell's LD_LIBRARY_PATH on load (other modules' paths lost) and unset it on unload;
    launch.yaml's prepend_in_container names the path lists, as for launchers. clusters.NAME.env still wins."""
    env = SHIPPED.environment("pytorch-2.3")
    lua = modules.render_modulefile(env, injected_cluster(), "/i.sif", "/sw/bin").splitlines()
    assert f'prepend_path("LD_LIBRARY_PATH", "{INJECTED}")' in lua and 'setenv("FI_PROVIDER", "efa")' in lua
    assert not [ln for ln in lua if ln.startswith('setenv("LD_LIBRARY_PATH"')]
    assert 'setenv("NCCL_IB_HCA", "mlx5")' in lua  # the cluster's env: setenv
    own = injected_cluster(env=(("LD_LIBRARY_PATH", "/site/only"),))
    lua = modules.render_modulefile(env, own, "/i.sif", "/sw/bin").splitlines()
    assert [ln for ln in lua if "LD_LIBRARY_PATH" in ln] == ['setenv("LD_LIBRARY_PATH", "/site/only")']
    text = modules.render_wrapper(env, own, "python", "/i.sif")  # nothing to prepend: the tool runs directly
    assert shlex.split(text.splitlines()[-1])[-3:] == ["/i.sif", "python", "$@"]


@pytest.fixture(scope="module")
def injected_site(tmp_path_factory, real_apptainer, tool_sif) -> dict:
    """An apptainer cluster with a host injection, its module written by `invoke modules`'s writer, and at its
    <storage>/<env>.sif the real SIF of :func:`tool_sif`, whose %environment sets the image's own LD_LIBRARY_PATH."""
    if not LMOD_INIT.exists():
        pytest.fail("Lmod is required: apt-get install lmod (`invoke test` installs it)")
    d = tmp_path_factory.mktemp("injected")
    (d / "storage").mkdir()
    (d / "efa").mkdir()
    env = SHIPPED.environment("pytorch-2.3")
    cluster = injected_cluster(storage=str(d / "storage"), binds=(), modules=(), inj_binds=[str(d / "efa")])
    image = modules.image_path(None, cluster, env)
    shutil.copy(tool_sif, image)
    stage_record(Path(image))
    modules.write_modules(SHIPPED, [env], cluster, d / "prefix")
    (d / "efa" / "marker").write_text("efa-bound\n")
    return {"dir": d, "image": image, "cluster": cluster, "wrapper": modules.wrapper_dir(d / "prefix", env.name),
            "apptainer": real_apptainer}


def _lmod_env(site: dict, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LMOD", "MODULE", "_LMFILES_", "LOADEDMODULES"))}
    env.pop("LD_LIBRARY_PATH", None)
    return {**env, "PATH": f"{site['apptainer']}:{os.environ['PATH']}", **extra}


@pytest.mark.real_apptainer
def test_lmod_load_keeps_the_shells_library_path_and_unload_restores_it(injected_site):
    use = shlex.quote(str(injected_site["dir"] / "prefix" / "modulefiles"))
    script = (f"set -e; source {LMOD_INIT}; module use {use}; "
              'module load shipyard/pytorch-2.3; echo "loaded=$LD_LIBRARY_PATH|$FI_PROVIDER"; '
              'module unload shipyard/pytorch-2.3; echo "unloaded=${LD_LIBRARY_PATH-unset}|${FI_PROVIDER-unset}"')
    for before, after in ((HOST_LD, HOST_LD), (None, "unset")):
        extra = {"LD_LIBRARY_PATH": before} if before else {}
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                             env=_lmod_env(injected_site, **extra))
        assert res.returncode == 0, res.stdout + res.stderr
        lines = res.stdout.splitlines()
        assert f"loaded={INJECTED}{':' + before if before else ''}|efa" in lines
        assert f"unloaded={after}|unset" in lines


@pytest.mark.real_apptainer
def test_apptainer_wrapper_puts_the_injected_path_in_front_of_the_images_inside(injected_site):
    """Apptainer drops the host's LD_LIBRARY_PATH (an APPTAINERENV_ one would replace the image's): the wrapper runs
    the launcher's prepend line in the container, so the tool sees the injection, then the image's own path, and
    none of the student's shell; run directly and by name after `module load` (with other paths in the shell). The
    injection's bind is there, read-only at the host's path."""
    site, args = injected_site, ["two words", "$HOME", ";x", ""]
    efa = site["cluster"].host_injection["binds"][0]
    want = [f"inside={site['image']}", f"ld={INJECTED}:/opt/image/lib:/.singularity.d/libs", "fi=efa",
            "check=efa-bound", *(f"arg=[{a}]" for a in args)]

    def seen(out: str) -> list[str]:
        return [line for line in out.splitlines() if not line.startswith("nv=")]

    wrapper = site["wrapper"] / "python"
    assert shellcheck(wrapper.read_text(), shell="bash").returncode == 0
    res = subprocess.run([str(wrapper), *args], capture_output=True, text=True, timeout=60, cwd=site["dir"],
                         env=_lmod_env(site, LD_LIBRARY_PATH=f"{INJECTED}:{HOST_LD}", FI_PROVIDER="efa",
                                       CHECK_FILE=f"{efa}/marker"))  # as loaded
    assert res.returncode == 0, res.stdout + res.stderr
    assert seen(res.stdout) == want
    script = (f"set -e; source {LMOD_INIT}; module use {shlex.quote(str(site['dir'] / 'prefix'))}/modulefiles; "
              f"module load shipyard/pytorch-2.3; python {' '.join(shlex.quote(a) for a in args)}")
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=site["dir"],
                         env=_lmod_env(site, LD_LIBRARY_PATH=HOST_LD, CHECK_FILE=f"{efa}/marker"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert seen(res.stdout) == want
    words = shlex.split([ln for ln in wrapper.read_text().splitlines() if ln.startswith("exec ")][0])
    assert words[words.index("--bind") + 1] == f"{efa}:{efa}:ro"


def test_a_link_planted_in_a_shared_module_prefix_is_refused_or_replaced(tmp_path):
    """A course's module prefix may be written by others: a link at a folder of the tree is refused (nothing lands
    where it points), a link at a wrapper's or the check's name is replaced by the file."""
    cluster, _ = _staged_grete(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    prefix = tmp_path / "site"
    (prefix / "wrappers").mkdir(parents=True)
    (prefix / "wrappers" / "pytorch-2.3").symlink_to(elsewhere)
    with pytest.raises(ShipyardError, match=r"wrappers/pytorch-2.3: is a symbolic link"):
        modules.write_modules(SHIPPED, [SHIPPED.environment("pytorch-2.3")], cluster, prefix)
    assert list(elsewhere.iterdir()) == []
    (prefix / "wrappers" / "pytorch-2.3").unlink()
    (prefix / "wrappers" / "pytorch-2.3").mkdir()
    (elsewhere / "mine").write_text("m\n")
    (prefix / "wrappers" / "pytorch-2.3" / "check-image.sh").symlink_to(elsewhere / "mine")
    modules.write_modules(SHIPPED, [SHIPPED.environment("pytorch-2.3")], cluster, prefix)
    assert (elsewhere / "mine").read_text() == "m\n"
    assert not modules.check_path(prefix, "pytorch-2.3").is_symlink()
