"""`invoke usage JOBID`: summarise the launcher's ``--monitor`` samples per node and plot them over time.

The sampler (shipyard/launch/launcher.py) writes one CSV per node beside the job log,
``launch/logs/<name>-<jobid>.usage.<hostname>.csv``, with the header in :data:`HEADER`: one row per GPU per sample,
or one row per sample with the gpu_* fields empty where nvidia-smi is absent. The question users ask is "is the GPU
busy, or waiting on data?", so the summary puts CPU, RAM and GPU utilisation of each node side by side and says
"absent" rather than 0 where a node has no GPU to report.

The csv module (standard library) reads the files; a missing or changed header is refused with the file and line,
because a silently misread column would give a confident wrong answer.
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from shipyard.errors import ShipyardError
from shipyard.files import table
from shipyard.jobs import nccl_report

HEADER = ("timestamp,node,cpu_percent,mem_used_mb,mem_total_mb,gpu_index,gpu_util_percent,gpu_mem_used_mb,"
          "gpu_mem_total_mb").split(",")
ABSENT = "absent"
_JOBID = re.compile(r"^[0-9]+(_[0-9]+)?$")
# Below this mean GPU utilisation the summary points at the input pipeline or communication.
_IDLE_GPU_PERCENT = 50.0


@dataclass
class GpuSeries:
    index: str
    times: list[datetime] = field(default_factory=list)
    util: list[float] = field(default_factory=list)
    mem_used: list[float] = field(default_factory=list)
    mem_total: float | None = None


@dataclass
class NodeSeries:
    """All samples of one node: CPU/RAM once per sample time, GPUs by index."""

    node: str
    source: Path
    times: list[datetime] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    mem_used: list[float] = field(default_factory=list)
    mem_total: float | None = None
    gpus: dict[str, GpuSeries] = field(default_factory=dict)


def csv_glob(jobid: str) -> str:
    """The file pattern of one job's sampler output (the naming contract with launch.py)."""
    return f"*-{jobid}.usage.*.csv"


def launcher_name(csv_path: Path, jobid: str) -> str:
    """The launcher NAME of ``<name>-<jobid>.usage.<host>.csv``."""
    return csv_path.name.split(f"-{jobid}.usage.", 1)[0]


def find_csvs(logs_dir: Path, jobid: str, cluster: str | None = None,
              written_for: Callable[[str], str | None] = lambda name: None) -> list[Path]:
    """The job's sampler CSVs. With ``cluster``, only those of launchers written for it (``written_for(NAME)``: the
    launcher's cluster, None when unknown, which counts as this cluster's): job ids repeat across clusters, so the
    number alone does not say whose samples they are (as for `invoke logs`)."""
    if not _JOBID.match(str(jobid)):
        raise ShipyardError(f"JOBID {jobid!r}: expected a Slurm job id such as 1234 (or 1234_5 for an array task)")
    found = sorted(logs_dir.glob(csv_glob(jobid)))
    if not found:
        raise ShipyardError(f"{logs_dir}/{csv_glob(jobid)}: no monitoring samples for job {jobid} "
                            "(was it launched with --monitor, and has it started?)")
    if cluster is None:
        return found
    owners = {p: written_for(launcher_name(p, jobid)) for p in found}
    mine = [p for p in found if owners[p] in (None, cluster)]
    if not mine:
        other = found[0]
        raise ShipyardError(f"job {jobid}: {other} holds the samples of a job {jobid} on cluster {owners[other]}, "
                            f"not {cluster} (same number, another cluster); pass --cluster {owners[other]} for "
                            "that one")
    return mine


