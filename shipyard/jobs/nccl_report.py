"""`invoke nccl-report LOG`: nccl-tests output -> a table, the transport verdict and a bus-bandwidth plot.

Why a parser of its own: nccl-tests prints a fixed-column text table and, in the logs users have, nothing
machine-readable. Those logs are srun/mpirun/pdsh outputs in which rank or host prefixes (``0:``,
``[1,0]<stdout>:``, ``node1:``) and other ranks' ``NCCL INFO`` lines are interleaved with the table, and the table
itself changed over the years (tests/data/nccl/real/ holds public samples of each, with their sources):

- new layout: size count type redop root, then time algbw busbw #wrong for out-of-place and in-place; ``#wrong``
  is printed with ``%6g`` (so 1048576 wrong elements read ``1.04858e+06``) or ``N/A`` when validation is off;
- old layouts (nccl-tests before 2.x): no root column, or no redop column (broadcast), or neither, and an ``error``
  column (the largest numeric error, ``5e-07``: not a count) instead of ``#wrong``;
- extra trailing columns (timestamps) and sizes of 0 bytes, which may repeat (reduce_scatter with few elements).

A row is found wherever in a line its columns start (after any prefix), so a row glued behind another rank's output
is still read; comment, log and truncated lines never match. Rows of several processes that each ran the whole test
(nccl-tests built without MPI, or launched once per rank) repeat sizes or list a rank twice: that is reported as a
broken launch, never as several clean tests. The one exception is a log that says it holds one test per node
(shipyard's ``mpi: none`` launcher, whose step runs under ``srun --label``): each task's lines are read apart.

Bus bandwidth (busbw), not algbw, is what compares with the fabric: for a ring all_reduce over several nodes it
equals the traffic each node's NICs carry per direction, so it is held against the node's line rate
(``fabric_options.line_rate_gbps``, converted to GB/s like busbw), and never reported as more than 100% of it.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from shipyard import facts, nccl_transport
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, read_capped_text, table
from shipyard.registry.model import Cluster

_INT = re.compile(r"-?\d+$")
_UINT = re.compile(r"\d+$")
_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*$")
_NUM = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$|-?nan$|-?inf$", re.IGNORECASE)
_GLUED = re.compile(r"^(.*[:>\]])(\d+)$")  # "[1,0]<stdout>:137438953472": a prefix glued to a wide size
# The column names between "type" and "time" in a table header, and whether the last column is #wrong or error.
_COLUMNS = re.compile(r"\bsize\s+count\s+type\s+((?:[a-z]+\s+)*?)time\s+algbw\s+busbw\s+(#wrong|error)\b")
_LAYOUTS = (("redop", "root"), ("redop",), ("root",), ())  # new, then the older ones
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                   r"\[[^\]]*\]\s+(.*?)\s*$")
_HEADER = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(.*?)\s*$")
_FAILURE = re.compile(r"(Test (?:NCCL |CUDA )?failure.*?)\s*$")
_STAMP = re.compile(r"\d[\d:.-]*$")
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")  # srun --label: the task number, padded to the widest one, then ": "
# A rank prefix a launcher writes before each chunk it forwards: "[0]" / "[0]:" (MPICH and Intel MPI -l /
# -prepend-rank), "[1,0]<stdout>:" (Open MPI --tag-output), "0:" (srun --label). When a rank's row reaches the
# launcher in two chunks, the prefix lands inside the row; such words are dropped when a line does not read as a row.
_RANK_WORD = re.compile(r"^(?:\[\d+(?:,\d+)?\](?:<std(?:out|err)>)?:?|\d+:)$")
_RANK_FRONT = re.compile(r"^(\[\d+(?:,\d+)?\](?:<std(?:out|err)>)?:?)(\S+)$")
_RANK_BACK = re.compile(r"^(\S*?[0-9A])(\[\d+(?:,\d+)?\](?:<std(?:out|err)>)?:?)$")  # "-1[0]", "N/A[0]"  # a timestamp column (-R: "%Y-%m-%d %H:%M:%S", two words)
_MAX_EXTRA = 3  # trailing columns after the in-place #wrong (timestamps, cpu time) a row may carry


@dataclass(frozen=True)
class Measure:
    """One half of a row: out-of-place or in-place."""

    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: str  # as printed: a count ("0", "1.04858e+06"), an old-layout error ("5e-07"), or "N/A" (validation off)


@dataclass(frozen=True)
class Row:
    size: int  # bytes
    count: int  # elements
    dtype: str
    redop: str  # "" in layouts without the column
    root: int  # -1 in layouts without the column
    out_of_place: Measure
    in_place: Measure
    wrong_is_count: bool = True  # False for the old "error" column (the largest error, not a count)

    @property
    def wrong(self) -> int:
        """Wrong elements in both halves (0 for N/A and for old-layout error values)."""
        if not self.wrong_is_count:
            return 0
        return sum(int(float(m.wrong)) for m in (self.out_of_place, self.in_place) if _NUM.match(m.wrong))

    @property
    def busbw(self) -> float:
        """The better of the two halves: what the fabric reached at this size (a half that is NaN counts as 0)."""
        vals = [m.busbw for m in (self.out_of_place, self.in_place) if m.busbw == m.busbw]
        return max(vals) if vals else 0.0


@dataclass
class Run:
    """One test table. A log may hold several (e.g. a job that ran all_reduce_perf then all_gather_perf)."""

    rows: list[Row] = field(default_factory=list)
    avg_busbw: float | None = None  # the "# Avg bus bandwidth" line, as printed
    out_of_bounds: str | None = None  # e.g. "0 OK" or "3 FAILED"
    header: dict[str, int] = field(default_factory=dict)  # nThread, nGpus, minBytes, maxBytes
    layout: tuple[str, ...] | None = None  # the header's columns between type and time, when a header was seen
    wrong_is_count: bool | None = None  # from the header: #wrong (True) or error (False)
    ranks: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # rank -> (host, pid, GPU model)
    node: str = ""  # a per-node test (mpi: none): "task K (HOST)", the srun task that ran it

    @property
    def peak(self) -> Row:
        return max(self.rows, key=lambda r: r.busbw)


@dataclass
class Report:
    path: str
    runs: list[Run]
    ranks: dict[int, tuple[str, str]]  # rank -> (host, GPU model)
    transport: nccl_transport.Transport
    failures: list[str]
    broken: list[str] = field(default_factory=list)  # why the output is not one clean test per table
    per_node: int = 0  # an mpi: none launch's tests, one per node (srun tasks seen); 0: one test across the ranks

    @property
    def networks(self) -> list[str]:
        """The network names NCCL selected (see shipyard/nccl_transport.py), in order of first appearance."""
        return list(self.transport.names)


def _f(text: str) -> float:
    return float("nan") if text == "N/A" else float(text)


def _words(line: str) -> list[str]:
    out = []
    for w in line.split():
        m = _GLUED.match(w)
        out += [m[1], m[2]] if m and not _UINT.match(w) else [w]
    return out


def _value(w: str) -> bool:
    return bool(_NUM.match(w)) or w == "N/A"


def _parse_at(words: list[str], i: int, layout: tuple[str, ...], wrong_is_count: bool | None) -> Row | None:
    """The row whose size is words[i], read with ``layout``; None if the words do not fit it."""
    size, count, dtype = words[i:i + 3]
    j, redop, root = i + 3, "", -1
    for col in layout:
        if j >= len(words):
            return None
        if col == "redop":
            if not _IDENT.match(words[j]):
                return None
            redop = words[j]
        elif not _INT.match(words[j]):
            return None
        else:
            root = int(words[j])
        j += 1
    vals = words[j:j + 8]
    if len(vals) < 8 or not all(_value(v) for v in vals) or len(words) - (j + 8) > _MAX_EXTRA:
        return None
    if any(not _value(v) and not _IDENT.match(v) and not _STAMP.match(v) for v in words[j + 8:]):
        return None
    if wrong_is_count is None:
        # no header seen: the old error column prints %e with a negative exponent or 0e+00; a count never does
        wrong_is_count = not any(re.search(r"e-|^0e\+00$", v) for v in (vals[3], vals[7]))
    halves = [Measure(_f(vals[k]), _f(vals[k + 1]), _f(vals[k + 2]), vals[k + 3]) for k in (0, 4)]
    return Row(int(size), int(count), dtype, redop, root, halves[0], halves[1], wrong_is_count)


def _without_rank_prefixes(words: list[str]) -> list[str]:
    """``words`` without rank prefixes, standalone or glued to the front of a column ("[0]354.9")."""
    out = []
    for w in words:
        if _RANK_WORD.match(w):
            continue
        front, back = _RANK_FRONT.match(w), _RANK_BACK.match(w)
        out.append(front[2] if front else back[1] if back else w)
    return out


def parse_row(line: str, layout: tuple[str, ...] | None = None, wrong_is_count: bool | None = None) -> Row | None:
    """A result row anywhere in ``line`` (after any prefix), in the header's layout or, without one, the first
    layout that reads the words exactly (newest first). A line that does not read as a row is read again without
    rank prefixes, which a launcher may have written inside the row (see ``_RANK_WORD``)."""
    row = _parse_words(_words(line), layout, wrong_is_count)
    if row is None:
        words = _words(line)
        bare = _without_rank_prefixes(words)
        if bare != words:
            row = _parse_words(bare, layout, wrong_is_count)
    return row


def _parse_words(words: list[str], layout: tuple[str, ...] | None, wrong_is_count: bool | None) -> Row | None:
    if len(words) < 11:
        return None
    for i in range(len(words) - 10):
        if not (_UINT.match(words[i]) and _UINT.match(words[i + 1]) and _IDENT.match(words[i + 2])):
            continue
        for lay in ((layout,) if layout is not None else _LAYOUTS):
            row = _parse_at(words, i, lay, wrong_is_count)
            # without a header, the layout must use up the line (extra columns need the header to be told apart)
            if row is not None and (layout is not None or _exact(words, i, lay)):
                return row
    return None


def _exact(words: list[str], i: int, layout: tuple[str, ...]) -> bool:
    return len(words) == i + 3 + len(layout) + 8


class _Parser:
    """One pass over the log: rows, headers, ranks, summaries, failures and the transport lines together."""

    def __init__(self) -> None:
        self.runs: list[Run] = [Run()]
        self.failures: list[str] = []
        self.broken: list[str] = []
        self.transport = nccl_transport.Reader()
        self.layout: tuple[str, ...] | None = None
        self.wrong_is_count: bool | None = None
        self.section: tuple | None = None  # (dtype, redop, root) of the rows being read
        self.sections: set[tuple] = set()
        self.last_size = -1

    def _broken(self, why: str) -> None:
        if why not in self.broken:
            self.broken.append(why)

    def _new_run(self) -> Run:
        self.runs.append(Run())
        self.section, self.sections, self.last_size = None, set(), -1
        return self.runs[-1]

    def feed(self, line: str) -> None:
        self.transport.feed(line)
        cur = self.runs[-1]
        row = parse_row(line, self.layout, self.wrong_is_count)
        if row is not None:
            self._row(cur, row)
            return
        if m := _HEADER.search(line):
            if cur.rows or cur.avg_busbw is not None or cur.out_of_bounds is not None:
                cur = self._new_run()
            elif cur.header:
                self._broken("the test header appears twice before any result: several independent nccl-tests "
                             "processes (built without MPI=1, or started once per rank instead of as one MPI job)")
            cur.header = dict(zip(("nThread", "nGpus", "minBytes", "maxBytes"), map(int, m.groups())))
        elif m := _COLUMNS.search(line):
            self.layout = tuple(m[1].split())
            self.wrong_is_count = m[2] == "#wrong"
            cur.layout, cur.wrong_is_count = self.layout, self.wrong_is_count
        elif m := _RANK.search(line):
            rank, who = int(m[1]), (m[3], m[2], m[5])
            if rank in cur.ranks and cur.ranks[rank] != who:
                self._broken(f"rank {rank} is listed twice ({cur.ranks[rank][0]} and {who[0]}): each process ran "
                             "its own test instead of joining one job")
            cur.ranks.setdefault(rank, who)
        elif m := _AVG.search(line):
            if cur.avg_busbw is not None:
                self._broken("two result summaries for one test: several processes printed the same test")
            try:
                cur.avg_busbw = float(m[1])
            except ValueError:
                pass
        elif m := _OOB.search(line):
            cur.out_of_bounds = m[1]
        elif m := _FAILURE.search(line):
            self.failures.append(m[1])

    def _row(self, cur: Run, row: Row) -> None:
        if cur.avg_busbw is not None or cur.out_of_bounds is not None:
            cur = self._new_run()  # a second table after a summary, without its own header: another test
        key = (row.dtype, row.redop, row.root)
        if key != self.section:
            if key in self.sections:
                self._broken(f"the {'/'.join(str(k) for k in key)} rows restart after other rows: tables of "
                             "several processes are interleaved")
                return
            self.section, self.last_size = key, -1
            self.sections.add(key)
        elif row.size < self.last_size or (row.size == self.last_size and row.size > 0):
            # sizes only grow within one section (0-byte rows may repeat: sizes rounded down to no elements)
            self._broken(f"size {row.size} comes again after {self.last_size}: the same table is printed by "
                         "several processes (or twice)")
            return
        self.last_size = row.size
        cur.rows.append(row)


def _parsed(lines) -> _Parser:
    p = _Parser()
    for line in lines:
        p.feed(line)
    return p


def per_node_line() -> str:
    """What a shipyard nccl-test job with ``mpi: none`` prints first (shipyard/data/launch.yaml)."""
    return facts.load("launch")["nccl_test"]["per_node_line"]


def parse_text(text: str, path: str = "<log>") -> Report:
    """Parse nccl-tests output (any *_perf binary, any layout). A log without result rows gives a report with no
    runs: its transport and failures are still read (see :func:`write_report`).

    A shipyard ``mpi: none`` job (its first line says so, :func:`per_node_line`) ran one test per node under
    ``srun --label``: each task's lines are read as a test of their own, never as copies of one broken launch."""
    lines = text.splitlines()
    marker = per_node_line()
    if any(line.startswith(marker) for line in lines):
        return _per_node(lines, path)
    p = _parsed(lines)
    runs = [r for r in p.runs if r.rows]
    ranks = {k: (h, model) for r in p.runs for k, (h, _pid, model) in r.ranks.items()}
    return Report(path, runs, ranks, p.transport.result(), p.failures, p.broken)


