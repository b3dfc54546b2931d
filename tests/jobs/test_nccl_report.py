"""nccl-report: parsing nccl-tests logs (with interleaved rank output), the text report, the plot, bad input."""

from __future__ import annotations

import os

import pytest
from helpers_registry import GOLDEN, ROOT, golden

from shipyard import registry
from shipyard.jobs import nccl_report as nr

LOGS = ROOT / "tests" / "data" / "nccl"
REG = registry.load(ROOT / "registry.yaml")


@pytest.mark.parametrize(
    "log,cluster",
    [
        ("all_reduce_efa_2x8", "aws-pcluster"),
        ("all_reduce_ib_2x4_label", "grete"),
        ("all_reduce_socket_wrong", "grete"),
        ("all_reduce_socket_wrong", "sandbox"),
    ],
)
def test_report_golden(log, cluster):
    report = nr.parse_file(LOGS / f"{log}.log")
    report.path = f"{log}.log"  # golden text must not depend on where the checkout lives
    golden(GOLDEN / "nccl_report" / f"{log}.{cluster}.txt", nr.render_table(report, REG.cluster(cluster)))


def test_efa_log_rows_and_interleaving():
    report = nr.parse_file(LOGS / "all_reduce_efa_2x8.log")
    (run,) = report.runs
    sizes = [r.size for r in run.rows]
    # 8 B .. 16 GiB by factor 2: 32 rows, including the row glued behind another rank's NCCL INFO line (1 KiB).
    assert sizes == [8 * 2**i for i in range(32)]
    glued = run.rows[7]
    assert (glued.size, glued.count, glued.dtype, glued.redop, glued.root) == (1024, 256, "float", "sum", -1)
    assert glued.out_of_place.time_us == pytest.approx(75.97)
    assert run.rows[-1].out_of_place.busbw == pytest.approx(336.23)
    assert run.rows[-1].in_place.busbw == pytest.approx(325.99)
    assert run.avg_busbw == pytest.approx(111.9161)
    assert run.out_of_bounds == "0 OK"
    assert run.header == {"nThread": 1, "nGpus": 1, "minBytes": 8, "maxBytes": 17179869184}
    assert len(report.ranks) == 16 and report.ranks[9] == ("p5-dy-gpu-2", "NVIDIA H100 80GB HBM3")
    assert report.networks == ["Libfabric"]


def test_label_prefixes_and_comment_lines_are_tolerated():
    report = nr.parse_file(LOGS / "all_reduce_ib_2x4_label.log")
    (run,) = report.runs
    assert [r.size for r in run.rows] == [128 * 2**20 * 2**i for i in range(6)]
    assert report.networks == ["IB"]
    assert len(report.ranks) == 8


@pytest.mark.parametrize("prefix", ["[0]", "[0]:", "[1,0]<stdout>:", "0:"])
def test_rank_prefixes_inside_a_row(prefix):
    """A launcher that forwards a rank's output in chunks writes its prefix before each chunk, so a row that reached
    it in two chunks carries the prefix in the middle. No public log with it is known: the rows here are those of a
    real one (awsome_p5_2node_srun_label.log) with the prefix put where a chunk boundary falls, standalone, glued to
    the next column and glued to the previous one (nccl-tests prints a row in three printf calls: the parameters,
    then the out-of-place and in-place results; src/common.cu). srun's "0: " always ends in a space, and glued to a
    number ("-10:") it could not be told apart, so it is only tried standalone."""
    real = (LOGS / "real" / "awsome_p5_2node_srun_label.log").read_text()
    want = nr.parse_text(real)
    lines = []
    for i, line in enumerate(real.splitlines()):
        row = nr.parse_row(line)
        if row is None:
            lines.append(line)
            continue
        words = line.split()[1:]  # without srun's "0:"
        at = 5 if i % 2 else 9  # after the parameters, or after the out-of-place results
        glue = i % 3 if prefix != "0:" else 0  # srun writes "N: " with its space: never glued
        if glue == 0:
            words.insert(at, prefix)
        elif glue == 1:
            words[at] = prefix + words[at]
        else:
            words[at - 1] = words[at - 1] + prefix
        lines.append(f"{prefix} " + "   ".join(words))
    got = nr.parse_text("\n".join(lines))
    assert [r.size for r in got.runs[0].rows] == [r.size for r in want.runs[0].rows]
    assert [(r.out_of_place, r.in_place) for r in got.runs[0].rows] == \
        [(r.out_of_place, r.in_place) for r in want.runs[0].rows]
    assert got.broken == []


def test_a_rank_prefix_never_turns_a_non_row_into_a_row():
    assert nr.parse_row("[0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0") is None
    assert nr.parse_row("[0]  8  2  float  sum  -1  [0]  69.12  0.00") is None  # cut short