def _time(text: str, where: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ShipyardError(f"{where}: timestamp {text!r} is not ISO-8601 (e.g. 2026-01-31T12:00:05Z)") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _num(text: str, col: str, where: str, optional: bool = False) -> float | None:
    text = text.strip()
    if text == "" and optional:
        return None
    try:
        return float(text)
    except ValueError:
        raise ShipyardError(f"{where}: {col} {text!r} is not a number") from None


def read_csv(path: Path, text: str | None = None) -> list[NodeSeries]:
    """Parse one sampler CSV. Normally one node per file; rows of other nodes are kept apart all the same."""
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ShipyardError(f"{path}: cannot read: {exc.strerror}") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header != HEADER:
        raise ShipyardError(f"{path}:1: header must be {','.join(HEADER)}")
    nodes: dict[str, NodeSeries] = {}
    for lineno, row in enumerate(reader, start=2):
        where = f"{path}:{lineno}"
        if not row:
            continue
        if len(row) != len(HEADER):
            raise ShipyardError(f"{where}: expected {len(HEADER)} fields, got {len(row)}")
        t = _time(row[0], where)
        ns = nodes.setdefault(row[1], NodeSeries(row[1], path))
        if not ns.times or ns.times[-1] != t:  # CPU/RAM repeat on each GPU row of one sample
            ns.times.append(t)
            ns.cpu.append(_num(row[2], "cpu_percent", where))
            ns.mem_used.append(_num(row[3], "mem_used_mb", where))
            ns.mem_total = _num(row[4], "mem_total_mb", where)
        if row[5].strip() == "":
            continue
        g = ns.gpus.setdefault(row[5].strip(), GpuSeries(row[5].strip()))
        util = _num(row[6], "gpu_util_percent", where, optional=True)
        used = _num(row[7], "gpu_mem_used_mb", where, optional=True)
        if util is None or used is None:
            continue  # nvidia-smi can report "[N/A]" for one field; keep the rest of the sample
        g.times.append(t)
        g.util.append(util)
        g.mem_used.append(used)
        g.mem_total = _num(row[8], "gpu_mem_total_mb", where, optional=True) or g.mem_total
    return list(nodes.values())


def load_job(logs_dir: Path, jobid: str, cluster: str | None = None,
             written_for: Callable[[str], str | None] = lambda name: None) -> list[NodeSeries]:
    """The job's samples per node (:func:`find_csvs` picks the files)."""
    series: list[NodeSeries] = []
    for path in find_csvs(logs_dir, jobid, cluster, written_for):
        series += read_csv(path)
    if not any(s.times for s in series):
        raise ShipyardError(f"{logs_dir}/{csv_glob(jobid)}: the files hold a header but no samples yet")
    return sorted(series, key=lambda s: s.node)


def _fmt(v: float | None, digits: int = 1) -> str:
    return ABSENT if v is None else f"{v:.{digits}f}"


def summary_rows(series: list[NodeSeries]) -> list[list[str]]:
    rows = []
    for ns in series:
        span = (ns.times[-1] - ns.times[0]).total_seconds() if ns.times else 0.0
        node_cols = [ns.node, str(len(ns.times)), f"{span:.0f}", _fmt(statistics.fmean(ns.cpu)), _fmt(max(ns.cpu)),
                     _fmt(statistics.fmean(ns.mem_used), 0), _fmt(max(ns.mem_used), 0), _fmt(ns.mem_total, 0)]
        gpus = [g for g in ns.gpus.values() if g.util] or [None]
        for g in gpus:
            if g is None:
                rows.append(node_cols + [ABSENT] * 5)
            else:
                rows.append(node_cols + [g.index, _fmt(statistics.fmean(g.util)), _fmt(max(g.util)),
                                         _fmt(max(g.mem_used), 0), _fmt(g.mem_total, 0)])
    return rows


def hints(series: list[NodeSeries]) -> list[str]:
    """Plain-language reading of the numbers: where the time probably goes."""
    out = []
    for ns in series:
        busy = [g for g in ns.gpus.values() if g.util]
        if not busy:
            out.append(f"{ns.node}: no GPU samples (nvidia-smi absent): CPU and RAM only")
            continue
        idle = [g.index for g in busy if statistics.fmean(g.util) < _IDLE_GPU_PERCENT]
        if idle:
            out.append(f"{ns.node}: GPU {', '.join(idle)} busy less than {_IDLE_GPU_PERCENT:.0f}% on average: the GPUs "
                       "wait on something; more DataLoader workers, faster storage or larger batches may help")
    return out


def render_summary(jobid: str, series: list[NodeSeries]) -> str:
    headers = ["node", "samples", "span s", "cpu% avg", "cpu% max", "mem MB avg", "mem MB max", "mem MB total",
               "gpu", "gpu% avg", "gpu% max", "gpu mem MB max", "gpu mem MB total"]
    out = [f"usage of job {jobid}: {len(series)} node(s)", table(headers, summary_rows(series))]
    notes = hints(series)
    if notes:
        out += [""] + notes
    return "\n".join(out) + "\n"


def plot(jobid: str, series: list[NodeSeries]):
    """CPU %, RAM and (when present) GPU utilisation and memory against time since the job's first sample."""
    from matplotlib.figure import Figure  # lazy: matplotlib (~0.3 s) only when a plot is drawn

    has_gpu = any(g.util for ns in series for g in ns.gpus.values())
    panels = 4 if has_gpu else 2
    fig = Figure(figsize=(9, 2.4 * panels), dpi=100)
    axes = fig.subplots(panels, 1, sharex=True)
    t0 = min(ns.times[0] for ns in series if ns.times)

    def secs(times):
        return [(t - t0).total_seconds() for t in times]

    for ns in series:
        axes[0].plot(secs(ns.times), ns.cpu, label=ns.node)
        axes[1].plot(secs(ns.times), ns.mem_used, label=ns.node)
        for g in ns.gpus.values():
            if g.util and has_gpu:
                axes[2].plot(secs(g.times), g.util, label=f"{ns.node} gpu{g.index}")
                axes[3].plot(secs(g.times), g.mem_used, label=f"{ns.node} gpu{g.index}")
    axes[0].set_ylabel("CPU %")
    axes[1].set_ylabel("RAM used (MB)")
    if has_gpu:
        axes[2].set_ylabel("GPU util %")
        axes[3].set_ylabel("GPU mem (MB)")
    else:
        axes[1].text(0.99, 0.05, "GPU: absent (no nvidia-smi on the nodes)", transform=axes[1].transAxes,
                     ha="right", fontsize="small")
    axes[-1].set_xlabel("seconds since first sample")
    axes[0].set_title(f"job {jobid}: resource usage per node")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="x-small")
    fig.tight_layout()
    return fig


def default_png(csv_path: Path, jobid: str) -> Path:
    """``<name>-<jobid>.usage.<host>.csv`` -> ``<name>-<jobid>.usage.png`` beside it."""
    name = launcher_name(csv_path, jobid)
    return csv_path.with_name(f"{name}-{jobid}.usage.png")


def write_report(logs_dir: Path, jobid: str, out: str | None = None, cluster: str | None = None,
                 written_for: Callable[[str], str | None] = lambda name: None) -> tuple[str, Path]:
    """The summary text of job ``jobid``'s --monitor CSVs in ``logs_dir`` (of ``cluster``'s launchers, when given),
    and the PNG written (``out``, default beside the CSVs)."""
    series = load_job(logs_dir, str(jobid), cluster, written_for)
    png = Path(out) if out else default_png(series[0].source, str(jobid))
    if png.suffix.lower() != ".png":
        raise ShipyardError(f"--out {out}: the plot is written as PNG; give a path ending in .png")
    nccl_report.save_png(plot(str(jobid), series), png)
    return render_summary(str(jobid), series), png