def _per_node(lines: list[str], path: str) -> Report:
    tasks: dict[int, list[str]] = {}
    for line in lines:
        if m := _LABEL.match(line):
            tasks.setdefault(int(m[1]), []).append(m[2])
    transport = nccl_transport.read(lines)  # what NCCL selected, read over every task's lines as before
    runs, ranks, failures, broken = [], {}, [], []
    for task, own in sorted(tasks.items()):
        p = _parsed(own)
        hosts = sorted({h for r in p.runs for h, _pid, _model in r.ranks.values()})
        node = f"task {task}" + (f" ({', '.join(hosts)})" if hosts else "")
        for run in p.runs:
            run.node = node
            runs += [run] if run.rows else []
            for _rank, (h, _pid, model) in sorted(run.ranks.items()):
                ranks[len(ranks)] = (h, model)
        failures += p.failures
        broken += [f"{node}: {why}" for why in p.broken]
    return Report(path, runs, ranks, transport, failures, broken, per_node=len(tasks))


def no_rows_message(report: Report) -> str:
    why = f"; the log says: {report.failures[0]}" if report.failures else ""
    return (f"{report.path}: no nccl-tests result rows found (expected rows of size, count, type[, redop, root], then "
            f"time, algbw, busbw, #wrong for out-of-place and in-place){why}")


