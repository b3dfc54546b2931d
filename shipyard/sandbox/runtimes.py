"""Real enroot + pyxis in the sandbox: build them from upstream source archives, install enroot where Slurm's epilog
finds it, load the real pyxis through the sandbox's plugstack, and undo exactly that on ``sandbox.down``.

* Sources are never part of the project: the archives come from a folder (``../shared/vendor`` or ``--sources``) and
  must match the sha256 in shipyard/data/sandbox.yaml.
* Builds are cached under ``runtimes.cache`` by the archives' sha256, the Slurm version the daemons run (pyxis must
  be compiled against it) and the build flags; a build runs in a temporary folder renamed into place when complete.
* Install: enroot's files (``make install`` into a staging tree) are copied under /usr and /etc. A file that is
  already there and not ours is never overwritten (refused). What was written is recorded machine-wide (the files
  are machine-wide: ``runtimes.record`` in sandbox.yaml, path + sha256, folders created, and which sandbox it serves),
  and :func:`uninstall` removes exactly those, and a file only while its content is still the one written. The
  record outlives a sandbox folder that was deleted or a sandbox that died, so such a leftover is taken over (or
  removed) by the next sandbox, never mistaken for someone else's enroot; one that serves a running sandbox is
  refused.
* Per node: inside each node's mount namespace one fixed path (``runtimes.node_local`` in sandbox.yaml) is
  ``<sandbox>/nodes/<node>`` (the holder binds it, see :mod:`shipyard.sandbox.start`), so enroot's runtime/data/cache
  paths and pyxis's runtime_path are one text but a different folder on every node of every sandbox. The path names
  no sandbox, so the files installed are the same for every sandbox: sandboxes share one install, each listed as a
  holder, and the last one's ``sandbox.down`` removes it. enroot has to be under /usr: pyxis runs it from Slurm's
  epilog with ``execvpe`` and no PATH, which finds only /bin and /usr/bin.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from shipyard.errors import ShipyardError
from shipyard.files import atomic_write
from shipyard.sandbox.plan import facts

_SAFE_PATH = re.compile(r"^/[A-Za-z0-9/._+-]*$")  # enroot evaluates its config values with `eval echo`


def runtime_facts() -> dict:
    return facts()["runtimes"]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ sources, key


@dataclass(frozen=True)
class Sources:
    enroot: Path
    pyxis: Path


def missing_sources_reason(directory: Path) -> str | None:
    """Why ``directory`` cannot provide the runtimes' sources (one line), or None."""
    f = runtime_facts()
    for name in ("enroot", "pyxis", "apptainer"):
        p = Path(directory) / f[name]["archive"]
        if not p.is_file():
            return f"{p} is missing (enroot {f['enroot']['version']} and pyxis {f['pyxis']['version']} source " \
                   f"archives, Apptainer {f['apptainer']['version']}'s binary build; see shipyard/data/sandbox.yaml " \
                   "runtimes)"
    return None


SOURCES_ENV = "SHIPYARD_RUNTIME_SOURCES"  # the tests' source folder, instead of ../shared/vendor
REAL_RUNTIME_TESTS = "tests/sandbox/test_real_runtimes.py"


def test_sources(checkout) -> Path:
    """Where the tests take the sources from: ``$SHIPYARD_RUNTIME_SOURCES``, else ``runtimes.sources`` beside the
    checkout."""
    env = os.environ.get(SOURCES_ENV)
    return Path(env) if env else (Path(checkout) / runtime_facts()["sources"]).resolve()


def tests_left_out_line(checkout) -> str | None:
    """One line naming the real-runtime tests that cannot run and how to provide the sources; None when they can."""
    d = test_sources(checkout)
    why = missing_sources_reason(d) if d.is_dir() else f"{d} does not exist"
    if why is None:
        return None
    return (f"real enroot+pyxis tests ({REAL_RUNTIME_TESTS}) left out: {why}; put the archives named in "
            f"shipyard/data/sandbox.yaml runtimes in ../shared/vendor or set ${SOURCES_ENV}=DIR")