def test_wrong_results_and_socket_fallback_are_failures():
    report = nr.parse_file(LOGS / "all_reduce_socket_wrong.log")
    notes = nr.findings(report, REG.cluster("grete"))
    assert any(n.startswith("FAIL wrong results at 64 KiB") for n in notes)
    assert any("NCCL transport selected: Socket, expected IB on fabric ib (cluster 'grete')" in n for n in notes)
    # On the socket-fabric sandbox sockets are expected; the wrong results are still a failure.
    notes = nr.findings(report, REG.cluster("sandbox"))
    assert not any("sockets" in n for n in notes)
    assert any(n.startswith("FAIL wrong results") for n in notes)


def test_two_tests_in_one_log_are_two_runs():
    text = (LOGS / "all_reduce_ib_2x4_label.log").read_text()
    report = nr.parse_text(text + text.replace("float     sum", " half     max"))
    assert len(report.runs) == 2
    assert {r.dtype for r in report.runs[1].rows} == {"half"}
    assert "test 2" in nr.render_table(report)


def test_validation_off_reads_na():
    line = "     1048576        262144     float     sum      -1    51.20   20.48   38.40    N/A    50.10   20.93   39.24    N/A"
    report = nr.parse_text(line + "\n")
    row = report.runs[0].rows[0]
    assert row.out_of_place.wrong == "N/A" and row.wrong == 0
    assert row.busbw == pytest.approx(39.24)


def test_comment_and_log_lines_never_parse_as_rows():
    text = "\n".join([
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
        "n1:12:12 [0] NCCL INFO Channel 00/02 :    0   1",
        "n1:12:12 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer",
    ])
    report = nr.parse_text(text, "x.log")
    assert report.runs == [] and "no nccl-tests result rows" in nr.no_rows_message(report)


def test_plot_draws_busbw_on_log2_axis_and_line_rate():
    report = nr.parse_file(LOGS / "all_reduce_efa_2x8.log")
    fig = nr.plot(report, REG.cluster("aws-pcluster"))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert ax.xaxis.get_transform().base == 2
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    oop = lines["out-of-place busbw"]
    assert list(oop.get_xdata()) == [r.size for r in report.runs[0].rows]
    assert list(oop.get_ydata()) == [r.out_of_place.busbw for r in report.runs[0].rows]
    rate = [ln for label, ln in lines.items() if label.startswith("nominal line rate 3200 Gbit/s")]
    assert rate and list(rate[0].get_ydata()) == [400.0, 400.0]  # 3200 Gbit/s = 400 GB/s


