"""Property: the files another user, host or registry controls -- a sweep file, a stage record, a build manifest,
the shipped record of remote.sync -- read into their types or give one line (ShipyardError, or the record
reader's reason); never another exception. And a sweep file of plain cells reads back exactly as written."""

from __future__ import annotations

import json
import string
from pathlib import Path

from fuzz_budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError
from shipyard.launch import sweep as sweeps
from shipyard.remote import sync
from shipyard.staging import record as staged

EXAMPLES = examples(300)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
              st.text(max_size=70), st.sampled_from(["a" * 64, "sha256:" + "b" * 64, "oras://h/r:t", "0640"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12)

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
cells = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="\t"),
                min_size=1, max_size=12).filter(lambda c: c.isprintable())


@FUZZ
@given(data=st.data())
def test_a_sweep_file_of_plain_cells_reads_back_exactly(tmp_path, data):
    header = data.draw(st.lists(names, min_size=1, max_size=3, unique=True))
    rows = data.draw(st.lists(st.tuples(*[cells] * len(header)), min_size=1, max_size=5))
    ending = data.draw(st.sampled_from(["\n", "\r\n"]))
    f = tmp_path / "combos.tsv"
    f.write_bytes((ending.join("\t".join(r) for r in [tuple(header), *rows]) + ending).encode())
    sw = sweeps.parse_file(f)
    assert sw.names == tuple(header) and sw.rows == tuple(rows)


@FUZZ
@given(text=st.lists(st.sampled_from(list("ab#\t\n\r\v\f\x1c\x85\u2028 =,\"'") + ["lr", "seed"]),
                     max_size=40).map("".join))
def test_any_sweep_file_is_a_sweep_or_one_line(tmp_path, text):
    f = tmp_path / "combos.tsv"
    f.write_text(text, encoding="utf-8", newline="")
    try:
        sw = sweeps.parse_file(f)
    except ShipyardError as exc:
        assert "\n" not in str(exc)
        return
    assert all(v.isprintable() and "\t" not in v and v for row in sw.rows for v in row)
    assert all(len(r) == len(sw.names) for r in sw.rows)


def _good_record() -> dict:
    return {"sha256": "a" * 64, "input_hash": "b" * 64, "size": 1, "mtime_ns": 2, "ino": 3, "ctime_ns": 4,
            "schema": staged.SCHEMA, "source": {"kind": "containers", "reference": "containers/e.sif"},
            "spec_sha256": None, "pushed_digest": None}


@FUZZ
@given(key=st.sampled_from(sorted(_good_record()) + ["forced_checks", "mode", "environment"]), value=json_values)
def test_a_stage_record_with_any_field_value_is_a_record_or_one_line(tmp_path, key, value):
    image = tmp_path / "e.sif"
    data = {**_good_record(), key: value}
    staged.record_path(image).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    rec, why = staged.read_record(image)
    if rec is None:
        assert why and "\n" not in why
    else:
        rec.source_kind, rec.source_reference, rec.stamp, rec.to_dict()  # every accessor works on what was read
    rec, why = staged.job_check(image, content=False)
    assert rec is None and "\n" not in why  # no image there: never accepted


@FUZZ
@given(key=st.sampled_from(["pushed", "input_hash", "status", "artifacts", "image", "signature", "pulled", "pid",
                            "formats", "spec_hash", "environment"]),
       value=st.one_of(json_values, st.fixed_dictionaries({"signers": json_values}),
                       st.fixed_dictionaries({"tag": json_values, "id": json_values})))
def test_a_manifest_with_any_field_value_is_a_manifest_or_one_line(tmp_path, key, value):
    p = tmp_path / "e.json"
    p.write_text(json.dumps({"schema": 1, "status": "ok", key: value}))
    try:
        m = mf.read_manifest(p)
    except ShipyardError as exc:
        assert "\n" not in str(exc)
        return
    for name in (m.pushed or {}):
        pushed = m.pushed_to(name)
        assert pushed.tag and "/" not in pushed.tag
    m.pushed_digests, m.artifact("sif"), m.built, m.signers
    assert m.docker_tag is None or isinstance(m.docker_tag, str)
    assert m.input_hash is None or mf.is_input_hash(m.input_hash)


@FUZZ
@given(body=st.one_of(st.binary(max_size=80), json_values.map(lambda v: json.dumps(v).encode())))
def test_the_shipped_record_is_a_mapping_or_none(tmp_path, body):
    assert isinstance(sync.shipped_record(body), dict)
    (tmp_path / ".shipyard-shipped.json").write_bytes(body)
    commit, dirty = sync.code_identity(tmp_path)
    assert (commit, dirty) == ("unknown", None) or (set(commit) <= set(string.hexdigits.lower())
                                                     and isinstance(dirty, bool))
