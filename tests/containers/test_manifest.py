"""Build manifest: absent -> empty, atomic merge, concurrent writers lose nothing, corrupt or of another schema ->
one-line error."""

import json
import multiprocessing

import pytest

from shipyard import project as paths
from shipyard.containers import manifest
from shipyard.errors import ShipyardError


def test_absent_manifest_reads_empty(tmp_path):
    assert manifest.read_manifest(tmp_path / "nope.json") == manifest.Manifest()


def test_update_merges_and_removes(tmp_path):
    p = tmp_path / "containers" / "e.json"
    manifest.update_manifest(p, environment="e", image={"tag": "x"})
    out = manifest.update_manifest(p, image=None, status="ok")
    assert out == manifest.Manifest(environment="e", status="ok")
    assert json.loads(p.read_text()) == {"schema": manifest.SCHEMA, "environment": "e", "status": "ok"}
    assert p.read_text().endswith("\n")
    # no temp files left beside it
    assert sorted(x.name for x in p.parent.iterdir()) == ["e.json", "e.json.lock"]


def test_manifest_path(tmp_path):
    class Reg:
        root = tmp_path

    assert paths.manifest_path(Reg, "pytorch-2.3") == tmp_path / "containers" / "pytorch-2.3.json"


def test_schema_field_is_written_and_checked(tmp_path):
    """The writer stamps the schema; a file without it reads as schema 1 (the layout before the field); another
    version is one error line naming both versions."""
    p = tmp_path / "e.json"
    manifest.update_manifest(p, status="ok")
    assert json.loads(p.read_text())["schema"] == manifest.SCHEMA == 2
    p.write_text(json.dumps({"status": "ok", "input_hash": "a" * 64}))
    assert manifest.read_manifest(p).input_hash == "a" * 64
    p.write_text(json.dumps({"schema": 1, "status": "ok", "input_hash": "b" * 64}))
    old = manifest.read_manifest(p)
    assert old.input_hash == "b" * 64 and old.contents_record is None
    p.write_text(json.dumps({"schema": 3, "status": "ok"}))
    with pytest.raises(ShipyardError, match="build manifest schema 3, this shipyard reads schemas 1, 2"):
        manifest.read_manifest(p)
    p.write_text(json.dumps({"schema": 2, "colour": "red"}))
    with pytest.raises(ShipyardError, match="unknown field 'colour'"):
        manifest.read_manifest(p)
    # schema 1 had no contents records: one that carries them was not written by a shipyard of schema 1
    p.write_text(json.dumps({"schema": 1, "contents": {"schema": 1}}))
    with pytest.raises(ShipyardError, match="unknown field 'contents'"):
        manifest.read_manifest(p)


def test_corrupt_manifest_is_user_error(tmp_path):
    p = tmp_path / "e.json"
    p.write_text("{not json")
    with pytest.raises(ShipyardError, match="corrupt build manifest"):
        manifest.read_manifest(p)


def _writer(path, i):
    """Each writer owns one field (as build, sign and push do) and grows it 20 times; the others must keep theirs."""
    field = ("signature", "pulled", "pins", "tools")[i]
    for j in range(20):
        current = getattr(manifest.read_manifest(path), field) or {}
        manifest.update_manifest(path, **{field: {**current, f"w{j}": j}})


def test_concurrent_writers_lose_no_field(tmp_path):
    p = tmp_path / "e.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(p), i)) for i in range(4)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
        assert pr.exitcode == 0
    m = manifest.read_manifest(p)
    assert [len(getattr(m, f)) for f in ("signature", "pulled", "pins", "tools")] == [20, 20, 20, 20]


