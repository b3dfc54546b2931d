"""invoke doctor: the probe script (shellcheck, real bash, strict doubles for nvidia-smi and enroot, the real
Apptainer), the pure evaluation of probe results (golden reports), and the report through invoke."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace

import pytest
from fixtures_invoke import invoke_cli
from helpers_registry import GOLDEN, ROOT, golden

from shipyard import registry
from shipyard.jobs import doctor

DATA = ROOT / "tests" / "data" / "doctor"
# the nvidia-smi double of the doctor probe, and the one enroot double every area shares (Apptainer is the real one:
# the apptainer_on_path fixture)
DOUBLES = os.pathsep.join(str(ROOT / "tests" / "doubles" / d) for d in ("doctor", "enroot"))
REG = registry.load(ROOT / "registry.yaml")


def probe(name: str) -> dict:
    return doctor.parse_probe((DATA / name).read_text())


def report(cluster: str, env: str, login: str, node: str | None, error: str | None = None, storage="/st") -> tuple:
    c, e = REG.cluster(cluster), REG.environment(env)
    findings = doctor.evaluate(c, e, storage, probe(login), probe(node) if node else None, error)
    return findings, doctor.render(c, e, findings)


def by_check(findings, where, check):
    return [f for f in findings if f.where == where and f.check == check]


def test_grete_h100_golden():
    findings, text = report("grete", "pytorch-2.3", "grete_login.txt", "grete_node_h100.txt",
                            storage="/scratch/projects/shipyard/images")
    golden(GOLDEN / "doctor" / "grete-h100.txt", text)
    assert not [f for f in findings if f.status == "FAIL"]
    (gpu,) = by_check(findings, "ggpu142", "gpu")
    assert gpu.status == "PASS" and "1 x NVIDIA H100 80GB HBM3, driver 570.86.15, sm_90" in gpu.detail
    (drv,) = by_check(findings, "ggpu142", "driver")
    assert drv.status == "WARN" and 'clusters.grete.driver: "570.86.15"' in drv.fix


def test_aws_old_driver_and_missing_pieces_golden():
    findings, text = report("aws-pcluster", "pytorch-2.14", "aws_login.txt", "aws_node_old_driver.txt",
                            storage="/fsx/shipyard/images")
    golden(GOLDEN / "doctor" / "aws-old-driver.txt", text)
    fails = {(f.where, f.check) for f in findings if f.status == "FAIL"}
    assert fails == {("login", "pyxis"), ("login", "free space"), ("p5-st-1", "enroot"), ("p5-st-1", "gpu"),
                     ("p5-st-1", "storage")}
    (gpu,) = by_check(findings, "p5-st-1", "gpu")
    assert gpu.detail.startswith("8 x NVIDIA H100 80GB HBM3, driver 535.183.01, sm_90: driver 535.183.01 is too old "
                                 "for CUDA 13.0")
    shared = [f for f in by_check(findings, "p5-st-1", "storage") if "not shared" in f.detail]
    assert shared and shared[0].status == "FAIL"


def test_sandbox_without_gpu_and_failed_step_golden():
    findings, text = report("sandbox", "pytorch-2.3", "sandbox_login.txt", None,
                            "srun: error: Unable to allocate resources: Invalid partition name specified",
                            storage="<root>/.sandbox/images")
    golden(GOLDEN / "doctor" / "sandbox-step-failed.txt", text)
    assert findings[-1].check == "srun" and findings[-1].status == "FAIL"
    assert "Invalid partition name" in findings[-1].detail


def test_gpu_arch_not_in_wheel_fails():
    node = probe("grete_node_h100.txt")
    node["gpu"] = ["Tesla K80, 470.256.02, 3.7"]
    findings = doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/st", probe("grete_login.txt"),
                               node)
    (gpu,) = by_check(findings, "ggpu142", "gpu")
    assert gpu.status == "FAIL" and "sm_37" in gpu.detail


def test_no_gpu_is_fail_where_the_profile_lists_gpus_and_warn_on_the_sandbox():
    node = probe("grete_node_h100.txt")
    node["gpu"] = ["missing"]
    grete = doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/st", probe("grete_login.txt"), node)
    assert by_check(grete, "ggpu142", "gpu")[0].status == "FAIL"
    sandbox = doctor.evaluate(REG.cluster("sandbox"), REG.environment("pytorch-2.3"), "/st",
                              probe("sandbox_login.txt"), node)
    (gpu,) = by_check(sandbox, "ggpu142", "gpu")
    assert gpu.status == "WARN" and gpu.detail.startswith("no GPU: nvidia-smi not found")


def test_old_slurm_warns_and_broken_srun_fails():
    login = probe("grete_login.txt")
    login["slurm"] = ["slurm 18.08.9"]
    f = doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/st", login, None, "x")[0]
    assert (f.status, f.check) == ("WARN", "slurm") and "older than 19.05" in f.detail
    login["slurm"] = ["srun: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host"]
    f = doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/st", login, None, "x")[0]
    assert f.status == "FAIL" and "SLURM_CONF" in f.fix


def test_build_args_need_newer_apptainer():
    env = replace(REG.environment("pytorch-2.3"), build_args=(("X", "1"),))
    login = probe("grete_login.txt")
    login["apptainer"] = ["apptainer version 1.1.9"]
    findings = doctor.evaluate(REG.cluster("grete"), env, "/st", login, None, "x")
    (app,) = by_check(findings, "login", "apptainer")
    assert app.status == "WARN" and "Apptainer >= 1.2" in app.detail


def test_probe_script_passes_shellcheck(tmp_path):
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck is required"
    res = subprocess.run([exe, "-S", "warning", "-s", "bash", "-"], input=doctor.probe_script(), text=True,
                         capture_output=True)
    assert res.returncode == 0, res.stdout


def _run_probe(tmp_path, storage: str, marker: str, extra_env: dict, path_first: list[str]):
    argv = ["bash", "-c", doctor.probe_script(), "shipyard-doctor", storage, marker]
    env = {**os.environ, "PATH": os.pathsep.join(path_first + [os.environ["PATH"]]), **extra_env}
    res = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tmp_path)
    return res, doctor.parse_probe(res.stdout)


def _real_apptainer_version() -> str:
    """What the real Apptainer shipyard installs says to ``--version`` (shipyard/data/sandbox.yaml)."""
    from shipyard.sandbox import apptainer

    return f"apptainer version {apptainer.apptainer_facts()['version']}"


@pytest.mark.double
@pytest.mark.real_apptainer
def test_probe_against_strict_doubles(tmp_path, apptainer_on_path):
    """Real bash runs the probe; nvidia-smi and enroot are the strict doubles (no GPU, no enroot here), apptainer
    is the real one."""
    store = tmp_path / "images"
    store.mkdir()
    (store / "marker").write_text("x")
    gpus = "NVIDIA A100-SXM4-80GB, 550.54.15, 8.0;NVIDIA A100-SXM4-80GB, 550.54.15, 8.0"
    res, p = _run_probe(tmp_path, str(store), "marker", {"SHIPYARD_DOUBLE_GPUS": gpus}, [str(DOUBLES)])
    assert "double: unexpected" not in res.stderr, res.stderr
    assert p["gpu"] == ["NVIDIA A100-SXM4-80GB, 550.54.15, 8.0"] * 2
    assert p["apptainer"] == [_real_apptainer_version()]
    assert p["enroot"] == ["3.5.0"]
    assert p["storage"] == ["present"] and p["storage_writable"] == ["yes"] and p["storage_shared"] == ["yes"]
    assert int(p["storage_free_kb"][0]) > 0
    assert list(store.iterdir()) == [store / "marker"]  # the write test leaves nothing behind
    findings = doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), str(store), p, p)
    (gpu,) = [f for f in findings if f.check == "gpu"]
    assert gpu.status == "PASS" and gpu.detail.startswith("2 x NVIDIA A100-SXM4-80GB, driver 550.54.15, sm_80")


@pytest.mark.double
def test_probe_reports_driver_failure_and_missing_storage(tmp_path):
    res, p = _run_probe(tmp_path, str(tmp_path / "nope"), "-",
                        {"SHIPYARD_DOUBLE_NVSMI_FAIL": "NVIDIA-SMI has failed because it couldn't communicate with "
                                                       "the NVIDIA driver."}, [str(DOUBLES)])
    assert p["gpu_error"][0].startswith("NVIDIA-SMI has failed")
    assert p["storage"] == ["missing"]
    findings = doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/x", p, p)
    assert {f.check for f in findings if f.status == "FAIL"} >= {"gpu", "storage"}


def test_probe_without_tools(tmp_path):
    """On this machine (no GPU, no apptainer, no enroot) the probe says so rather than failing."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "hostname", "id", "grep", "head", "tr", "mktemp", "rm", "df", "awk"):
        os.symlink(shutil.which(tool), bindir / tool)
    argv = [str(bindir / "bash"), "-c", doctor.probe_script(), "shipyard-doctor", str(tmp_path), "-"]
    res = subprocess.run(argv, env={"PATH": str(bindir)}, capture_output=True, text=True)
    p = doctor.parse_probe(res.stdout)
    assert p["slurm"] == ["missing"] and p["apptainer"] == ["missing"] and p["enroot"] == ["missing"]
    assert p["gpu"] == ["missing"] and p["fakeroot"] == ["missing"] and p["ch-run"] == ["missing"]
    assert doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/x", p, None, "e")[0].status == "FAIL"


