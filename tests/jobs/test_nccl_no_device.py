"""nccl-report on ranks without a GPU (the sandbox's fake GPUs, a login node): "no CUDA device", not a missing NCCL
debug setting. The sample is real: all_reduce_perf 2.19.6 compiled here (tests/containers/test_nccl_tests.py) and run
on this GPU-less machine (tests/data/nccl/real/corpus.yaml has its source)."""

from __future__ import annotations

from pathlib import Path

from shipyard import registry
from shipyard.jobs import nccl_report as nr

REAL = Path(__file__).resolve().parents[1] / "data" / "nccl" / "real"
SAMPLE = REAL / "shipyard_no_cuda_device_2.19.6.log"
CLUSTER = registry.load_text("""
environments:
  e: {torch: "2.14.1", cuda: "13.0", python: "3.11", os: debian12}
clusters:
  c: {runtime: host, fabric: socket, gpus_per_node: 2, scheduler: {partition: p}}
""").cluster("c")


def _two_ranks() -> str:
    """The sample as a 2-node MPI job under srun --label prints it (made from the real sample, not recorded): rank 0
    prints the header, every rank its own failure lines behind its rank number."""
    lines = SAMPLE.read_text().splitlines()
    head, fail = lines[:5], lines[5:7]
    return "\n".join([f"0: {h}" for h in head] + [f"{rank}: {f.replace('da64fd6c913c', f'node{rank + 1}')}"
                                                   for rank in (0, 1) for f in fail]) + "\n"


def test_the_real_sample_is_reported_as_no_cuda_device_and_not_as_a_debug_setting():
    notes = nr.findings(nr.parse_file(SAMPLE), CLUSTER)
    assert notes[0].startswith("FAIL no CUDA device: 1 rank(s) stopped at their first CUDA call, before NCCL started "
                               "(Test CUDA failure util.cu:674 'CUDA driver version is insufficient")
    assert not any("NCCL_DEBUG" in n for n in notes), notes


def test_every_rank_of_a_two_node_job_is_counted(tmp_path):
    log = tmp_path / "nccl-test-sandbox-1.out"
    log.write_text(_two_ranks())
    report = nr.parse_file(log)
    assert nr.findings(report, CLUSTER)[0].startswith("FAIL no CUDA device: 2 rank(s)")
    try:
        nr.write_report(str(log), str(tmp_path / "x.png"), CLUSTER)
    except nr.NoRows as e:  # no rows: exit 2, with what can still be said
        assert "FAIL no CUDA device: 2 rank(s)" in e.text and "NCCL_DEBUG" not in e.text
    else:
        raise AssertionError("a log without rows must raise NoRows")


def test_a_per_node_job_where_no_node_has_a_gpu(tmp_path):
    """shipyard's mpi: none launcher on 2 nodes: its first line, then each task's whole output (the real sample's,
    host renamed) under srun --label: two tests that never started, counted per rank, no broken launch."""
    lines = SAMPLE.read_text().splitlines()[:7]
    text = "\n".join([nr.per_node_line() + ": 2 node(s), one nccl-tests process each"]
                     + [f"{task}: {line.replace('da64fd6c913c', f'node{task + 1}')}" for task in (0, 1)
                        for line in lines]) + "\n"
    report = nr.parse_text(text)
    assert report.per_node == 2 and report.broken == [] and report.runs == []
    notes = nr.findings(report, CLUSTER)
    assert notes[0].startswith("FAIL no CUDA device: 2 rank(s)") and len(notes) == 3  # and both failure lines
    assert not any("NCCL_DEBUG" in n or "broken" in n for n in notes), notes


def test_nccl_report_partition_must_be_the_clusters(tmp_path, monkeypatch):
    import io

    import pytest

    from shipyard.commands import jobs as jobs_commands
    from shipyard.commands.context import Context
    from shipyard.errors import ShipyardError

    (tmp_path / "registry.yaml").write_text("""
environments:
  e: {torch: "2.14.1", cuda: "13.0", python: "3.11", os: debian12}
clusters:
  c: {runtime: host, fabric: socket, gpus_per_node: 2, scheduler: {partition: p}}
""")
    monkeypatch.chdir(tmp_path)
    ctx = Context.load(str(tmp_path / "registry.yaml"), out=io.StringIO())
    with pytest.raises(ShipyardError, match=r"^--partition 'q': not a partition of cluster c \(valid: p\)$"):
        jobs_commands.nccl_report(str(SAMPLE), str(tmp_path / "x.png"), "c", ctx, partition="q")
