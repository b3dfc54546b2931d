"""`invoke compat.refresh`: derive compat.yaml's wheel facts from package metadata and show them as a diff.

What it derives, per torch patch of the default CUDA variant (the wheels on PyPI):
- the pins the wheel's metadata makes (nvidia-nccl, nvidia-cudnn, nvidia-cuda-runtime, triton), by resolving
  ``torch==X`` for the target platform;
- the Pythons with a wheel (one metadata-only resolution per candidate Python: ``--no-deps``), and min_glibc (does a
  wheel also install on manylinux_2_17?);
- the companion torchvision/torchaudio: the newest release whose metadata accepts ``torch==X`` and not the next
  known torch release (a companion pins its torch; one that also accepts the next release was not made for X);
- each companion's own Pythons.

Why uv (``uv pip compile --no-build``) rather than PyPI's JSON API: uv resolves exactly as ``invoke lock`` and pip
will (markers evaluated for the target platform and Python, extras, the ``cuda-toolkit`` meta-package of torch
>= 2.11), reads only metadata (PEP 658 files or range requests, never a whole wheel; ``--no-build`` forbids sdists),
and needs no registry host name in this project: its default index is PyPI. It has timeouts (``UV_HTTP_TIMEOUT``
plus a per-run limit, both in compat.yaml ``refresh:``). The price is one uv run per question, run a few at a time.

What it derives beyond the default wheels, for the variants it can reach:
- the newest ``nvidia-nccl-cu12`` / ``-cu13`` release and the newest ``cuda-toolkit`` release of each CUDA minor in
  compat.yaml (the ``pypi_releases:`` section): the NCCL and CUDA updates PyPI has published, whatever torch pins;
- the NCCL pin of each non-default CUDA variant, when the PyTorch index answers (from here it does not: the refresh
  says so and keeps the committed variant entries).

Every uv run resolves at a fixed cut-off (``--exclude-newer``, compat.yaml ``review.date``), so a refresh shows
what changed up to the review date and nothing later: moving the date is the deliberate step that lets newer
releases in.

Never a silent rewrite: the command (:func:`shipyard.commands.registry.compat_refresh`) prints a unified diff of
compat.yaml and writes only with ``--write``. Facts it cannot read (NCCL linked statically, arches, nvidia/cuda
images, variants on the PyTorch index when that index is unreachable) keep their committed values and source marks;
a value it confirms keeps its mark, a value it changes or adds gets P (read off the metadata).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import difflib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from shipyard import facts as data
from shipyard.errors import ShipyardError
from shipyard.registry import compat

COMPAT_PATH = Path(__file__).resolve().parents[1] / "data" / "compat.yaml"
# wheel metadata name -> compat.yaml field
PIN_PACKAGES = {
    "nccl": re.compile(r"^nvidia-nccl(-cu\d+)?$"),
    "cudnn": re.compile(r"^nvidia-cudnn(-cu\d+)?$"),
    "cuda_runtime": re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$"),
    "triton": re.compile(r"^(pytorch-)?triton$"),
}
# field order on an entry's line; `<field>_source` follows its field
FIELD_ORDER = ("version", "nccl", "cudnn", "cuda_runtime", "triton", "python", "min_glibc", "torchvision", "torchaudio")
_VALUE = re.compile(r"^[0-9A-Za-z.+_-]+$")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", re.M)
COMPANIONS = ("torchvision", "torchaudio")


def settings() -> dict:
    return data.load("compat")["refresh"]


def cutoff() -> str:
    """The upload time no file read by a refresh may be newer than: the start of the review date (UTC)."""
    return f"{compat.review()['date']}T00:00:00Z"


# ------------------------------------------------------------------------------------------------------------ uv


@dataclass
class Uv:
    """Runs ``uv pip compile`` for one target; every run has uv's HTTP timeout and an end-to-end limit."""

    binary: str
    platform: str
    http_timeout_s: int
    command_timeout_s: int
    extra: tuple[str, ...] = ()
    runs: int = 0

    @classmethod
    def default(cls) -> "Uv":
        try:
            import uv  # lazy: only the refresh (and invoke lock) run uv
        except ImportError:  # pragma: no cover - uv is a declared dependency
            raise ShipyardError("the 'uv' Python package is not installed: pip install uv") from None
        s = settings()
        return cls(uv.find_uv_bin(), s["platform"], int(s["http_timeout_s"]), int(s["command_timeout_s"]),
                   ("--exclude-newer", cutoff()))

    def argv(self, python: str, no_deps: bool = False, platform: str | None = None) -> list[str]:
        argv = [self.binary, "pip", "compile", "-", "--no-config", "--no-header", "--quiet", "--no-build",
                "--no-python-downloads", "--python-platform", platform or self.platform, "--python-version", python]
        return argv + (["--no-deps"] if no_deps else []) + list(self.extra)

    def compile(self, reqs: list[str], python: str, no_deps: bool = False,
                platform: str | None = None) -> dict[str, str] | None:
        """name -> version of the resolution, or None when no resolution exists. Other failures raise."""
        env = {**os.environ, "UV_HTTP_TIMEOUT": str(self.http_timeout_s)}
        self.runs += 1
        with tempfile.TemporaryDirectory(prefix="shipyard-refresh-") as tmp:  # uv's cwd: no project files
            try:
                proc = subprocess.run(self.argv(python, no_deps, platform), input="\n".join(reqs) + "\n", text=True,
                                      capture_output=True, timeout=self.command_timeout_s, cwd=tmp, env=env)
            except subprocess.TimeoutExpired:
                raise ShipyardError(f"uv pip compile {' '.join(reqs)} took longer than {self.command_timeout_s} s "
                                    "(compat.yaml refresh.command_timeout_s)") from None
        if proc.returncode == 0:
            return {m[1].lower(): m[2] for m in _PIN.finditer(proc.stdout)}
        if "No solution found" in proc.stderr:
            return None
        detail = " ".join(ln.strip() for ln in proc.stderr.splitlines() if ln.strip())[:400]
        raise ShipyardError(f"uv pip compile {' '.join(reqs)} (Python {python}) failed: {detail or proc.returncode}")