def test_parse_ignores_noise():
    p = doctor.parse_probe("Lmod has detected...\n@doctor\tgpu\tA, 1, 8.0\nsrun: job 5 queued\n@doctor\tgpu\tB, 1, 9.0\n"
                           "@doctor\tbroken line\n")
    assert p == {"gpu": ["A, 1, 8.0", "B, 1, 9.0"]}


# ------------------------------------------------------------------------------------------------ real Slurm


def _sandbox_project(tmp_path, sandbox, runtime=None, **sandbox_changes):
    """A project whose sandbox cluster stores images in a fresh directory (and takes ``sandbox_changes``)."""
    import yaml
    from fixtures_tools import write_tools_registry

    from shipyard import sandbox as sb

    path = write_tools_registry(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["clusters"]["sandbox"]["storage"] = str(tmp_path / "images")
    if runtime:
        data["clusters"]["sandbox"]["runtime"] = runtime
    for key, value in sandbox_changes.items():
        data["clusters"]["sandbox"]["scheduler"][key] = value
    path.write_text(yaml.safe_dump(data))
    (tmp_path / "images").mkdir()
    return {**os.environ, "SHIPYARD_REGISTRY": str(path), sb.DIR_ENV: str(sandbox.directory)}


def _doctor(tmp_path, env, *args):
    return invoke_cli("doctor", "--cluster", "sandbox", *args, cwd=tmp_path, env=env, timeout=300)


def _lines(text: str) -> dict:
    """(status, where, check) -> detail, from the report."""
    out = {}
    for line in text.splitlines()[1:-1]:
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0] in ("PASS", "WARN", "FAIL"):
            out.setdefault((parts[0], parts[1], parts[2]), parts[3])
    return out


