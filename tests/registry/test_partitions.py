"""Partitions with their own resources (scheduler.partitions mapping form), the resources a launcher asks for on
them, and where a launcher's job looks for its script."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_launch import build_launcher

from shipyard import registry
from shipyard.errors import ShipyardError
from shipyard.launch import launcher as launch

REG = """\
environments:
  e: {torch: "2.5.1", cuda: "12.4", python: "3.11", os: ubuntu22.04}
clusters:
  site:
    runtime: apptainer
    fabric: ib
    gpus_per_node: 8
    cpus_per_node: 64
    mem_per_node: 512G
    gpus: [{model: H100, arch: sm_90}]
    binds: [/scratch]
    storage: /scratch/images
    scheduler:
      partition: big
      time: "08:00:00"
      partitions:
        big:
        shared: {gpus_per_node: 4, cpus_per_node: 32, mem_per_node: 256G, max_time: "02:00:00"}
        interactive: {gpus_per_node: 1, cpus_per_node: 8, fabric: socket, exclusive: true}
  plain:
    runtime: host
    fabric: socket
    gpus_per_node: 2
    cpus_per_node: 4
    scheduler: {partition: a, partitions: [a, b]}
defaults: {environment: e, cluster: site}
"""


@pytest.fixture
def reg(tmp_path):
    (tmp_path / "registry.yaml").write_text(REG)
    (tmp_path / "train.py").write_text("")
    return registry.load(tmp_path / "registry.yaml")


def _build(reg, **kw):
    kw.setdefault("command", ("train.py",))
    return build_launcher(reg, **kw)


def test_list_form_keeps_the_cluster_wide_values(reg):
    plain = reg.cluster("plain")
    assert plain.partitions == ("a", "b")
    assert plain.on("b").gpus_per_node == 2 and plain.on("b").cpus_per_node == 4 and plain.on("b").partition == "b"


def test_mapping_form_inherits_what_a_partition_does_not_set(reg):
    site = reg.cluster("site")
    big, shared, inter = (site.partition_info(p) for p in ("big", "shared", "interactive"))
    assert (big.gpus_per_node, big.cpus_per_node, big.mem_per_node_mb, big.fabric) == (8, 64, 512 * 1024, "ib")
    assert (shared.gpus_per_node, shared.mem_per_node_mb, shared.max_time, shared.gpus) == \
        (4, 256 * 1024, "02:00:00", big.gpus)
    assert (inter.fabric, inter.exclusive) == ("socket", True)
    assert site.key("gpus_per_node", "shared") == "clusters.site.scheduler.partitions.shared.gpus_per_node"
    assert site.key("gpus_per_node", "big") == "clusters.site.gpus_per_node"


def test_bad_key_inside_a_partition_is_one_line_naming_it():
    with pytest.raises(ShipyardError) as e:
        registry.load_text(REG.replace("max_time:", "max_tim:"))
    assert str(e.value).startswith("registry.yaml:18: clusters.site.scheduler.partitions.shared.max_tim: "
                                   "unknown key 'max_tim'")


def test_cpus_and_memory_in_proportion_to_the_gpus(reg):
    one = _build(reg, partition="shared", gpus_per_node=1)
    assert (one.cpus_per_task, one.mem, one.exclusive) == (8, f"{256 * 1024 // 4}M", False)
    whole = _build(reg, partition="shared")
    assert (whole.cpus_per_task, whole.mem) == (32, None)
    text = launch.render(one)
    assert "#SBATCH --cpus-per-task=8\n" in text and f"#SBATCH --mem={256 * 1024 // 4}M\n" in text
    assert "--cpus-per-task 8" in " ".join(one.regenerate) and "--mem" in one.regenerate


def test_flags_override_and_are_checked_against_the_partition(reg):
    l = _build(reg, partition="shared", gpus_per_node=1, cpus_per_task=4, mem="16G", exclusive=True)
    assert (l.cpus_per_task, l.mem, l.exclusive) == (4, "16G", True)
    assert "#SBATCH --exclusive\n" in launch.render(l)
    with pytest.raises(ShipyardError, match="--cpus-per-task 33: partition shared of cluster site has 32 CPUs"):
        _build(reg, partition="shared", cpus_per_task=33)
    with pytest.raises(ShipyardError, match="--mem 300G: partition shared of cluster site has 262144M per node"):
        _build(reg, partition="shared", mem="300G")
    with pytest.raises(ShipyardError, match="--mem '12 GB': expected a Slurm memory size"):
        _build(reg, mem="12 GB")
    with pytest.raises(ShipyardError, match=r"--gpus-per-node 2: partition interactive of cluster site has 1 GPUs per "
                       r"node \(clusters.site.scheduler.partitions.interactive.gpus_per_node\)"):
        _build(reg, partition="interactive", gpus_per_node=2)


def test_time_is_capped_at_the_partitions_maximum(reg):
    assert _build(reg, partition="shared").time == "02:00:00"  # scheduler.time 08:00:00 is more than allowed
    assert _build(reg, partition="big").time == "08:00:00"
    with pytest.raises(ShipyardError, match="--time 1-00:00:00: partition shared .* at most 02:00:00 "
                                            r"\(clusters.site.scheduler.partitions.shared.max_time\)"):
        _build(reg, partition="shared", time="1-00:00:00")


def test_fabric_of_the_partition_decides_the_nccl_preset(reg):
    ib = _build(reg, partition="big")
    sock = _build(reg, partition="interactive")
    assert ib.fabric == "ib" and sock.fabric == "socket"
    assert "NCCL_IB_DISABLE" in {v.name for v in sock.env} and "NCCL_IB_DISABLE" not in {v.name for v in ib.env}


# ------------------------------------------------------------------------------------------------ paths


def test_job_runs_where_invoke_launch_ran(reg):
    sub = reg.root / "exp"
    sub.mkdir()
    (sub / "run.py").write_text("")
    l = _build(reg, command=("run.py",), workdir=sub)
    text = launch.render(l)
    assert f"#SBATCH --chdir={sub}\n" in text and f"--pwd {sub} " in text
    # the same script named from the project root is where the job (running in exp/) will not find it
    with pytest.raises(ShipyardError, match=f"run.py: no such file at {reg.root / 'run.py'}"):
        _build(reg, command=("run.py",))


def test_container_sees_the_workdir_through_a_mount(reg, tmp_path):
    data = tmp_path.parent / (tmp_path.name + "-data")
    data.mkdir()
    (data / "t.py").write_text("")
    l = _build(reg, command=("t.py",), workdir=data, mounts=f"{data}:/data")
    assert (l.workdir, l.container_workdir) == (str(data), "/data")
    assert "--pwd /data " in launch.render(l)
    with pytest.raises(ShipyardError, match="the container cannot see this directory"):
        _build(reg, command=("t.py",), workdir=data)
    # torchrun -m MODULE and scripts inside the image are not files shipyard can check from here
    _build(reg, command=("-m", "pkg.train"))
    _build(reg, command=("/opt/in-image.py",))


def test_launchers_for_two_clusters_do_not_overwrite_each_other(reg):
    a = launch.write(_build(reg, cluster="site"))
    b = launch.write(_build(reg, cluster="plain"))
    assert (a.name, b.name) == ("train-site.sbatch", "train-plain.sbatch")
    with pytest.raises(ShipyardError, match=f"{a}: already a launcher for cluster site; pick another --name"):
        launch.write(_build(reg, cluster="plain", name="train-site"))
    assert "cluster site," in Path(a).read_text()


@pytest.mark.parametrize("old,new,msg", [
    ("mem_per_node: 256G", "mem_per_node: \"0\"",
     "clusters.site.scheduler.partitions.shared.mem_per_node: '0': less than 1M"),
    ("mem_per_node: 512G", "mem_per_node: 0M", "clusters.site.mem_per_node: '0M': less than 1M"),
    ('max_time: "02:00:00"', 'max_time: "0"',
     "clusters.site.scheduler.partitions.shared.max_time: '0' is no time limit to Slurm"),
])
def test_zero_memory_and_zero_time_limits_are_refused_at_load(old, new, msg):
    """mem_per_node 0 would become `--mem=0` (all of the node's memory) and max_time "0" no limit (both
    failed on e0c4781)."""
    with pytest.raises(ShipyardError, match=msg.replace(".", r"\.").replace("(", r"\(")):
        registry.load_text(REG.replace(old, new))


def test_a_memory_share_that_rounds_to_zero_is_refused_not_mem_0(tmp_path):
    (tmp_path / "registry.yaml").write_text(REG.replace("mem_per_node: 256G", "mem_per_node: 3M"))
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ShipyardError, match="3M per node .* leaves less than 1M for 1 of 4 GPUs"):
        _build(registry.load(tmp_path / "registry.yaml"), partition="shared", gpus_per_node=1)
    with pytest.raises(ShipyardError, match="--mem '0': less than 1M"):
        _build(registry.load(tmp_path / "registry.yaml"), partition="shared", gpus_per_node=1, mem="0")