def find_sources(directory, flag: str = "--sources") -> Sources:
    """The two archives in ``directory``, checked against their sha256; one error line otherwise."""
    d = Path(directory)
    if not d.is_dir():
        raise ShipyardError(f"{flag} {d}: not a folder (it must hold {runtime_facts()['enroot']['archive']} and "
                            f"{runtime_facts()['pyxis']['archive']})")
    why = missing_sources_reason(d)
    if why:
        raise ShipyardError(f"{flag}: {why}")
    f = runtime_facts()
    out = {}
    for name in ("enroot", "pyxis"):
        p = d / f[name]["archive"]
        got = sha256_file(p)
        if got != f[name]["sha256"]:
            raise ShipyardError(f"{flag}: {p} has sha256 {got}, expected {f[name]['sha256']} "
                                "(shipyard/data/sandbox.yaml runtimes)")
        out[name] = p
    return Sources(**out)


def slurm_version() -> str:
    """The Slurm release the sandbox's daemons run (``slurmd -V``), e.g. ``22.05.8``."""
    try:
        res = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShipyardError(f"sandbox.runtimes: slurmd -V failed ({exc}); run invoke sandbox.up first") from None
    m = re.search(r"(\d+\.\d+\.\d+)", res.stdout)
    if not m:
        raise ShipyardError(f"sandbox.runtimes: cannot read the Slurm version from slurmd -V: {res.stdout.strip()!r}")
    return m.group(1)


def missing_build_tools() -> list[str]:
    """Debian packages missing for the build and for enroot at run time."""
    f = runtime_facts()
    pkgs = {pkg for binary, pkg in f["packages"].items() if shutil.which(binary) is None}
    pkgs |= {pkg for path, pkg in f["headers"].items() if not Path(path).exists()}
    return sorted(pkgs)


def ensure_build_tools(install: bool = True) -> None:
    missing = missing_build_tools()
    if not missing:
        return
    if not install:
        raise ShipyardError(f"sandbox.runtimes: missing packages {' '.join(missing)} (apt-get install -y "
                            f"{' '.join(missing)}; or run without --no-install)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    for attempt in (0, 1):
        if attempt:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=300)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if res.returncode == 0:
            break
    still = missing_build_tools()
    if still:
        raise ShipyardError(f"sandbox.runtimes: apt-get install {' '.join(still)} failed")


def build_key(sources: Sources, slurm: str) -> str:
    """The cache key: both archives' sha256, the Slurm version and the build facts."""
    f = runtime_facts()
    h = hashlib.sha256()
    for part in (f["enroot"]["sha256"], f["pyxis"]["sha256"], slurm,
                 json.dumps([f["enroot"]["make_args"], f["enroot"]["prefix"], f["enroot"]["sysconfdir"]])):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ build


def _run(argv, cwd: Path, what: str, timeout: float) -> None:
    try:
        res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ShipyardError(f"sandbox.runtimes: {what} took more than {timeout:.0f} s") from None
    if res.returncode != 0:
        last = [x for x in (res.stderr + res.stdout).splitlines() if x.strip()][-3:]
        raise ShipyardError(f"sandbox.runtimes: {what} failed (exit {res.returncode}): {' | '.join(last)}")


