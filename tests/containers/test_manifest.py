"""Build manifest: absent -> {}, atomic merge, concurrent writers lose nothing, corrupt -> one-line error."""

import json
import multiprocessing

import pytest

from shipyard import project as paths
from shipyard.containers import manifest
from shipyard.errors import ShipyardError


def test_absent_manifest_reads_empty(tmp_path):
    assert manifest.read_manifest(tmp_path / "nope.json") == {}


def test_update_merges_and_removes(tmp_path):
    p = tmp_path / "containers" / "e.json"
    manifest.update_manifest(p, a=1, b={"x": 2})
    out = manifest.update_manifest(p, b=None, c="z")
    assert out == {"a": 1, "c": "z"}
    assert json.loads(p.read_text()) == {"a": 1, "c": "z"}
    assert p.read_text().endswith("\n")
    # no temp files left beside it
    assert sorted(x.name for x in p.parent.iterdir()) == ["e.json", "e.json.lock"]


def test_manifest_path(tmp_path):
    class Reg:
        root = tmp_path

    assert paths.manifest_path(Reg, "pytorch-2.3") == tmp_path / "containers" / "pytorch-2.3.json"


def test_corrupt_manifest_is_user_error(tmp_path):
    p = tmp_path / "e.json"
    p.write_text("{not json")
    with pytest.raises(ShipyardError, match="corrupt build manifest"):
        manifest.read_manifest(p)


def _writer(path, i):
    for j in range(20):
        manifest.update_manifest(path, **{f"w{i}_{j}": j})


def test_concurrent_writers_lose_no_field(tmp_path):
    p = tmp_path / "e.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(p), i)) for i in range(4)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
        assert pr.exitcode == 0
    data = manifest.read_manifest(p)
    assert len(data) == 80


def _normalized(m: dict) -> dict:
    """The manifest with values that differ per run (times, host, hashes of run-specific files) replaced."""
    out = json.loads(json.dumps(m))
    for k in ("started", "finished", "host", "input_hash", "spec_hash"):
        out[k] = f"<{k}>"
    out["log"] = "containers/logs/<env>-<utc time>.log" if out["log"].startswith("containers/logs/") else out["log"]
    out["tool_ids"] = {t: "<path>:<size>:<mtime_ns>" for t in out["tool_ids"]}
    for rec in out["artifacts"].values():
        rec.update(sha256="<sha256>", mtime_ns="<mtime_ns>", size="<size>")
    return out


@pytest.mark.double
def test_build_manifest_golden(project, apptainer_double):
    """The manifest a build writes, field by field (volatile values normalized)."""
    from helpers_registry import GOLDEN, golden

    from shipyard.containers import engine as build

    m = build.build(project, "tiny")
    assert m["spec_hash"] == project.environment("tiny").spec_hash and len(m["input_hash"]) == 64
    golden(GOLDEN / "build" / "manifest-apptainer.json", manifest.render(_normalized(m)))


def test_cli_errors_are_one_line(project, tmp_path, invoke):
    for args, needle in ((["push", "tiny"], "never built"), (["pull", "tiny"], "no push of tiny"),
                         (["build", "tiny", "--wait"], "only apply with --slurm"),
                         (["build", "nope"], "unknown environment 'nope'")):
        res = invoke(*args, cwd=project.root, timeout=None)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert res.stderr.startswith("shipyard: error: ") and needle in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
