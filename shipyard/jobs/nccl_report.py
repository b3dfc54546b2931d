"""`invoke nccl-report LOG`: nccl-tests output -> a table and a bus-bandwidth plot.

Why a parser of its own: nccl-tests prints a fixed-column text table and nothing machine-readable, and the logs users
have are srun outputs in which other ranks' ``NCCL INFO`` lines, ``srun --label`` prefixes and ``#`` comments are
interleaved with the table. A row is therefore recognised by its shape *at the end of a line* (its last 13 words:
size, count, type, redop, root, then time/algbw/busbw/#wrong twice), so that a row glued to another rank's output is
still read, while comment and log lines never match.

Bus bandwidth (busbw), not algbw, is what compares with the fabric: nccl-tests scales it by the collective's traffic
factor, so it can be held against the cluster's nominal line rate (``fabric_options.line_rate_gbps``).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from shipyard import registry
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, table
from shipyard.registry.model import Cluster

_NUM = r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|nan|inf|N/A)"
_WRONG = r"(\d+|N/A)"
# The last 13 whitespace-separated words of a line, joined by single spaces (see _row()).
_ROW = re.compile(
    r"(\d+) (\d+) ([A-Za-z][A-Za-z0-9_]*) ([A-Za-z][A-Za-z0-9_]*) (-?\d+)"
    + (" " + _NUM + " " + _NUM + " " + _NUM + " " + _WRONG) * 2
)
_ROW_WORDS = 13
_RANK = re.compile(
    r"#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.*?)\s*$"
)
_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(.*?)\s*$")
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_NET_FALLBACK = re.compile(r"NCCL INFO NET/(IB|Socket|OFI|AWS Libfabric)\b")
_FAILURE = re.compile(r"(Test NCCL failure.*?|Test CUDA failure.*?)\s*$")

# Transports that mean the job did not use the cluster's fabric (launcher-rules.md rule 9).
_SOCKET = "socket"


@dataclass(frozen=True)
class Measure:
    """One half of a row: out-of-place or in-place."""

    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: str  # count of wrong elements, or "N/A" when validation was off (-c 0)


@dataclass(frozen=True)
class Row:
    size: int  # bytes
    count: int  # elements
    dtype: str
    redop: str
    root: int
    out_of_place: Measure
    in_place: Measure

    @property
    def wrong(self) -> int:
        return sum(int(m.wrong) for m in (self.out_of_place, self.in_place) if m.wrong.isdigit())

    @property
    def busbw(self) -> float:
        """The better of the two halves: what the fabric reached at this size."""
        return max(self.out_of_place.busbw, self.in_place.busbw)


@dataclass
class Run:
    """One test table. A log may hold several (e.g. a job that ran all_reduce_perf then all_gather_perf)."""

    rows: list[Row] = field(default_factory=list)
    avg_busbw: float | None = None  # the "# Avg bus bandwidth" line, as printed
    out_of_bounds: str | None = None  # e.g. "0 OK" or "3 FAILED"
    header: dict[str, int] = field(default_factory=dict)  # nThread, nGpus, minBytes, maxBytes

    @property
    def peak(self) -> Row:
        return max(self.rows, key=lambda r: r.busbw)


@dataclass
class Report:
    path: str
    runs: list[Run]
    ranks: dict[int, tuple[str, str]]  # rank -> (host, GPU model)
    networks: list[str]  # what NCCL said it uses ("Using network IB"), in order of first appearance
    failures: list[str]


def _f(text: str) -> float:
    return float("nan") if text == "N/A" else float(text)


def _row(line: str) -> re.Match | None:
    """A result row is the last 13 words of a line, whatever precedes them (a label, another rank's output).

    Matching only those words (instead of searching the whole line) keeps the cost per line flat."""
    words = line.split()
    if len(words) < _ROW_WORDS or not (words[-1].isdigit() or words[-1] == "N/A"):
        return None
    return _ROW.fullmatch(" ".join(words[-_ROW_WORDS:]))


def parse_text(text: str, path: str = "<log>") -> Report:
    """Parse nccl-tests output (any *_perf binary). Raises ShipyardError when no result row is found."""
    runs: list[Run] = [Run()]
    ranks: dict[int, tuple[str, str]] = {}
    networks: list[str] = []
    fallback: list[str] = []  # NET/<plugin> lines: used only when no "Using network" line says it directly
    failures: list[str] = []
    for line in text.splitlines():
        m = _row(line)
        if m:
            g = m.groups()
            row = Row(int(g[0]), int(g[1]), g[2], g[3], int(g[4]),
                      Measure(_f(g[5]), _f(g[6]), _f(g[7]), g[8]), Measure(_f(g[9]), _f(g[10]), _f(g[11]), g[12]))
            cur = runs[-1]
            if cur.rows and row.size <= cur.rows[-1].size:
                runs.append(Run())  # sizes only grow within one scan: a smaller one starts the next test
            runs[-1].rows.append(row)
            continue
        if m := _HEADER.search(line):
            if runs[-1].rows:
                runs.append(Run())
            runs[-1].header = dict(zip(("nThread", "nGpus", "minBytes", "maxBytes"), map(int, m.groups())))
        elif m := _RANK.search(line):
            ranks[int(m[1])] = (m[2], m[4])
        elif m := _AVG.search(line):
            try:
                runs[-1].avg_busbw = float(m[1])
            except ValueError:
                pass
        elif m := _OOB.search(line):
            runs[-1].out_of_bounds = m[1]
        elif m := _NETWORK.search(line):
            if m[1] not in networks:
                networks.append(m[1])
        elif m := _NET_FALLBACK.search(line):
            if m[1] not in fallback:
                fallback.append(m[1])
        elif m := _FAILURE.search(line):
            failures.append(m[1])
    runs = [r for r in runs if r.rows]
    if not runs:
        why = f"; the log says: {failures[0]}" if failures else ""
        raise ShipyardError(f"{path}: no nccl-tests result rows found (expected rows of size, count, type, redop, "
                            f"root, then time, algbw, busbw, #wrong for out-of-place and in-place){why}")
    return Report(path, runs, ranks, networks or fallback, failures)


def parse_file(path: str | Path) -> Report:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ShipyardError(f"{p}: no such nccl-tests log (give the job's output file, e.g. launch/logs/NAME-JOBID.out)") from None
    except IsADirectoryError:
        raise ShipyardError(f"{p}: is a directory; give the nccl-tests output file") from None
    except OSError as exc:
        raise ShipyardError(f"{p}: cannot read: {exc.strerror}") from None
    return parse_text(text, str(p))


def human_bytes(n: int) -> str:
    """8 -> '8 B', 1048576 -> '1 MiB'; exact (a size that is not a multiple of 1024 stays in the smaller unit)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or n % 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def line_rate_gbs(cluster: Cluster | None) -> float | None:
    """The cluster's nominal line rate in GB/s (the profile gives Gbit/s), or None when the profile has none."""
    if cluster is None or cluster.line_rate_gbps is None:
        return None
    return cluster.line_rate_gbps / 8.0


def findings(report: Report, cluster: Cluster | None) -> list[str]:
    """What a user must look at: wrong results, a socket fallback on a fast fabric, a missing transport line."""
    out = []
    for i, run in enumerate(report.runs, 1):
        tag = f"test {i}: " if len(report.runs) > 1 else ""
        bad = [r for r in run.rows if r.wrong]
        if bad:
            out.append(f"FAIL {tag}wrong results at {', '.join(human_bytes(r.size) for r in bad)} "
                       "(the #wrong column): the data path corrupts data; rerun with NCCL_DEBUG=INFO")
        if run.out_of_bounds and not run.out_of_bounds.endswith("OK"):
            out.append(f"FAIL {tag}out of bounds values: {run.out_of_bounds}")
    for f in report.failures:
        out.append(f"FAIL the log reports: {f}")
    nets = [n.lower() for n in report.networks]
    if cluster is not None and cluster.fabric in ("ib", "efa") and any(_SOCKET in n for n in nets):
        out.append(f"FAIL NCCL used sockets on cluster '{cluster.name}' (fabric {cluster.fabric}): the "
                   "InfiniBand/EFA plugin did not load (missing libibverbs or aws-ofi-nccl in the image?)")
    if not report.networks:
        out.append("WARN no 'NCCL INFO Using network' line: rerun with NCCL_DEBUG=INFO to see which transport was used")
    return out


def render_table(report: Report, cluster: Cluster | None = None) -> str:
    """The text report: who ran, which transport, one table row per message size, peak and average, findings."""
    out = [f"nccl-tests report: {report.path}"]
    if report.ranks:
        hosts = sorted({h for h, _ in report.ranks.values()})
        models = sorted({m for _, m in report.ranks.values()})
        out.append(f"ranks: {len(report.ranks)} on {len(hosts)} node(s) ({', '.join(hosts)}); GPU: {', '.join(models)}")
    out.append(f"network: {', '.join(report.networks) if report.networks else 'not in the log'}")
    rate = line_rate_gbs(cluster)
    for i, run in enumerate(report.runs, 1):
        out.append("")
        if len(report.runs) > 1:
            out.append(f"test {i}")
        headers = ["size", "count", "type", "redop", "root", "oop time(us)", "oop algbw", "oop busbw",
                   "ip time(us)", "ip algbw", "ip busbw", "#wrong"]
        rows = [[human_bytes(r.size), r.count, r.dtype, r.redop, r.root,
                 f"{r.out_of_place.time_us:.2f}", f"{r.out_of_place.algbw:.2f}", f"{r.out_of_place.busbw:.2f}",
                 f"{r.in_place.time_us:.2f}", f"{r.in_place.algbw:.2f}", f"{r.in_place.busbw:.2f}",
                 f"{r.out_of_place.wrong}/{r.in_place.wrong}"] for r in run.rows]
        out.append(table(headers, rows))
        peak = run.peak
        out.append(f"peak bus bandwidth: {peak.busbw:.2f} GB/s at {human_bytes(peak.size)}")
        avg = f"{run.avg_busbw:.2f} GB/s" if run.avg_busbw is not None else "not in the log"
        out.append(f"avg bus bandwidth (as printed by nccl-tests): {avg}")
        if rate:
            out.append(f"nominal line rate: {cluster.line_rate_gbps:g} Gbit/s = {rate:.2f} GB/s "
                       f"(clusters.{cluster.name}.fabric_options.line_rate_gbps); peak is {100 * peak.busbw / rate:.0f}%")
    notes = findings(report, cluster)
    out.append("")
    out += notes if notes else ["PASS no wrong results; transport reported"]
    return "\n".join(out) + "\n"


def plot(report: Report, cluster: Cluster | None = None):
    """Bus bandwidth against message size (log-2 x axis), with the nominal line rate when the profile knows it.

    Returns the matplotlib Figure (built without pyplot, so no global state and no display are involved).
    """
    from matplotlib.figure import Figure  # lazy: matplotlib (~0.3 s) only when a plot is drawn
    from matplotlib.ticker import FuncFormatter  # lazy: matplotlib only when a plot is drawn

    fig = Figure(figsize=(8, 5), dpi=100)
    ax = fig.subplots()
    for i, run in enumerate(report.runs, 1):
        tag = f"test {i} " if len(report.runs) > 1 else ""
        sizes = [r.size for r in run.rows]
        ax.plot(sizes, [r.out_of_place.busbw for r in run.rows], marker="o", ms=3, label=f"{tag}out-of-place busbw")
        ax.plot(sizes, [r.in_place.busbw for r in run.rows], marker="x", ms=3, ls="--", label=f"{tag}in-place busbw")
    rate = line_rate_gbs(cluster)
    if rate:
        ax.axhline(rate, color="red", lw=1, label=f"nominal line rate {cluster.line_rate_gbps:g} Gbit/s ({cluster.name})")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: human_bytes(int(x)) if x >= 1 else ""))
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"nccl-tests: {Path(report.path).name}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    return fig


def save_png(fig, path: str | Path) -> Path:
    """Render to memory first, then write atomically: an interrupted plot never leaves half a PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return atomic_write(path, buf.getvalue())


def report_command(log: str, out: str | None = None, cluster_name: str | None = None) -> tuple[str, Path]:
    """What `invoke nccl-report` does: returns the text table and where the PNG went."""

    report = parse_file(log)
    # A log can be read anywhere; only the line rate needs the registry (and a named cluster needs it to exist).
    if cluster_name is None and not registry.registry_path().exists():
        cluster = None
    else:
        cluster = registry.load().cluster(cluster_name)
    png = Path(out) if out else Path(log).with_suffix(".png")
    if png.suffix.lower() != ".png":
        raise ShipyardError(f"--out {out}: the plot is written as PNG; give a path ending in .png")
    save_png(plot(report, cluster), png)
    return render_table(report, cluster), png
