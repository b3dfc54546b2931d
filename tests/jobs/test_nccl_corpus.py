"""Both NCCL log readers against the real corpus (tests/data/nccl/real/, sources and hand readings in corpus.yaml):
nccl-report's table parser, and the transport rules in Python and as the launcher's awk program (run under mawk,
gawk and busybox awk). Real logs, not ones we wrote, decide whether a reading is right."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from fixtures_launch import AWKS
from helpers_registry import ROOT

from shipyard import nccl_transport as nt
from shipyard.jobs import nccl_report as nr

REAL = ROOT / "tests" / "data" / "nccl" / "real"
CORPUS = yaml.safe_load((REAL / "corpus.yaml").read_text())
OURS = sorted((ROOT / "tests" / "data" / "nccl").glob("*.log"))


def test_corpus_is_complete_and_each_log_has_a_source():
    logs = {p.name for p in REAL.glob("*.log")}
    assert logs == set(CORPUS) and len(logs) >= 12
    for name, entry in CORPUS.items():
        assert entry["source"] and entry["reading"] and "expect" in entry, name
    kinds = " ".join(e["what"] + e["reading"] for e in CORPUS.values())
    for needed in ("IB", "AWS Libfabric", "Socket", "old layout", "cut off", "prefixes", "FAILED", "broken"):
        assert needed in kinds, needed


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_report_parser_reads_the_real_log(name):
    exp = CORPUS[name]["expect"]
    report = nr.parse_file(REAL / name)
    rows = [r for run in report.runs for r in run.rows]
    assert len(rows) == exp["rows"]
    assert len(report.runs) == (1 if exp["rows"] else 0)  # each sample is one test, never split in two
    if exp["rows"]:
        (run,) = report.runs
        assert (rows[0].size, rows[-1].size) == (exp["first"], exp["last"])
        assert run.peak.busbw == pytest.approx(exp["peak"]) and run.peak.size == exp["peak_size"]
        assert sum(r.wrong for r in rows) == exp["wrong"]
        assert run.avg_busbw == (pytest.approx(exp["avg"]) if "avg" in exp else None)
        assert run.out_of_bounds == exp.get("oob")
    if "ranks" in exp:
        assert len(report.ranks) == exp["ranks"]
    assert list(report.networks) == exp["transport"]
    assert list(report.transport.providers) == exp.get("providers", [])
    assert bool(report.broken) == exp.get("broken", False)
    assert bool(report.failures) == exp.get("failures", False)
    fails = [f for f in nr.findings(report, None) if f.startswith("FAIL")]
    assert bool(fails) == (exp.get("fail", False) or exp.get("broken", False) or exp.get("failures", False))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_transport_verdicts_match_the_hand_reading(name):
    t = nt.read((REAL / name).read_text().splitlines())
    for fabric, status in CORPUS[name]["expect"].get("verdict", {}).items():
        assert nt.verdict(t, fabric)[0] == status, fabric


@pytest.mark.parametrize("log", sorted(REAL.glob("*.log")) + OURS, ids=lambda p: p.name)
def test_launcher_awk_says_what_python_says(log):
    """The end-of-job line the launcher prints equals nccl-report's verdict, for every fabric and every awk in AWKS."""
    text = log.read_text()
    t = nt.read(text.splitlines())
    for fabric in ("efa", "ib", "socket"):
        want = nt.verdict(t, fabric)[1]
        for awk in AWKS:
            res = subprocess.run(awk + [nt.awk_program(fabric)], input=text, capture_output=True, text=True,
                                 timeout=30)
            assert (res.returncode, res.stderr, res.stdout) == (0, "", want + "\n"), (awk, fabric)


def test_above_line_rate_is_never_a_percentage_over_100(tmp_path):
    """p5: 487 GB/s busbw against 400 GB/s per node (3200 Gbit/s) is explained, not reported as 122%."""
    from shipyard import registry

    report = nr.parse_file(REAL / "awsome_p5_2node_srun_label.log")
    report.ranks = {0: ("p5-a", "H100"), 8: ("p5-b", "H100")}  # two nodes, as the README says
    cluster = registry.load(ROOT / "registry.yaml").cluster("aws-pcluster")
    note = nr.line_rate_note(report, report.runs[0], cluster)
    assert "400.00 GB/s per direction" in note and "no percentage of line rate applies" in note and "%" not in note
    p4 = nr.parse_file(REAL / "awsome_p4de_2node_srun_label.log")
    p4.ranks = report.ranks
    note = nr.line_rate_note(p4, p4.runs[0], cluster)
    assert "peak busbw is 20% of it" in note  # 78.33 of 400 GB/s


def test_g_format_wrong_counts_and_extra_columns_and_pdsh_prefix():
    """#wrong as nccl-tests prints it (%6g: 1048576 -> 1.04858e+06), a trailing timestamp column after a header, and
    a pdsh "host: " prefix: formats taken from NVIDIA/nccl-tests src/util.cu (no real sample with wrong counts found)."""
    head = ("node7: #       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
            "algbw   busbw #wrong\n")
    rows = ("node7:      4194304       1048576     float     sum      -1    812.3    5.16    9.68  1.04858e+06    "
            "808.2    5.19    9.73      0  2026-01-02 03:04:05\n"
            "node7:      8388608       2097152     float     sum      -1   1612.3    5.20    9.75      0   1608.2    "
            "5.22    9.78      0  2026-01-02 03:04:06\n")
    report = nr.parse_text(head + rows)
    (run,) = report.runs
    assert [r.size for r in run.rows] == [4194304, 8388608]
    assert run.rows[0].wrong == 1048580  # %g keeps 6 significant digits
    assert any(f.startswith("FAIL wrong results at 4 MiB") for f in nr.findings(report, None))


def test_interleaved_copies_are_a_broken_launch_not_several_tests():
    text = (REAL / "awsome_p5en_ellipsis.log").read_text()
    lines = text.splitlines()
    rows = [ln for ln in lines if ln.strip() and ln.strip()[0].isdigit()]
    interleaved = "\n".join(lines[:2] + [r for r in rows for _ in (0, 1)]) + "\n"
    report = nr.parse_text(interleaved)
    assert len(report.runs) == 1 and len(report.runs[0].rows) == len(rows)
    assert report.broken and any(f.startswith("FAIL broken launch") for f in nr.findings(report, None))


def test_no_rows_still_gives_transport_and_verdict_and_exits_nonzero(invoke, tmp_path):
    proc = invoke("nccl-report", str(REAL / "nccl_352_no_device_socket.log"), "--cluster", "grete",
                  "--out", str(tmp_path / "x.png"), cwd=ROOT)
    assert proc.returncode == 2
    assert "network: Socket" in proc.stdout
    assert "transport verdict: WARNING: NCCL transport selected: Socket, expected IB on fabric ib" in proc.stdout
    assert "no nccl-tests result rows found" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()