class NoRows(ShipyardError):
    """A log with no result rows. ``text`` is what can still be said about it (transport and verdict)."""

    def __init__(self, message: str, text: str) -> None:
        super().__init__(message)
        self.text = text


def parse_file(path: str | Path) -> Report:
    p = Path(path)
    try:
        text = read_capped_text(p, "nccl_log", "an nccl-tests log", errors="replace")
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
    """The node's nominal line rate in GB/s, the unit of busbw (the profile gives Gbit/s), or None without one."""
    if cluster is None or cluster.line_rate_gbps is None:
        return None
    return cluster.line_rate_gbps / 8.0


def _rate_key(cluster: Cluster) -> str:
    """Where the partition's line rate was written: its own entry, else the cluster's fabric_options."""
    key = cluster.key("line_rate_gbps")
    return key if ".partitions." in key else f"clusters.{cluster.name}.fabric_options.line_rate_gbps"


def line_rate_note(report: Report, run: Run, cluster: Cluster | None) -> str | None:
    """What the peak busbw says about the network, held against the node's line rate; never more than 100%.

    For a ring all_reduce over several nodes busbw equals what each node's NICs carry per direction, so it is at most
    the line rate. When it is higher the run was not limited by the network (one node: NVLink/PCIe only; tree or NVLS
    algorithms on few nodes send less than busbw over the wire), and a percentage would be meaningless."""
    rate = line_rate_gbs(cluster)
    if not rate or not run.rows:
        return None
    peak = run.peak.busbw
    head = (f"node line rate: {cluster.line_rate_gbps:g} Gbit/s = {rate:.2f} GB/s per direction "
            f"(partition {cluster.partition}: {_rate_key(cluster)})")
    hosts = {h for h, _pid, _model in run.ranks.values()} if report.per_node else {h for h, _ in report.ranks.values()}
    if report.per_node and len(hosts) != 1:
        return f"{head}; this test ran within one node: busbw measures NVLink/PCIe, not the network"
    if len(hosts) == 1:
        return f"{head}; all ranks ran on one node ({next(iter(hosts))}): busbw measures NVLink/PCIe, not the network"
    if peak > rate:
        return (f"{head}; peak busbw {peak:.2f} GB/s is above it, so this run was not limited by the network "
                "(on one node, or a tree/NVLS algorithm on few nodes sends less than busbw over the wire): "
                "no percentage of line rate applies")
    return (f"{head}; peak busbw is {100 * peak / rate:.0f}% of it (busbw of a ring all_reduce across nodes "
            "is the traffic each node's NICs carry per direction)")