def test_powered_down_nodes_make_the_probe_wait_for_the_resume_timeout():
    """sinfo's compact states (sinfo(1), NODE STATE CODES: ~ powered off, # powering up, % powering down, * not
    responding) and scontrol show config's ResumeTimeout line (its format checked on the real sandbox below)."""
    assert doctor.powered_down("idle~\nidle~\nalloc\n")  # ParallelCluster's dynamic nodes before the first job
    assert doctor.powered_down("mix#\nidle~*\n")
    assert not doctor.powered_down("idle\nidle~\n")  # an idle node takes the probe at once
    assert not doctor.powered_down("alloc\nmix\n") and not doctor.powered_down("")
    text = "SuspendTimeout          = 30 sec\nResumeTimeout           = 1800 sec\nResvOverRun             = 0 min\n"
    assert doctor.resume_timeout(text) == 1800 and doctor.resume_timeout("Foo = 1 sec\n") is None


@pytest.mark.slurm
def test_probe_wait_on_the_real_sandbox(sandbox, monkeypatch):
    """The sandbox's nodes are up: the ordinary wait; its controller's config has a ResumeTimeout line to read."""
    monkeypatch.setenv("SHIPYARD_SANDBOX_DIR", str(sandbox.directory))
    cl = registry.load(ROOT / "registry.yaml").cluster("sandbox")
    assert doctor.probe_wait(cl) == (int(doctor.facts()["probe_wait_s"]), None)
    conf = sandbox.run(["scontrol", "show", "config"])
    assert doctor.resume_timeout(conf.stdout) is not None, conf.stdout[:2000]


@pytest.mark.slurm
def test_doctor_on_the_sandbox_for_real(sandbox, tmp_path):
    env = _sandbox_project(tmp_path, sandbox)
    proc = _doctor(tmp_path, env)
    found = _lines(proc.stdout)
    # Everything passes here except, on a nearly full disk, free space (a fact of the machine, not of shipyard).
    assert not [k for k in found if k[0] == "FAIL" and k[2] != "free space"], proc.stdout + proc.stderr
    assert proc.returncode == (1 if [k for k in found if k[0] == "FAIL"] else 0)
    assert found[("PASS", "login", "slurm")].startswith("Slurm 22.05")
    node = [w for (s, w, c) in found if c == "srun"]
    assert node and node[0] in sandbox.nodes
    gpu = found[("WARN", node[0], "gpu")]
    assert gpu.startswith("no GPU: nvidia-smi not found")  # the sandbox has no GPU and says so
    assert ("PASS", node[0], "storage") in found
    assert "shared with the login node" in proc.stdout
    assert list((tmp_path / "images").iterdir()) == []  # marker and write test cleaned up