def _normalized(m: manifest.Manifest) -> dict:
    """The manifest with values that differ per run (times, host, hashes of run-specific files) replaced."""
    out = m.to_dict()
    for k in ("started", "finished", "host", "input_hash", "spec_hash"):
        out[k] = f"<{k}>"
    out["log"] = "containers/logs/<env>-<utc time>.log" if out["log"].startswith("containers/logs/") else out["log"]
    out["tool_ids"] = {t: "<path>:<size>:<mtime_ns>" for t in out["tool_ids"]}
    out["artifacts"] = {fmt: dict(rec) for fmt, rec in out["artifacts"].items()}
    for rec in out["artifacts"].values():
        rec.update(sha256="<sha256>", mtime_ns="<mtime_ns>", size="<size>", ino="<ino>", ctime_ns="<ctime_ns>")
    labels = (out.get("contents") or {}).get("labels") or {}
    for key, value in (("org.label-schema.build-date", "<build date>"), ("org.shipyard.spec-sha256", "<spec_hash>")):
        if key in labels:
            labels[key] = value
    return out


@pytest.mark.real_apptainer
@pytest.mark.slow  # a real build; the quick loop keeps two (tests/containers/test_build_apptainer.py)
def test_build_manifest_golden(real_project, base_registry):
    """The manifest a real build writes, field by field (volatile values normalized; the mirror's address, which
    differs per run, as <mirror>)."""
    from helpers_registry import GOLDEN, golden

    from shipyard.containers import engine as build

    project = real_project
    m = build.build(project, project.environment("tiny"))
    assert m.spec_hash == project.environment("tiny").spec_hash and len(m.input_hash) == 64
    golden(GOLDEN / "build" / "manifest-apptainer.json",
           manifest.render(_normalized(m)).replace(base_registry.address, "<mirror>"))


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_cli_errors_are_one_line(project, tmp_path, invoke):
    for args, needle in ((["push", "tiny"], "never built"), (["pull", "tiny"], "no push of tiny"),
                         (["build", "tiny", "--wait"], "only apply with --slurm"),
                         (["build", "nope"], "unknown environment 'nope'")):
        res = invoke(*args, cwd=project.root, timeout=None)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert res.stderr.startswith("shipyard: error: ") and needle in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


GOOD_PUSH = {"reference": "oras://127.0.0.1:5000/shipyard/e:" + "a" * 12, "digest": "sha256:" + "b" * 64,
             "input_hash": "a" * 64}


@pytest.mark.parametrize(("fields", "key"), [
    ({"pushed": []}, "pushed is not a mapping"),
    ({"pushed": {"local": "x"}}, "pushed.local is not a mapping"),
    ({"pushed": {"local": {**GOOD_PUSH, "reference": 5}}}, "pushed.local.reference"),
    ({"pushed": {"local": {**GOOD_PUSH, "reference": "oras://h/r"}}}, "pushed.local.reference"),
    ({"pushed": {"local": {**GOOD_PUSH, "digest": ["x"]}}}, "pushed.local.digest"),
    ({"pushed": {"local": {**GOOD_PUSH, "input_hash": "../../x"}}}, "pushed.local.input_hash"),
    ({"input_hash": 5}, "input_hash is not 64"),
    ({"input_hash": ["a"]}, "input_hash is not 64"),
    ({"input_hash": "../x"}, "input_hash is not 64"),
    ({"status": {"a": 1}}, "status is not a string"),
    ({"pid": "1"}, "pid is not a whole number"),
    ({"formats": "sif"}, "formats is not a list"),
])
def test_a_field_of_another_type_is_one_line(tmp_path, fields, key):
    p = tmp_path / "e.json"
    p.write_text(json.dumps({"schema": 1, "environment": "e", **fields}))
    with pytest.raises(ShipyardError, match="corrupt build manifest") as exc:
        m = manifest.read_manifest(p)
        m.pushed_to("local").tag, m.input_hash[:12]  # where a wrong type used to end in a traceback
    assert key in str(exc.value) and "\n" not in str(exc.value)


def test_a_typed_push_record_reads_back(tmp_path):
    p = tmp_path / "e.json"
    manifest.update_manifest(p, pushed={"local": GOOD_PUSH}, input_hash="c" * 64)
    m = manifest.read_manifest(p)
    assert m.pushed_to("local").tag == "a" * 12 and m.input_hash == "c" * 64
