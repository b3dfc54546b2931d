"""Sweeps as Slurm job arrays: ``--sweep 'lr=1e-3,1e-4 seed=0,1,2'`` or ``--sweep-file combos.tsv``.

One launcher runs every combination as one array task. The combinations are a table beside it,
``launch/<name>.sweep.tsv`` (tab-separated: index, run directory, one column per parameter; written atomically), and
a read-only copy named by its sha256 that the launcher names: the job checks that hash and reads its row by index
from the copy (a later launch under the same name writes another copy, so a pending or requeued task runs the
combinations it was submitted with), so the values never pass through a shell parser: each reaches the training script
as two words ``--NAME VALUE``, exactly as typed (spaces, quotes, ``$(...)``). Each combination has a run directory
named from its values (``launch/sweeps/<name>/lr=1e-3_seed=0``; a value with other characters than ``[A-Za-z0-9.+-]``
adds a hash of the combination), the same on every requeue, chain segment and resubmit; a task that ends with exit 0
leaves ``.shipyard-done`` there, and a resubmit submits only the combinations without it. The array index is the
combination's index (``--array=1,3%P`` on the sbatch command line), so a partial resubmit keeps the mapping; beyond
the cluster's MaxArraySize the combinations are split into several arrays, each with an offset
(``SHIPYARD_SWEEP_OFFSET``) added to the task id.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from shipyard import project
from shipyard.errors import ShipyardError
from shipyard.files import atomic_write, exclusive_write, read_capped_text

_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_SAFE = re.compile(r"[A-Za-z0-9.+-]+")
DONE = ".shipyard-done"
MAX_COMBINATIONS = 100_000


@dataclass(frozen=True)
class Sweep:
    names: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]  # one per combination, in index order

    @property
    def count(self) -> int:
        return len(self.rows)

    def directory_name(self, i: int) -> str:
        return run_dir_name(self.names, self.rows[i])


def _check_value(where: str, name: str, value: str) -> str:
    if value == "" or "\t" in value or not value.isprintable():
        raise ShipyardError(f"{where}: value {value!r} of {name}: empty, or a tab or control character (a sweep "
                            "value is one table cell)")
    return value


def _check_names(where: str, names: Sequence[str]) -> tuple[str, ...]:
    for n in names:
        if not _PARAM.fullmatch(n):
            raise ShipyardError(f"{where}: parameter {n!r}: use letters, digits, '_' and '-' (it becomes --{n})")
    if len(set(names)) != len(names):
        raise ShipyardError(f"{where}: a parameter is named twice ({', '.join(names)})")
    if not names:
        raise ShipyardError(f"{where}: no parameter (e.g. --sweep 'lr=1e-3,1e-4 seed=0,1')")
    return tuple(names)


def parse_spec(spec: str) -> Sweep:
    """``'lr=1e-3,1e-4 seed=0,1,2'``: every combination, the last parameter varying fastest. Values here cannot
    hold spaces or commas; a table (``--sweep-file``) can."""
    names, values = [], []
    for part in spec.split():
        name, sep, vals = part.partition("=")
        if not sep or not vals:
            raise ShipyardError(f"--sweep {part!r}: expected NAME=V1,V2,... (e.g. --sweep 'lr=1e-3,1e-4 seed=0,1')")
        names.append(name)
        values.append([_check_value("--sweep", name, v) for v in vals.split(",")])
    names = _check_names("--sweep", names)
    total = 1
    for v in values:
        total *= len(v)
    if total > MAX_COMBINATIONS:
        raise ShipyardError(f"--sweep: {total} combinations; at most {MAX_COMBINATIONS}")
    return Sweep(names, tuple(tuple(c) for c in itertools.product(*values)))


def _tsv_rows(text: str, where: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of a tab-separated table, by Python's csv reader with these rules: cells are separated by
    one tab and taken as they are (no quoting, no escapes: every character of a cell is the value); a row ends at
    ``\n`` or ``\r\n`` and nowhere else (a vertical tab, form feed or other Unicode line break is a character of
    its cell, refused there as a control character); an empty line is skipped; there are no comments (a row that
    starts with ``#`` is a row). A carriage return inside a row is one line naming the row."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last row
    rows = []
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE, strict=True)  # one row per element
    try:
        for n, cells in enumerate(reader, 1):
            if cells:
                rows.append((n, cells))
    except csv.Error as exc:
        raise ShipyardError(f"{where}: line {reader.line_num}: {exc} (a row ends at a newline; a cell holds no "
                            "carriage return)") from None
    return rows


def parse_file(path: str | Path) -> Sweep:
    """A tab-separated table (:func:`_tsv_rows`' rules): a header of parameter names, then one combination per
    line. Read capped (``input_bytes.sweep_file``): /dev/zero is one line, a FIFO without a writer is empty."""
    where = f"--sweep-file {path}"
    try:
        text = read_capped_text(path, "sweep_file", "a sweep file")
    except (OSError, UnicodeDecodeError) as exc:
        raise ShipyardError(f"{where}: cannot read it ({exc})") from None
    lines = _tsv_rows(text, where)
    if not lines:
        raise ShipyardError(f"{where}: empty (expected a header line of parameter names, then rows)")
    names = _check_names(where, lines[0][1])
    if len(lines) - 1 > MAX_COMBINATIONS:
        raise ShipyardError(f"{where}: {len(lines) - 1} combinations (1 to {MAX_COMBINATIONS})")
    rows = []
    for n, cells in lines[1:]:
        if len(cells) != len(names):
            raise ShipyardError(f"{where}: row {n} has {len(cells)} cells, the header {len(names)}")
        rows.append(tuple(_check_value(f"{where} row {n}", k, v) for k, v in zip(names, cells)))
    if not rows:
        raise ShipyardError(f"{where}: {len(rows)} combinations (1 to {MAX_COMBINATIONS})")
    return Sweep(names, tuple(rows))


def from_options(spec: str | None, file: str | None) -> Sweep | None:
    if spec and file:
        raise ShipyardError("--sweep and --sweep-file exclude each other")
    return parse_spec(spec) if spec else parse_file(file) if file else None


def run_dir_name(names: Sequence[str], values: Sequence[str]) -> str:
    """``lr=1e-3_seed=0``: the values as they are when they are plain, else made plain plus a hash of the exact
    combination (so two combinations never share a directory); long names are cut and hashed alike."""
    parts = [f"{k}={v}" if _SAFE.fullmatch(v) else f"{k}={re.sub(r'[^A-Za-z0-9.+-]+', '-', v).strip('-')[:24]}"
             for k, v in zip(names, values)]
    name = "_".join(parts)
    plain = all(_SAFE.fullmatch(v) for v in values) and len(name) <= 120
    if plain:
        return name
    digest = hashlib.sha256("\0".join(f"{k}\0{v}" for k, v in zip(names, values)).encode()).hexdigest()[:10]
    return f"{name[:100]}_{digest}"


# ------------------------------------------------------------------------------------------------ files


def table_path(root: str | Path, name: str) -> Path:
    return project.launchers_dir(Path(root)) / f"{name}.sweep.tsv"


def runs_dir(root: str | Path, name: str) -> Path:
    return project.launchers_dir(Path(root)) / "sweeps" / name


@functools.lru_cache(maxsize=4)  # the launcher, its table, the copy's name and hash all need the same text
def render_table(sw: Sweep) -> str:
    lines = ["\t".join(("index", "dir", *sw.names))]
    lines += ["\t".join((str(i), sw.directory_name(i), *row)) for i, row in enumerate(sw.rows)]
    return "\n".join(lines) + "\n"


def table_sha256(sw: Sweep) -> str:
    return hashlib.sha256(render_table(sw).encode("utf-8")).hexdigest()


def submitted_table_path(root: str | Path, name: str, sw: Sweep) -> Path:
    """The copy of ``sw``'s table that its launcher's array tasks read: named by the table's sha256, so a later
    launch under the same name (another table) writes another copy and never changes this one; a pending or
    requeued task reads the combinations it was submitted with."""
    return runs_dir(root, name) / ".tables" / f"{table_sha256(sw)}.tsv"


def write_table(root: str | Path, name: str, sw: Sweep) -> Path:
    """``launch/NAME.sweep.tsv`` (the latest sweep of that name: sweep-status, resubmits) and the immutable copy the
    launcher reads (:func:`submitted_table_path`; written once, kept while its content is its name)."""
    text = render_table(sw)
    copy = submitted_table_path(root, name, sw)
    try:
        kept = not copy.is_symlink() and copy.is_file() and \
            hashlib.sha256(copy.read_bytes()).hexdigest() == table_sha256(sw)
    except OSError:
        kept = False
    if not kept:
        copy.parent.mkdir(parents=True, exist_ok=True)
        exclusive_write(copy, text, mode=0o444)
    return atomic_write(table_path(root, name), text)


def read_table(root: str | Path, name: str) -> tuple[Sweep, list[str]]:
    """The sweep written for launcher ``name`` and its run directory names: a regular file read capped
    (``input_bytes.sweep_table``), every row ``index, dir, values`` with the index in order; anything else one line."""
    path = table_path(root, name)
    try:
        text = read_capped_text(path, "sweep_table", "a sweep table", regular=True)
    except FileNotFoundError:
        raise ShipyardError(f"{path}: no sweep named {name} here (write one with invoke launch --name {name} "
                            "--sweep ...)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ShipyardError(f"{path}: cannot read it ({exc})") from None
    rows = _tsv_rows(text, str(path))
    again = f"write it again with invoke launch --name {name} --sweep ..."
    if not rows or rows[0][1][:2] != ["index", "dir"] or len(rows[0][1]) < 3:
        raise ShipyardError(f"{path}: not a sweep table (expected a header index, dir, parameters); {again}")
    head = rows[0][1]
    for i, (n, cells) in enumerate(rows[1:]):
        if len(cells) != len(head) or cells[0] != str(i) or not cells[1] or "/" in cells[1] or cells[1] in (".", ".."):
            raise ShipyardError(f"{path}: line {n} is not combination {i} of this table; {again}")
    return Sweep(tuple(head[2:]), tuple(tuple(c[2:]) for _, c in rows[1:])), [c[1] for _, c in rows[1:]]


def done(root: str | Path, name: str, dirs: Sequence[str]) -> list[bool]:
    base = runs_dir(root, name)
    return [(base / d / DONE).is_file() and not (base / d / DONE).is_symlink() for d in dirs]


def array_specs(indices: Sequence[int], max_array_size: int) -> list[tuple[int, str]]:
    """The indices to submit as (offset, array spec) per array: task ids below ``max_array_size``."""
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(i // max_array_size * max_array_size, []).append(i)
    return [(off, _ranges([i - off for i in ids])) for off, ids in sorted(groups.items())]


def _ranges(ids: Sequence[int]) -> str:
    out, start, prev = [], None, None
    for i in sorted(ids):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = prev = i
    out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)