@pytest.mark.slurm
@pytest.mark.double
def test_doctor_sees_gpus_on_the_node_through_srun(sandbox, tmp_path):
    """The strict nvidia-smi double on PATH reaches the node through srun's environment: the GPU findings are
    made from what the node reported (double, not a real GPU)."""
    env = _sandbox_project(tmp_path, sandbox)
    env["PATH"] = f"{DOUBLES}{os.pathsep}{env['PATH']}"
    env["SHIPYARD_DOUBLE_GPUS"] = "NVIDIA H100 80GB HBM3, 520.61.05, 9.0"
    proc = _doctor(tmp_path, env, "--env", "pytorch-2.5")
    found = _lines(proc.stdout)
    node = [w for (s, w, c) in found if c == "srun"][0]
    detail = found[("FAIL", node, "gpu")]
    assert detail.startswith("1 x NVIDIA H100 80GB HBM3, driver 520.61.05, sm_90: driver 520.61.05 is too old for "
                             "CUDA 12.4")
    assert proc.returncode == 1


@pytest.mark.slurm
@pytest.mark.real_apptainer
def test_doctor_finds_the_real_apptainer_on_login_and_node(sandbox, tmp_path, apptainer_on_path):
    """An apptainer cluster: the real Apptainer, first on the test's PATH and so on the job's, answers the probe on
    the login node and through srun on a compute node."""
    env = _sandbox_project(tmp_path, sandbox, runtime="apptainer")
    proc = _doctor(tmp_path, env)
    found = _lines(proc.stdout)
    node = [w for (s, w, c) in found if c == "srun"][0]
    assert node in sandbox.nodes, proc.stdout
    for where in ("login", node):
        assert found.get(("PASS", where, "apptainer")) == _real_apptainer_version(), proc.stdout + proc.stderr


@pytest.mark.slurm
def test_doctor_reports_a_step_that_cannot_start(sandbox, tmp_path):
    env = _sandbox_project(tmp_path, sandbox, partition="nosuchpart", partitions=["nosuchpart"])
    proc = _doctor(tmp_path, env)
    assert proc.returncode == 1
    found = _lines(proc.stdout)
    detail = found[("FAIL", "compute", "srun")]
    assert detail.startswith("no step ran on partition nosuchpart:") and "nvalid partition" in detail


@pytest.mark.slurm
@pytest.mark.double
def test_doctor_finds_pyxis_in_srun_help(sandbox, tmp_path, pyxis_double):
    """With the pyxis SPANK **test double** in the sandbox's plugstack.conf, the real `srun --help` lists
    --container-image, and a pyxis cluster passes the pyxis check; enroot is the strict enroot double."""
    env = _sandbox_project(tmp_path, sandbox, runtime="pyxis")
    env["PATH"] = f"{DOUBLES}{os.pathsep}{env['PATH']}"
    proc = _doctor(tmp_path, env)
    found = _lines(proc.stdout)
    assert found[("PASS", "login", "pyxis")] == "present: srun --help lists --container-image"
    node = [w for (s, w, c) in found if c == "srun"][0]
    assert found[("PASS", node, "enroot")] == "version 3.5.0"
    assert found[("PASS", node, "apptainer")].startswith("not needed (runtime pyxis)")


@pytest.fixture
def without_spank_plugins(sandbox):
    """The sandbox's plugstack.conf emptied for one test (the session's pyxis double may be listed), then restored."""
    from shipyard import sandbox as sb

    conf = sandbox.directory / "etc" / "plugstack.conf"
    saved = conf.read_text() if conf.exists() else None
    sb.set_plugstack([], sandbox.directory)
    try:
        yield
    finally:
        if saved is not None:
            conf.write_text(saved)