# ------------------------------------------------------------------------------------------------------------ derive


@dataclass
class Derived:
    """What the metadata says: wheels[key][field] and companions[name][version]['python'], plus notes."""

    wheels: dict[str, dict] = field(default_factory=dict)
    companions: dict[str, dict[str, dict]] = field(default_factory=lambda: {c: {} for c in COMPANIONS})
    releases: dict[str, dict] = field(default_factory=dict)  # pypi_releases: requirement -> {version}
    notes: list[str] = field(default_factory=list)


def published_pythons(uv: Uv, req: str, candidates: list[str], pool) -> list[str]:
    """The candidate Pythons for which ``req`` has a wheel on the target platform (one --no-deps run each)."""
    ok = list(pool.map(lambda py: uv.compile([req], py, no_deps=True) is not None, candidates))
    return [py for py, good in zip(candidates, ok) if good]


def wheel_pins(resolution: dict[str, str]) -> dict[str, str]:
    """nccl/cudnn/cuda_runtime/triton versions out of a resolution of ``torch==X``."""
    out = {}
    for fld, pattern in PIN_PACKAGES.items():
        hits = [v for name, v in resolution.items() if pattern.match(name)]
        if hits:
            out[fld] = hits[0].split("+")[0]
    return out


def companion_for(uv: Uv, name: str, torch: str, next_torch: str | None, python: str,
                  next_python: str | None, committed: str | None = None) -> str | None:
    """The companion release of ``torch``.

    A committed companion whose metadata accepts torch==X stays (metadata cannot tell it from a later release that
    also accepts X: torchaudio >= 2.11 bounds torch from below instead of pinning it). Otherwise: the newest
    release that accepts torch==X but not the next torch release (``next_python``: a Python the next release has).
    """
    if committed and uv.compile([f"torch=={torch}", f"{name}=={committed}"], python) is not None:
        return committed
    excluded: list[str] = []
    for _ in range(4):  # releases that also accept the next torch; companions pin exactly, so this ends fast
        res = uv.compile([f"torch=={torch}", name] + [f"{name}!={v}" for v in excluded], python)
        if res is None or name not in res:
            return None
        ver = res[name].split("+")[0]
        if next_torch is None or next_python is None or \
                uv.compile([f"torch=={next_torch}", f"{name}=={ver}"], next_python) is None:
            return ver
        excluded.append(ver)
    return None