def _extract(archive: Path, dest: Path) -> Path:
    """Unpack a source archive (regular files and folders only, no path outside ``dest``); its top folder."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise ShipyardError(f"sandbox.runtimes: {archive} does not unpack to one folder")
    return tops[0]


def build(sources: Sources, slurm: str, cache=None) -> tuple[Path, bool]:
    """Build enroot (glibc, staged ``make install``) and pyxis (against this machine's Slurm headers) into
    ``<cache>/<key>``; reuse it when present. Returns (folder, built_now)."""
    f = runtime_facts()
    cache = Path(cache or f["cache"])
    out = cache / build_key(sources, slurm)
    if (out / "build.json").is_file() and not out.is_symlink():
        return out, False
    cache.mkdir(parents=True, exist_ok=True)
    timeout = float(f["timeouts"]["build_s"])
    with tempfile.TemporaryDirectory(prefix=".build-", dir=cache) as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        (src / "enroot").mkdir(parents=True)
        (src / "pyxis").mkdir()
        e = _extract(sources.enroot, src / "enroot")
        for stamp in f["enroot"]["stamps"]:
            (e / stamp).parent.mkdir(parents=True, exist_ok=True)
            (e / stamp).touch()
        mk = e / "deps" / "dist" / "makeself" / "bin"
        mk.mkdir(parents=True, exist_ok=True)
        shutil.copy2(shutil.which("makeself") or "/usr/bin/makeself", mk / "enroot-makeself")
        (e / "deps" / "dist" / "linux" / "include").mkdir(parents=True, exist_ok=True)
        _run(["make", "-C", "deps", "FORCE_GLIBC=1"], e, "enroot deps (make -C deps)", timeout)
        make = ["make", *f["enroot"]["make_args"], f"prefix={f['enroot']['prefix']}",
                f"sysconfdir={f['enroot']['sysconfdir']}"]
        _run(make, e, "enroot make", timeout)
        stage = tmp / "out" / "enroot-root"
        _run([*make, f"DESTDIR={stage}", "install"], e, "enroot make install", timeout)
        p = _extract(sources.pyxis, src / "pyxis")
        _run(["make"], p, "pyxis make (against /usr/include/slurm)", timeout)
        shutil.copy2(p / f["pyxis"]["library"], tmp / "out" / f["pyxis"]["library"])
        atomic_write(tmp / "out" / "build.json", json.dumps({
            "enroot": f["enroot"]["version"], "pyxis": f["pyxis"]["version"], "slurm": slurm,
            "enroot_sha256": f["enroot"]["sha256"], "pyxis_sha256": f["pyxis"]["sha256"]}, indent=2) + "\n")
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(out)  # a half-written folder without build.json
        os.rename(tmp / "out", out)
    for d in [out, *[p for p in out.rglob("*") if p.is_dir()]]:
        d.chmod(0o755)  # slurmd/slurmstepd and every user read the plugin
    return out, True


# ------------------------------------------------------------------------------------------------ install


def _record_path(prefix_root: Path = Path("/")) -> Path:
    return Path(prefix_root) / runtime_facts()["record"].lstrip("/")


def read_json_record(p: Path) -> dict | None:
    """A machine-wide record of shipyard's (a JSON object), or None when there is none, it is unreadable, or a
    symlink stands there (shipyard never writes one)."""
    if p.is_symlink():
        return None
    try:
        rec = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def read_record(prefix_root: Path = Path("/")) -> dict | None:
    """The machine-wide install record, or None when shipyard installed nothing (or it is unreadable)."""
    return read_json_record(_record_path(prefix_root))


def holders(rec: dict | None) -> list[str]:
    """The sandbox folders an install record lists as holding it."""
    return list((rec or {}).get("holders", []))


def installed_for(root, prefix_root: Path = Path("/")) -> bool:
    """Whether the sandbox in ``root`` holds the machine's enroot install."""
    return str(Path(root)) in holders(read_record(prefix_root))


def node_local(root: Path | None = None) -> Path:
    """The one path that is each node's own folder inside the node (the same for every sandbox)."""
    return Path(runtime_facts()["node_local"])


def node_dir(root: Path, node: str) -> Path:
    return Path(root) / runtime_facts()["nodes_dir"] / node


def _dropin_text() -> str:
    nl = node_local()
    if not _SAFE_PATH.match(str(nl)):
        raise ShipyardError(f"sandbox.yaml runtimes.node_local {nl}: enroot's config evaluates its paths in a shell; "
                            "use a folder path of letters, digits and / . _ + - only")
    return ("# Written by shipyard's `invoke sandbox.runtimes`; the last sandbox's `invoke sandbox.down` removes it.\n"
            f"# {nl} is a different folder on every sandbox node (a bind mount per node).\n"
            f"ENROOT_RUNTIME_PATH {nl}/enroot/runtime\n"
            f"ENROOT_CACHE_PATH {nl}/enroot/cache\n"
            f"ENROOT_DATA_PATH {nl}/enroot/data\n")


def plugstack_entry(build_dir: Path, root: Path) -> tuple[Path, list[str]]:
    """The real pyxis's plugstack line: its library and arguments (runtime_path node-local, container_scope)."""
    f = runtime_facts()["pyxis"]
    return build_dir / f["library"], [f"runtime_path={node_local()}/pyxis",
                                      f"container_scope={f['container_scope']}"]


def install(build_dir: Path, root, nodes: list[str], prefix_root: Path = Path("/"),
            running=lambda directory: False) -> dict:
    """Copy the staged enroot tree under ``prefix_root`` (/), write the drop-in, create each node's folders.

    Sandboxes share the install: the sandbox in ``root`` joins the holders of one made from the same build. One from
    another build (another Slurm version or enroot) is replaced when no sandbox that holds it still runs
    (``running(folder)``: a sandbox that died or whose folder is gone), and refused while one does. Records what it
    writes as it goes (so a failure half-way is still undone by :func:`uninstall`). Returns the record."""
    root = Path(root)
    f = runtime_facts()
    old = read_record(prefix_root) or {}
    live = [h for h in holders(old) if h != str(root) and running(Path(h))]
    if live and old.get("build") != str(build_dir):
        raise ShipyardError(f"sandbox.runtimes: another enroot build ({old.get('build')}) is installed for the "
                            f"running sandbox in {live[0]}; stop it first (shipyard sandbox.down --directory "
                            f"{live[0]}); nothing was changed")
    ours = {e["path"]: e["sha256"] for e in old.get("files", [])}
    record = {"holders": [*live, str(root)], "build": str(build_dir), "files": list(old.get("files", [])),
              "dirs": list(old.get("dirs", []))}
    stage = build_dir / "enroot-root"
    wanted = [(p, prefix_root / p.relative_to(stage)) for p in sorted(stage.rglob("*"))]
    dropin = prefix_root / f["enroot"]["dropin"].lstrip("/")
    # refuse before writing anything: a file already there that is not ours, or a symlink on the way
    for src, dst in [*wanted, (None, dropin)]:
        if dst.is_symlink():
            raise ShipyardError(f"sandbox.runtimes: {dst} is a symlink; not following it (nothing was changed)")
        if (src is None or src.is_file()) and dst.exists() and str(dst) not in ours:
            raise ShipyardError(f"sandbox.runtimes: {dst} exists and was not installed by shipyard; remove the "
                                "other enroot installation first (nothing was changed)")

    def save():
        atomic_write(_record_path(prefix_root), json.dumps(record, indent=2) + "\n")

    def ensure_dir(d: Path):
        missing = []
        while not d.exists():
            if d.is_symlink():
                raise ShipyardError(f"sandbox.runtimes: {d} is a dangling symlink; not following it")
            missing.append(d)
            d = d.parent
        for m in reversed(missing):
            m.mkdir(mode=0o755)
            record["dirs"].append(str(m))
        save()

    if _record_path(prefix_root).is_symlink():
        raise ShipyardError(f"sandbox.runtimes: {_record_path(prefix_root)} is a symlink; not following it "
                            "(nothing was changed)")
    ensure_dir(_record_path(prefix_root).parent)

    def put(dst: Path, data: bytes, mode: int):
        ensure_dir(dst.parent)
        digest = hashlib.sha256(data).hexdigest()
        if ours.get(str(dst)) == digest and dst.is_file() and sha256_file(dst) == digest:
            return  # a holder's file, unchanged: a step of another sandbox may be running it
        if str(dst) not in ours:
            record["files"].append({"path": str(dst), "sha256": digest})
        else:
            for e in record["files"]:
                if e["path"] == str(dst):
                    e["sha256"] = digest
        save()  # recorded before written: a crash leaves the record naming it
        atomic_write(dst, data, mode)

    for src, dst in wanted:
        if src.is_dir():
            ensure_dir(dst)
        else:
            put(dst, src.read_bytes(), src.stat().st_mode & 0o7777)
    put(dropin, _dropin_text().encode(), 0o644)
    for node in nodes:
        for sub in ("pyxis", "enroot/runtime", "enroot/data", "enroot/cache"):
            (node_dir(root, node) / sub).mkdir(parents=True, exist_ok=True)
    save()
    return record


def uninstall(root, prefix_root: Path = Path("/"), running=lambda directory: False) -> list[str]:
    """The sandbox in ``root`` lets go of the install; when no other holder still runs (``running(folder)``), remove
    exactly what :func:`install` recorded: each file while its sha256 is still ours, then the folders it created,
    when empty. Returns a line per thing left in place (changed since)."""
    record = read_record(prefix_root)
    if record is None or str(Path(root)) not in holders(record):
        return []
    others = [h for h in holders(record) if h != str(Path(root)) and running(Path(h))]
    if others:
        record["holders"] = others
        atomic_write(_record_path(prefix_root), json.dumps(record, indent=2) + "\n")
        return []
    kept = []
    for e in reversed(record.get("files", [])):
        p = Path(e["path"])
        if p.is_symlink() or not p.is_file():
            continue
        if sha256_file(p) != e["sha256"]:
            kept.append(f"{p} (changed since sandbox.runtimes wrote it)")
            continue
        p.unlink()
    _record_path(prefix_root).unlink()
    for d in sorted(record.get("dirs", []), key=len, reverse=True):
        with contextlib.suppress(OSError):
            Path(d).rmdir()
    return kept