@pytest.mark.slurm
def test_doctor_without_pyxis_fails_a_pyxis_cluster(sandbox, tmp_path, without_spank_plugins):
    env = _sandbox_project(tmp_path, sandbox, runtime="pyxis")
    # enroot on /usr/bin comes and goes with the real-runtime test run beside this one (`sandbox.runtimes` installs
    # it, `sandbox.down` removes it); the nodes share this machine's /usr/bin, so look before and after the probe:
    # the enroot line is checked when nothing changed meanwhile (when it did, either answer is right).
    had_enroot = shutil.which("enroot", path="/usr/bin:/bin")
    proc = _doctor(tmp_path, env)
    has_enroot = shutil.which("enroot", path="/usr/bin:/bin")
    assert proc.returncode == 1
    found = _lines(proc.stdout)
    assert found[("FAIL", "login", "pyxis")].startswith("runtime pyxis, but srun --help does not list")
    node = [w for (s, w, c) in found if c == "srun"][0]
    if had_enroot and has_enroot:
        assert ("FAIL", node, "enroot") not in found, proc.stdout
    elif not had_enroot and not has_enroot:
        assert found[("FAIL", node, "enroot")].startswith("enroot not found"), proc.stdout


def test_charliecloud_cluster_needs_ch_run_on_the_compute_node():
    """runtime: charliecloud: ch-run missing on the node FAILs (every step runs through it), on the login node only
    WARNs; too old for SquashFS images WARNs; present PASSes; pyxis and enroot are then not needed."""
    from dataclasses import replace

    c, e = replace(REG.cluster("sandbox"), runtime="charliecloud"), REG.environment("pytorch-2.3")
    login, node = probe("sandbox_login.txt"), probe("grete_node_h100.txt")
    node.pop("ch-run", None)
    findings = doctor.evaluate(c, e, "/st", login, node)
    (n,) = by_check(findings, "ggpu142", "ch-run")
    assert n.status == "FAIL" and n.detail.startswith("ch-run not found") and "Charliecloud >= 0.26" in n.fix
    (lg,) = by_check(findings, "login", "ch-run")
    assert lg.status == "WARN"
    assert all(f.status == "PASS" and "not needed" in f.detail for f in by_check(findings, "ggpu142", "enroot"))
    for version, status in (("0.25", "WARN"), ("0.31", "PASS")):
        node["ch-run"] = [version]
        (n,) = by_check(doctor.evaluate(c, e, "/st", login, node), "ggpu142", "ch-run")
        assert n.status == status and version in n.detail


def test_probe_reads_the_real_ch_run_version(tmp_path):
    """Debian's charliecloud-runtime (shipyard/data/test-packages.txt): the probe reports what `ch-run --version`
    says, and a charliecloud cluster passes with it."""
    ch_run = shutil.which("ch-run")
    assert ch_run, "charliecloud-runtime is in shipyard/data/test-packages.txt"
    argv = ["bash", "-c", doctor.probe_script(), "shipyard-doctor", str(tmp_path), "-"]
    p = doctor.parse_probe(subprocess.run(argv, capture_output=True, text=True).stdout)
    want = subprocess.run([ch_run, "--version"], capture_output=True, text=True, env={**os.environ, "USER": "root"})
    assert p["ch-run"] == [(want.stdout + want.stderr).strip().splitlines()[0]]
    from dataclasses import replace

    c = replace(REG.cluster("sandbox"), runtime="charliecloud")
    (f,) = by_check(doctor.evaluate(c, REG.environment("pytorch-2.3"), "/x", p, None, "e"), "login", "ch-run")
    assert f.status == "PASS" and f.detail == f"version {p['ch-run'][0]}"


def _fake_tool(bindir: Path, name: str, script: str) -> None:
    (bindir / name).write_text("#!/bin/sh\n" + script)
    (bindir / name).chmod(0o755)