def test_plot_without_line_rate():
    report = nr.parse_file(LOGS / "all_reduce_socket_wrong.log")
    ax = nr.plot(report, REG.cluster("sandbox")).axes[0]
    assert not [ln for ln in ax.get_lines() if ln.get_label().startswith("nominal")]


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_task_writes_png_and_prints_table(tmp_path, invoke):
    out = tmp_path / "bw.png"
    proc = invoke("nccl-report", str(LOGS / "all_reduce_ib_2x4_label.log"), "--cluster", "grete", "--out", str(out),
                  cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "peak bus bandwidth: 23.86 GB/s at 4 GiB" in proc.stdout
    assert f"plot: {out}" in proc.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    "args,message",
    [
        (["missing.log"], "missing.log: no such nccl-tests log"),
        ([str(LOGS / "all_reduce_failed.log")], "no nccl-tests result rows found"),
        ([str(LOGS)], "is a directory"),
        ([str(LOGS / "all_reduce_ib_2x4_label.log"), "--out", "x.svg"], "--out x.svg: the plot is written as PNG"),
        ([str(LOGS / "all_reduce_ib_2x4_label.log"), "--cluster", "nope"], "nope"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message, tmp_path, invoke):
    proc = invoke("nccl-report", *args, cwd=ROOT)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_failed_log_error_quotes_the_failure():
    report = nr.parse_file(LOGS / "all_reduce_failed.log")
    assert "Test NCCL failure common.cu:1005" in nr.no_rows_message(report)
    with pytest.raises(nr.NoRows, match="Test NCCL failure common.cu:1005"):
        nr.write_report(str(LOGS / "all_reduce_failed.log"), cluster=REG.cluster("sandbox"))


@pytest.mark.parametrize("n,text", [(8, "8 B"), (1024, "1 KiB"), (1536, "1536 B"), (2**34, "16 GiB"), (2**41, "2 TiB")])
def test_human_bytes(n, text):
    assert nr.human_bytes(n) == text


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_task_outside_a_project_needs_no_registry(tmp_path, invoke):
    proc = invoke("nccl-report", str(LOGS / "all_reduce_efa_2x8.log"), "--out", str(tmp_path / "p.png"),
                  cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"})
    assert proc.returncode == 0, proc.stderr
    assert "nominal line rate" not in proc.stdout and (tmp_path / "p.png").exists()


def test_peak_far_below_the_line_rate_is_warned():
    """Held against nccl.yaml's line_rate.far_below share of the partition's rate: the 2-node EFA run (336 GB/s
    peak) is fine at 3200 Gbit/s and flagged at twice that; one node's run never is (it measures NVLink/PCIe)."""
    from dataclasses import replace

    from shipyard import facts

    report = nr.parse_file(LOGS / "all_reduce_efa_2x8.log")
    share = facts.load("nccl")["line_rate"]["far_below"]
    efa = REG.cluster("aws-pcluster").on()
    at = lambda gbps: replace(efa, fabric_options={**efa.fabric_options, "line_rate_gbps": gbps})  # noqa: E731
    peak = report.runs[0].peak.busbw
    ok_rate = peak * 8 / share * 0.99  # just inside the share
    assert not [f for f in nr.findings(report, at(ok_rate)) if "line rate" in f]
    (warn,) = [f for f in nr.findings(report, at(peak * 8 / share * 1.01)) if "line rate" in f]
    assert warn.startswith(f"WARN peak busbw {peak:.2f} GB/s is ") and "below 50%" in warn
    one_node = replace(report, ranks={k: ("node1", m) for k, (h, m) in report.ranks.items()})
    assert not [f for f in nr.findings(one_node, at(peak * 80)) if "line rate" in f]


# --------------------------------------------------------------------------------------- per-node tests (mpi: none)

REAL = LOGS / "real"


def _node_output(sample: str, host: str) -> list[str]:
    """One node's whole nccl-tests output as all_reduce_perf prints it for one process driving 8 GPUs (-g 8): the
    header and rank lines in its format, then the table of a real sample (its rows as recorded, srun label removed)
    and the summary. Made from the real sample, not recorded."""
    rows = [line.split(": ", 1)[1] for line in (REAL / sample).read_text().splitlines() if line.startswith("0: ")]
    return (["# nThread 1 nGpus 8 minBytes 8 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
            + [f"#  Rank {g:2d} Group  0 Pid   4242 on {host:>10} device {g:2d} [0x{0x53 + g:02x}] NVIDIA H100 80GB HBM3"
               for g in range(8)]
            + ["#"] + rows + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 101.5", "#"])


def per_node_log(marker: bool = True) -> str:
    """A shipyard mpi: none job on 2 nodes: the job's first line, then both tasks' outputs under srun --label,
    interleaved line by line as srun forwards them (task 0 the P5 sample's table, task 1 the P4de one's)."""
    a = _node_output("awsome_p5_2node_srun_label.log", "p5-a")
    b = _node_output("awsome_p4de_2node_srun_label.log", "p5-b")
    lines = [nr.per_node_line() + ": 2 node(s), one nccl-tests process each"] if marker else []
    for i in range(max(len(a), len(b))):
        lines += [f"{task}: {out[i]}" for task, out in ((0, a), (1, b)) if i < len(out)]
    return "\n".join(lines) + "\n"


def test_a_per_node_job_is_read_as_one_test_per_node():
    report = nr.parse_text(per_node_log(), "per-node.log")
    assert report.per_node == 2 and report.broken == [] and report.failures == []
    assert [r.node for r in report.runs] == ["task 0 (p5-a)", "task 1 (p5-b)"]
    # read by hand from the samples: the P5 table's last row (16G, in-place 487.26), the P4de table's (2G, 78.33)
    assert (report.runs[0].peak.size, report.runs[0].peak.busbw) == (17179869184, 487.26)
    assert (report.runs[1].peak.size, report.runs[1].peak.busbw) == (2147483648, 78.33)
    assert [r.avg_busbw for r in report.runs] == [101.5, 101.5]
    # each node's rows are exactly those of its sample read alone
    for run, sample in zip(report.runs, ("awsome_p5_2node_srun_label.log", "awsome_p4de_2node_srun_label.log")):
        assert run.rows == nr.parse_file(REAL / sample).runs[0].rows
    assert len(report.ranks) == 16


def test_the_same_output_without_the_jobs_line_is_a_broken_launch():
    """Other launchers' logs are read as before: copies of one test in one log are a broken launch."""
    report = nr.parse_text(per_node_log(marker=False))
    assert report.per_node == 0 and report.broken


def test_the_per_node_report_says_what_was_measured():
    report = nr.parse_text(per_node_log(), "per-node.log")
    text = nr.render_table(report, REG.cluster("sandbox"))
    assert "per node (mpi: none): 2 test(s), one per node" in text
    assert "transport verdict: none needed: each test ran within one node" in text
    assert "FAIL" not in text and "WARN" not in text and text.rstrip().endswith("PASS no wrong results on any node")
    golden(GOLDEN / "nccl_report" / "per_node_2x8.sandbox.txt", text)


def test_a_wrong_result_on_one_node_names_that_node():
    text = per_node_log().replace("1:            8             2     float     sum      -1    164.3    0.00    0.00      0",
                                  "1:            8             2     float     sum      -1    164.3    0.00    0.00      3")
    report = nr.parse_text(text)
    assert any(f.startswith("FAIL task 1 (p5-b): wrong results at 8 B") for f in nr.findings(report, None))