def _far_below(report: Report, run: Run, cluster: Cluster | None) -> str | None:
    """What a multi-node run's peak busbw far below the node's line rate says (shipyard/data/nccl.yaml
    ``line_rate.far_below``); None when it is not, or when no rate or only one node applies."""
    rate = line_rate_gbs(cluster)
    if not rate or not run.rows or report.per_node or len({h for h, _ in report.ranks.values()}) < 2:
        return None
    share = float(facts.load("nccl")["line_rate"]["far_below"])
    peak = run.peak.busbw
    if peak >= share * rate:
        return None
    return (f"peak busbw {peak:.2f} GB/s is {100 * peak / rate:.0f}% of the node line rate ({rate:.2f} GB/s, "
            f"{_rate_key(cluster)}), below {100 * share:.0f}%: a socket fallback (see the transport verdict), a NIC "
            "or rail NCCL does not use, or sizes too small to fill the link (run up to 16G)")


def no_cuda_device(report: Report) -> list[str]:
    """The failure lines of ranks that found no usable GPU (shipyard/data/nccl.yaml ``no_cuda_device``)."""
    known = facts.load("nccl")["no_cuda_device"]
    return [f for f in report.failures if any(k in f for k in known)]


def findings(report: Report, cluster: Cluster | None) -> list[str]:
    """What a user must look at: a broken launch, wrong results, failures, the transport against the fabric."""
    out = []
    for why in report.broken:
        out.append(f"FAIL broken launch: {why}; the table below keeps the first copy only")
    for i, run in enumerate(report.runs, 1):
        tag = f"{run.node}: " if run.node else f"test {i}: " if len(report.runs) > 1 else ""
        bad = [r for r in run.rows if r.wrong]
        if bad:
            out.append(f"FAIL {tag}wrong results at {', '.join(human_bytes(r.size) for r in bad)} "
                       "(the #wrong column): the data path corrupts data; rerun with NCCL_DEBUG=INFO")
        if run.out_of_bounds and not run.out_of_bounds.endswith("OK"):
            out.append(f"FAIL {tag}out of bounds values: {run.out_of_bounds}")
        far = _far_below(report, run, cluster)
        if far:
            out.append(f"WARN {tag}{far}")
    no_device = no_cuda_device(report)
    if no_device:
        out.append(f"FAIL no CUDA device: {len(no_device)} rank(s) stopped at their first CUDA call, before NCCL "
                   f"started ({no_device[0]}); run on nodes with GPUs and their driver (the partition's GPUs, the "
                   "runtime's --nv / pyxis GPU support). NCCL's settings play no part: it never ran")
    for f in report.failures:
        if f not in no_device:
            out.append(f"FAIL the log reports: {f}")
    t = report.transport
    if no_device and not t.logged:
        return out  # no transport can be logged when NCCL never started: no debug setting would show one
    if report.per_node:
        return out  # no test crossed nodes: no transport is expected to carry one (transport_lines says so)
    if cluster is not None:
        status, line = nccl_transport.verdict(t, cluster.fabric)
        line = line.removeprefix(nccl_transport.PREFIX).removeprefix("WARNING: ")
        if status == "none":
            out.append("WARN no NCCL transport in the log: rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "
                       "to see which transport was used")
        elif status != "ok":
            out.append(f"FAIL {line} (cluster '{cluster.name}'): the fast fabric's userspace did not load "
                       "(libibverbs/rdma-core or aws-ofi-nccl missing from the image, or not injected by the site?)")
    elif not t.logged:
        out.append("WARN no NCCL transport in the log: rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "
                   "to see which transport was used")
    return out