def derive(patches: list[str], uv: Uv | None = None, companions: bool = True,
           pythons: list[str] | None = None) -> Derived:
    """Read the metadata of the default-variant wheels of ``patches`` (and their companions) from PyPI.

    ``pythons``: the candidate Pythons to probe (default: compat.yaml refresh.pythons); tests pass fewer.
    """
    uv = uv or Uv.default()
    s = settings()
    candidates = list(pythons or s["pythons"])
    out = Derived()
    known = compat.known_torch_versions()
    with concurrent.futures.ThreadPoolExecutor(max_workers=int(s["jobs"])) as pool:
        for torch in patches:
            ts = compat.torch_series(torch)
            if ts is None or torch not in ts["patches"]:
                raise ShipyardError(f"--torch {torch}: not a torch release in compat.yaml "
                                    f"(known: {', '.join(known[-6:])}); add its series first")
            pys = published_pythons(uv, f"torch=={torch}", candidates, pool)
            if not pys:
                out.notes.append(f"torch {torch}: no wheel for any candidate Python on {uv.platform}; skipped")
                continue
            entry: dict = {"python": pys}
            res = uv.compile([f"torch=={torch}"], pys[-1])
            if res is None:
                out.notes.append(f"torch {torch}: the wheel's dependencies do not resolve on {uv.platform}")
            else:
                entry.update(wheel_pins(res))
                runtime = entry.get("cuda_runtime")
                if runtime and ".".join(runtime.split(".")[:2]) != ts["default_cuda"]:
                    out.notes.append(f"torch {torch}: the PyPI wheel brings CUDA runtime {runtime}, but compat.yaml "
                                     f"says its default variant is {ts['default_cuda']}: fix default_cuda by hand")
            old = uv.compile([f"torch=={torch}"], pys[-1], no_deps=True, platform=s["old_platform"])
            entry["min_glibc"] = "2.17" if old is not None else "2.28"
            if companions:
                later = [v for v in known if compat.vtuple(v) > compat.vtuple(torch)]
                nxt = min(later, key=compat.vtuple) if later else None
                nxt_pys = compat.wheel_fact(nxt, compat.torch_series(nxt)["default_cuda"], "python") if nxt else None
                for name in COMPANIONS:
                    ver = None
                    committed = compat.wheel_fact(torch, ts["default_cuda"], name)
                    for py in pys[:2]:  # companions drop the newest Pythons first: ask with the oldest
                        nxt_py = next((p for p in (nxt_pys or []) if compat.vtuple(p) >= compat.vtuple(py)), None)
                        ver = companion_for(uv, name, torch, nxt, py, nxt_py, committed)
                        if ver:
                            break
                    entry[name] = ver
                    if ver and ver not in out.companions[name]:
                        out.companions[name][ver] = {"python": published_pythons(
                            uv, f"{name}=={ver}", candidates, pool)}
            out.wheels[torch] = entry
    return out


def _on_index(uv: Uv, cuda: str, timeout_s: int | None = None) -> Uv:
    """``uv`` reading the PyTorch index of one CUDA variant instead of PyPI (same cut-off)."""
    return dataclasses.replace(uv, http_timeout_s=timeout_s or uv.http_timeout_s, runs=0,
                               extra=uv.extra + ("--default-index", compat.variant_index(cuda)))