def test_probe_reads_the_start_path_from_the_runtimes_configuration(tmp_path):
    """The probe reads pyxis's arguments from the plugstack file scontrol names (and its plugstack.conf.d), and
    Apptainer's setuid settings from the apptainer.conf its buildcfg names; stand-ins answer for scontrol and
    apptainer (the real files are the site's)."""
    bindir, etc = tmp_path / "bin", tmp_path / "etc"
    bindir.mkdir()
    (etc / "slurm" / "plugstack.conf.d").mkdir(parents=True)
    (etc / "apptainer").mkdir()
    (etc / "slurm" / "plugstack.conf").write_text("include plugstack.conf.d/*\n# required /x/spank_pyxis.so old=1\n")
    (etc / "slurm" / "plugstack.conf.d" / "pyxis.conf").write_text(
        "required /usr/lib/pyxis/spank_pyxis.so runtime_path=/run/pyxis container_scope=job use_squashfuse=1\n")
    (etc / "apptainer" / "apptainer.conf").write_text(
        "# allow setuid = no\nallow setuid = yes\nallow setuid-mount squashfs  =  iflimited\nallow pid ns = yes\n")
    _fake_tool(bindir, "scontrol", f'echo "PlugStackConfig         = {etc}/slurm/plugstack.conf"\n')
    _fake_tool(bindir, "apptainer", f'case "$1" in buildcfg) echo "SYSCONFDIR={etc}"; echo "LIBEXECDIR={tmp_path}";; '
                                    '*) echo "apptainer version 1.4.5";; esac\n')
    _fake_tool(bindir, "squashfuse_ll", "exit 0\n")
    _, p = _run_probe(tmp_path, str(tmp_path), "-", {}, [str(bindir)])
    assert p["pyxis_plugin"] == ["/usr/lib/pyxis/spank_pyxis.so"]  # the commented line is not read
    assert p["pyxis_arg"] == ["runtime_path=/run/pyxis", "container_scope=job", "use_squashfuse=1"]
    assert p["apptainer_conf"] == ["allow setuid = yes", "allow setuid-mount squashfs = iflimited"]
    assert p["apptainer_suid"] == ["no"] and p["squashfuse"][0] == str(bindir / "squashfuse_ll")


def test_probe_finds_the_plugstack_beside_slurm_conf_when_none_is_configured(tmp_path):
    """Slurm's default: PlugStackConfig unset (scontrol shows "(null)") means plugstack.conf in slurm.conf's
    folder, which scontrol names on its SLURM_CONF line (the sandbox's case)."""
    bindir, etc = tmp_path / "bin", tmp_path / "etc"
    bindir.mkdir()
    etc.mkdir()
    (etc / "plugstack.conf").write_text("required /opt/pyxis/spank_pyxis.so container_scope=global\n")
    _fake_tool(bindir, "scontrol", f'echo "PlugStackConfig         = (null)"; echo "SLURM_CONF              = '
                                   f'{etc}/slurm.conf"\n')
    _, p = _run_probe(tmp_path, str(tmp_path), "-", {}, [str(bindir)])
    assert p["pyxis_plugin"] == ["/opt/pyxis/spank_pyxis.so"] and p["pyxis_arg"] == ["container_scope=global"]


def test_start_path_findings_say_what_the_settings_mean():
    node = probe("grete_node_h100.txt")
    assert not [f for f in doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/st",
                                           probe("grete_login.txt"), node) if f.check == "start path"]
    pyxis = replace(REG.cluster("grete"), runtime="pyxis")
    unpack = {**node, "pyxis_plugin": ["/usr/lib/pyxis/spank_pyxis.so"], "pyxis_arg": ["runtime_path=/run/pyxis"],
              "enroot_conf": ["ENROOT_DATA_PATH /tmp/enroot-data/user-$(id -u)"]}
    found = by_check(doctor.evaluate(pyxis, REG.environment("pytorch-2.3"), "/st", probe("grete_login.txt"), unpack),
                     "ggpu142", "start path")
    assert found[0].status == "WARN" and "runtime_path=/run/pyxis (where enroot keeps" in found[0].detail
    assert "unpacks the staged .sqsh on every node" in found[0].fix
    assert found[1].detail == "enroot: ENROOT_DATA_PATH /tmp/enroot-data/user-$(id -u)"
    fuse = {**unpack, "pyxis_arg": ["use_squashfuse=1"]}
    (first, _) = by_check(doctor.evaluate(pyxis, REG.environment("pytorch-2.3"), "/st", probe("grete_login.txt"),
                                          fuse), "ggpu142", "start path")
    assert first.status == "PASS" and "mounted with squashfuse" in first.detail
    appt = {**node, "apptainer_conf": ["allow setuid = yes", "allow setuid-mount squashfs = yes"],
            "apptainer_suid": ["yes"], "squashfuse": ["/usr/bin/squashfuse_ll"]}
    (a,) = by_check(doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/st",
                                    probe("grete_login.txt"), appt), "ggpu142", "start path")
    assert a.detail.startswith("apptainer: setuid starter, the kernel mounts the SIF's SquashFS")
    userns = {**appt, "apptainer_suid": ["no"]}
    (u,) = by_check(doctor.evaluate(REG.cluster("grete"), REG.environment("pytorch-2.3"), "/st",
                                    probe("grete_login.txt"), userns), "ggpu142", "start path")
    assert u.detail.startswith("apptainer: user namespaces, SquashFS through squashfuse (/usr/bin/squashfuse_ll)")