def per_node_lines(report: Report) -> list[str]:
    """What a per-node launch measured, and what it did not (none for one test across the ranks)."""
    if not report.per_node:
        return []
    return [f"per node (mpi: none): {report.per_node} test(s), one per node, each measuring the GPUs of its node only; "
            "nothing between nodes was measured (across nodes: nccl_tests mpi: openmpi, on a cluster whose srun "
            "starts MPI ranks)"]


def transport_lines(report: Report, cluster: Cluster | None) -> list[str]:
    t = report.transport
    out = [f"network: {', '.join(t.names) if t.logged else 'not in the log'}"
           + (f" (libfabric provider {', '.join(t.providers)})" if t.providers else "")]
    if cluster is not None and not t.logged and no_cuda_device(report):
        out.append("transport verdict: none: NCCL never started (no CUDA device on the ranks)")
    elif cluster is not None and report.per_node:
        out.append("transport verdict: none needed: each test ran within one node, so nothing crossed the network")
    elif cluster is not None:
        out.append("transport verdict: " + nccl_transport.verdict(t, cluster.fabric)[1]
                   .removeprefix(nccl_transport.PREFIX))
    return out


def render_table(report: Report, cluster: Cluster | None = None) -> str:
    """The text report: who ran, which transport, one table row per message size, peak and average, findings."""
    out = [f"nccl-tests report: {report.path}"]
    if report.ranks:
        hosts = sorted({h for h, _ in report.ranks.values()})
        models = sorted({m for _, m in report.ranks.values()})
        out.append(f"ranks: {len(report.ranks)} on {len(hosts)} node(s) ({', '.join(hosts)}); GPU: {', '.join(models)}")
    out += per_node_lines(report) + transport_lines(report, cluster)
    if report.per_node and report.runs:
        out += ["", table(["node", "peak busbw", "at", "avg busbw (as printed)"],
                          [[run.node, f"{run.peak.busbw:.2f} GB/s", human_bytes(run.peak.size),
                            f"{run.avg_busbw:.2f} GB/s" if run.avg_busbw is not None else "-"]
                           for run in report.runs])]
    for i, run in enumerate(report.runs, 1):
        out.append("")
        if run.node or len(report.runs) > 1:
            out.append(run.node or f"test {i}")
        headers = ["size", "count", "type", "redop", "root", "oop time(us)", "oop algbw", "oop busbw",
                   "ip time(us)", "ip algbw", "ip busbw", "#wrong" if run.rows[0].wrong_is_count else "error"]
        rows = [[human_bytes(r.size), r.count, r.dtype, r.redop or "-", r.root,
                 f"{r.out_of_place.time_us:.2f}", f"{r.out_of_place.algbw:.2f}", f"{r.out_of_place.busbw:.2f}",
                 f"{r.in_place.time_us:.2f}", f"{r.in_place.algbw:.2f}", f"{r.in_place.busbw:.2f}",
                 f"{r.out_of_place.wrong}/{r.in_place.wrong}"] for r in run.rows]
        out.append(table(headers, rows))
        peak = run.peak
        out.append(f"peak bus bandwidth: {peak.busbw:.2f} GB/s at {human_bytes(peak.size)}")
        avg = f"{run.avg_busbw:.2f} GB/s" if run.avg_busbw is not None else "not in the log"
        out.append(f"avg bus bandwidth (as printed by nccl-tests): {avg}")
        note = line_rate_note(report, run, cluster)
        if note:
            out.append(note)
    notes = findings(report, cluster)
    out.append("")
    passed = ("PASS no wrong results on any node" if report.per_node
              else "PASS no wrong results; transport as expected" if cluster is not None
              else "PASS no wrong results; transport reported")
    out += notes if notes else [passed]
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
        tag = f"{run.node} " if run.node else f"test {i} " if len(report.runs) > 1 else ""
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


def write_report(log: str, out: str | None = None, cluster: Cluster | None = None) -> tuple[str, Path]:
    """The text table of nccl-tests output ``log`` and the PNG written (``out``, default LOG with .png); ``cluster``
    (None: none known) gives the line rate and the transport verdict.

    A log without result rows raises :class:`NoRows` (exit 2) carrying what can still be said: the transport NCCL
    selected and its verdict for the cluster (a job that failed before its first row often failed on the fabric)."""
    report = parse_file(log)
    png = Path(out) if out else Path(log).with_suffix(".png")
    if png.suffix.lower() != ".png":
        raise ShipyardError(f"--out {out}: the plot is written as PNG; give a path ending in .png")
    if not report.runs:
        lines = [f"nccl-tests report: {report.path}"] + per_node_lines(report) + transport_lines(report, cluster)
        lines += [n for n in findings(report, cluster)]
        raise NoRows(no_rows_message(report), "\n".join(lines) + "\n")
    save_png(plot(report, cluster), png)
    return render_table(report, cluster), png