def variant_coverage(uv: Uv, patches: list[str], derived: Derived | None = None) -> list[str]:
    """Refresh the NCCL pin of each non-default CUDA variant of ``patches`` when the PyTorch index answers (into
    ``derived``), and say which variants were covered; the index is probed once."""
    variants = sorted({(compat.series(p), v) for p in patches
                       for v in (compat.torch_series(p) or {}).get("cuda_variants") or []
                       if v != compat.torch_series(p)["default_cuda"]})
    if not variants:
        return []
    series_, cuda = variants[0]
    named = ", ".join(f"{s}+{compat.variant_tag(v)}" for s, v in variants)
    patch = next(p for p in patches if compat.series(p) == series_)
    try:
        _on_index(uv, cuda, min(uv.http_timeout_s, 10)).compile([f"torch=={patch}"], "3.10", no_deps=True)
    except ShipyardError as exc:
        return [f"the PyTorch index is unreachable from here ({str(exc)[-160:]}): the non-default variants "
                f"{named} were not refreshed; their committed facts and source marks stay"]
    if derived is None:
        return [f"the PyTorch index answers: the variants {named} were not asked for"]
    notes = []
    for s, cuda in variants:
        pins = {}
        for patch in (p for p in patches if compat.series(p) == s):
            pys = compat.wheel_fact(patch, cuda, "python") or ["3.12"]
            res = _on_index(uv, cuda).compile([f"torch=={patch}"], pys[-1])
            nccl = wheel_pins(res or {}).get("nccl")
            if nccl:
                pins[patch] = nccl
        if not pins:
            notes.append(f"torch {s}+{compat.variant_tag(cuda)}: no NCCL pin read off the PyTorch index")
        elif len(set(pins.values())) == 1:  # one pin for every patch read: the series entry
            derived.wheels[f"{s}+{compat.variant_tag(cuda)}"] = {"nccl": next(iter(pins.values()))}
        else:
            for patch, nccl in pins.items():
                derived.wheels[f"{patch}+{compat.variant_tag(cuda)}"] = {"nccl": nccl}
    return notes + [f"the PyTorch index answers: the NCCL pins of {named} were read off it"]


def release_requirements(committed: dict) -> list[str]:
    """What `pypi_releases:` records: each NCCL wheel of a CUDA major, and cuda-toolkit per CUDA 12/13 minor."""
    majors = sorted({int(m.split(".")[0]) for m in committed["cuda"]} & set(committed["cuda_image_policy"]
                                                                            ["supported_majors"]))
    minors = [m for m in sorted(committed["cuda"], key=compat.vtuple) if int(m.split(".")[0]) in majors]
    return [f"nvidia-nccl-cu{m}" for m in majors] + [f"cuda-toolkit=={m}.*" for m in minors]


def derive_releases(uv: Uv, committed: dict, derived: Derived) -> None:
    """The newest release of each of :func:`release_requirements` on PyPI at the cut-off (into ``derived``), and a
    note for each CUDA minor whose newest cuda-toolkit is newer than the nvidia/cuda image compat.yaml names."""
    reqs = release_requirements(committed)
    python = settings()["release_python"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=int(settings()["jobs"])) as pool:
        found = list(pool.map(lambda r: uv.compile([r], python, no_deps=True), reqs))
    for req, res in zip(reqs, found):
        name = req.split("==")[0]
        if not res or name not in res:
            derived.notes.append(f"{req}: no release on the index at the cut-off {cutoff()}; its entry stays")
            continue
        version = res[name].split("+")[0]
        derived.releases[req] = {"version": version}
        minor = req.partition("==")[2].removesuffix(".*")
        image = (committed["cuda"].get(minor) or {}).get("image") if minor else None
        if minor and (image is None or compat.vtuple(version) > compat.vtuple(image)):
            derived.notes.append(f"cuda-toolkit {version} is on PyPI; compat.yaml's nvidia/cuda image for CUDA "
                                 f"{minor} is {image or 'none'}: check NVIDIA's tags by hand (docs/facts.md)")


# ------------------------------------------------------------------------------------------------------------ merge


