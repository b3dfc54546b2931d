"""`invoke doctor --time-start`: the start mode from the node probe's facts, the timings from the script's clock
readings, the report's lines; and on the sandbox, for each container runtime, the staged image started for real."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from fixtures_invoke import invoke_cli

from shipyard import registry
from shipyard.jobs import start_time
from shipyard.jobs.start_time import Timing

ROOT = Path(__file__).resolve().parents[2]


def _cluster(**changes):
    import yaml

    data = yaml.safe_load((ROOT / "registry.yaml").read_text())
    data["clusters"]["sandbox"].update(changes)
    return registry.load_text(yaml.safe_dump(data), "registry.yaml", path=ROOT / "registry.yaml").cluster("sandbox")


def test_pyxis_mode_reads_the_plugstack_arguments_with_pyxis_defaults_for_the_rest():
    assert start_time.pyxis_mode({"pyxis_arg": ["runtime_path=/run/pyxis", "container_scope=job",
                                                "use_squashfuse=1"]}) == (
        "use_squashfuse=yes, container_scope=job", "job")
    # pyxis 0.24.0's own defaults (config.c), from doctor.yaml: no squashfuse, global scope
    assert start_time.mode("pyxis", {"pyxis_arg": []}) == "use_squashfuse=no, container_scope=global"
    assert start_time.mode("pyxis", {"pyxis_arg": ["use_squashfuse=false"]}).startswith("use_squashfuse=no,")


def test_apptainer_mode_from_setuid_and_the_squashfs_mount_setting():
    conf = ["allow setuid = yes", "allow setuid-mount squashfs = yes"]
    assert start_time.mode("apptainer", {"apptainer_suid": ["yes"], "apptainer_conf": conf}) == \
        "setuid, kernel SquashFS mount"
    assert start_time.mode("apptainer", {"apptainer_suid": ["yes"], "apptainer_conf": [
        "allow setuid = yes", "allow setuid-mount squashfs = no"], "squashfuse": ["/usr/bin/squashfuse_ll"]}) == \
        "setuid, squashfuse /usr/bin/squashfuse_ll"
    assert start_time.mode("apptainer", {"apptainer_suid": ["no"]}) == "user namespaces, squashfuse no squashfuse found"
    assert start_time.mode("apptainer", {}) == "mode not read: no apptainer on the node's PATH"


def test_charliecloud_mode_names_the_ch_run_version():
    assert start_time.mode("charliecloud", {"ch-run": ["0.31"]}) == "ch-run 0.31, SquashFS through libsquashfuse"
    assert start_time.mode("charliecloud", {"ch-run": ["missing"]}) == "mode not read: no ch-run on the node's PATH"


def test_a_runtime_the_node_lacks_is_not_timed():
    node = {"pyxis_plugin": ["/usr/lib/spank_pyxis.so"], "apptainer_suid": ["yes"], "ch-run": ["0.31"]}
    assert [start_time.missing(r, node) for r in start_time.CONTAINER_RUNTIMES] == ["", "", ""]
    assert [start_time.missing(r, {"ch-run": ["missing"]}) for r in start_time.CONTAINER_RUNTIMES] == [
        "no pyxis in the node's plugstack.conf", "no apptainer on the node's PATH", "no ch-run on the node's PATH"]
    assert start_time.missing("pyxis", None) == "the node probe did not run"


def test_runtimes_timed_the_clusters_own_or_all_on_the_sandbox():
    assert start_time.runtimes_to_time(_cluster()) == ("pyxis", "apptainer", "charliecloud")
    assert start_time.runtimes_to_time(_cluster(local_sandbox=False, runtime="apptainer")) == ("apptainer",)
    assert start_time.runtimes_to_time(_cluster(local_sandbox=False)) == ()  # host: nothing to start


def test_timing_subtracts_the_plain_step_from_each_start():
    clocks = start_time.parse("noise\n@start-time node node1\n@start-time t0 100.0\n@start-time t1 100.5\n"
                              "@start-time t2 102.6\n@start-time t3 104.1\n@start-time t9\n")
    assert clocks == {"node": "node1", "t0": "100.0", "t1": "100.5", "t2": "102.6", "t3": "104.1"}
    t = start_time.timing("pyxis", "use_squashfuse=no, container_scope=job", clocks)
    assert (t.node, t.baseline) == ("node1", 0.5)
    assert t.cold == pytest.approx(1.6) and t.warm == pytest.approx(1.0)
    fast = start_time.timing("apptainer", "m", {"t0": "0", "t1": "1", "t2": "1.5", "t3": "2.4"})
    assert fast.cold == 0.0 and fast.warm == 0.0  # never below nothing: a step faster than the plain one is 0


def test_report_has_one_line_per_runtime():
    text = start_time.render([
        Timing("pyxis", "use_squashfuse=no, container_scope=job", 1.6, 1.04, "node1", 0.4),
        Timing("apptainer", "setuid, kernel SquashFS mount", 0.44, 0.31, "node1", 0.5),
        Timing("charliecloud", "ch-run 0.31, SquashFS through libsquashfuse",
               note="no staged image at /s/pytorch-2.3.sqsh (invoke stage pytorch-2.3 --cluster sandbox)"),
    ], "pytorch-2.3")
    assert text == (
        "Container start of the staged pytorch-2.3 image on node1 (seconds over a plain `srun true` step of "
        "0.4-0.5 s):\n"
        "pyxis (use_squashfuse=no, container_scope=job): cold 1.6 s, warm 1.0 s\n"
        "apptainer (setuid, kernel SquashFS mount): cold 0.4 s, warm 0.3 s\n"
        "charliecloud (ch-run 0.31, SquashFS through libsquashfuse): not timed: no staged image at "
        "/s/pytorch-2.3.sqsh (invoke stage pytorch-2.3 --cluster sandbox)\n")
    assert start_time.render([], "e") == "Container start: not timed (the cluster runs no container runtime)\n"


def test_salloc_argv_passes_values_as_arguments():
    argv = start_time.salloc_argv(_cluster(), "pyxis", "/img dir/pytorch-2.3.sqsh", "shipyard-doctor-1")
    assert argv[:2] == ["salloc", "--partition=debug"] and "--nodes=1" in argv
    i = argv.index("bash")
    assert argv[i + 1] == "-c" and argv[i + 2] == start_time.script()
    assert argv[i + 3:] == ["shipyard-start-time", "shipyard-doctor-1", "--",
                            "--container-image=/img dir/pytorch-2.3.sqsh", "--container-name=shipyard-doctor-1",
                            "--no-container-mount-home"]
    # unnamed (bench/container_start.py's every-step unpack): no --container-name
    assert start_time.start_words("pyxis", "/i.sqsh", "") == ["--container-image=/i.sqsh", "--no-container-mount-home"]
    assert start_time.salloc_argv(_cluster(), "charliecloud", "/i.sqsh", "n")[-6:] == [
        "shipyard-start-time", "", "--", "ch-run", "/i.sqsh", "--"]  # no container to remove


# ------------------------------------------------------------------------------------------------ real Slurm

LINE = r"{runtime} \({mode}\): cold (\d+\.\d) s, warm (\d+\.\d) s"


@pytest.mark.slurm
@pytest.mark.parametrize("runtime", [pytest.param("pyxis", marks=pytest.mark.real_runtimes),
                                     pytest.param("apptainer", marks=pytest.mark.real_apptainer),
                                     "charliecloud"])
def test_time_start_on_the_sandbox(request, sandbox, busybox_container_rootfs, tmp_path, runtime):
    """The runtime's staged image (alone in the storage) started twice on one node: the report names the mode and
    both times; a runtime whose image is not staged says so and is not a failure."""
    import yaml
    from fixtures_runtimes import build_sif, squashfs
    from fixtures_tools import write_tools_registry

    from shipyard import sandbox as sb

    path = write_tools_registry(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["clusters"]["sandbox"]["storage"] = str(tmp_path / "images")
    path.write_text(yaml.safe_dump(data))
    images = tmp_path / "images"
    images.mkdir()
    for p in (tmp_path, images):
        p.chmod(0o755)
    env = {**os.environ, "SHIPYARD_REGISTRY": str(path), sb.DIR_ENV: str(sandbox.directory)}
    if runtime == "apptainer":
        bin_dir = request.getfixturevalue("apptainer_on_path")
        build_sif(bin_dir, busybox_container_rootfs, images / "pytorch-2.3.sif")
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        mode = r"setuid, kernel SquashFS mount"
    else:
        if runtime == "pyxis":
            request.getfixturevalue("real_pyxis")
            mode = r"use_squashfuse=no, container_scope=global"  # the sandbox's plugstack line (sandbox.yaml)
        else:
            mode = r"ch-run 0\.\d+, SquashFS through libsquashfuse"
        squashfs(busybox_container_rootfs, images / "pytorch-2.3.sqsh")
    proc = invoke_cli("doctor", "--cluster", "sandbox", "--time-start", cwd=tmp_path, env=env, timeout=400)
    out = proc.stdout
    assert "Container start of the staged pytorch-2.3 image on node" in out, out + proc.stderr
    m = re.search(LINE.format(runtime=runtime, mode=mode), out)
    assert m, out + proc.stderr
    assert 0 <= float(m.group(1)) < 120 and 0 <= float(m.group(2)) < 120
    assert "the start failed" not in out, out + proc.stderr
    if runtime == "apptainer":
        assert re.search(r"^charliecloud \(.*\): not timed: no staged image at .*pytorch-2\.3\.sqsh", out, re.M), out
    if runtime == "pyxis":
        from shipyard.sandbox import runtimes

        leftover = [p for n in sandbox.nodes
                    for p in (runtimes.node_dir(sandbox.directory, n) / "enroot" / "data").glob("pyxis_shipyard-doctor-*")]
        assert not leftover, leftover  # the named container of global scope was removed
    shutil.rmtree(images)