def merge_entry(old: dict | None, new: dict) -> dict:
    """Committed entry + derived facts. Confirmed values keep their mark; changed or new ones are marked P."""
    out = dict(old or {"source": "P"})
    for fld, value in new.items():
        if old is not None and fld in old and old[fld] == value:
            continue
        out[fld] = value
        if out.get("source") == "P":
            out.pop(f"{fld}_source", None)
        else:
            out[f"{fld}_source"] = "P"
    return out


def _scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, int) and not isinstance(v, bool):  # sm_* arches are numbers in the data
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, str) and v in ("P", "S", "I"):
        return v
    if not _VALUE.match(str(v)):  # versions and marks only: nothing else may reach the data file
        raise ShipyardError(f"compat refresh: refusing to write the value {v!r} (not a version)")
    return f'"{v}"'


def entry_line(key: str, entry: dict, indent: str) -> str:
    order = [k for f in FIELD_ORDER for k in (f, f"{f}_source")]
    keys = [k for k in order if k in entry] + [k for k in entry if k not in order and k != "source"]
    if "source" in entry:
        keys.append("source")
    body = ", ".join(f"{k}: {_scalar(entry[k])}" for k in keys)
    return f'{indent}"{key}": {{{body}}}'


def _sort_key(key: str):
    """The order of compat.yaml's keys: by the numbers as written ('2.7' and its '2.7+cu118' before '2.7.0'), so a
    refresh keeps the file's order (not a version comparison: '2.7' is a series here, not the release 2.7.0)."""
    head, _, variant = key.partition("+")
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.-]", head) if p != ""), variant


def render_sections(wheels: dict, companions: dict, releases: dict | None = None) -> dict[str, str]:
    """The text of the `wheels:`, `companions:` and `pypi_releases:` sections (one flow mapping per line)."""
    w = ["wheels:"] + [entry_line(k, wheels[k], "  ") for k in sorted(wheels, key=_sort_key)]
    r = ["pypi_releases:"] + [entry_line(k, (releases or {})[k], "  ") for k in (releases or {})]
    c = ["companions:"]
    for name in COMPANIONS:
        entries = companions.get(name) or {}
        if not entries:
            c.append(f"  {name}: {{}}")
            continue
        c.append(f"  {name}:")
        c += [entry_line(v, entries[v], "    ") for v in sorted(entries, key=compat.vtuple)]
    out = {"wheels": "\n".join(w) + "\n", "companions": "\n".join(c) + "\n"}
    if releases is not None:
        out["pypi_releases"] = "\n".join(r) + "\n"
    return out


def replace_section(text: str, name: str, new: str) -> str:
    """Swap the top-level ``name:`` block (up to the next line at column 0) for ``new``; comments above stay."""
    lines = text.splitlines(keepends=True)
    try:
        start = next(i for i, ln in enumerate(lines) if ln.rstrip("\n") == f"{name}:")
    except StopIteration:
        raise ShipyardError(f"{COMPAT_PATH}: no top-level '{name}:' section to refresh") from None
    end = start + 1
    while end < len(lines) and lines[end].startswith(" "):
        end += 1
    return "".join(lines[:start]) + new + "".join(lines[end:])


def refreshed_text(text: str, derived: Derived, committed: dict) -> str:
    wheels = {k: dict(v) for k, v in (committed.get("wheels") or {}).items()}
    for key, new in derived.wheels.items():
        wheels[key] = merge_entry(wheels.get(key), new)
    comps = {n: {k: dict(v) for k, v in (committed.get("companions") or {}).get(n, {}).items()} for n in COMPANIONS}
    for name, entries in derived.companions.items():
        for ver, new in entries.items():
            comps[name][ver] = merge_entry(comps[name].get(ver), new)
    releases = {k: dict(v) for k, v in (committed.get("pypi_releases") or {}).items()}
    for req, new in derived.releases.items():
        releases[req] = merge_entry(releases.get(req), new)
    sections = render_sections(wheels, comps, releases if "pypi_releases" in committed or releases else None)
    for name, body in sections.items():
        text = replace_section(text, name, body)
    return text


def diff(old: str, new: str, path: str = "shipyard/data/compat.yaml") -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"{path} (committed)", f"{path} (from package metadata)"))
