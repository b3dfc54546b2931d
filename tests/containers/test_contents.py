"""The contents record: the probe's parsers against real outputs (tests/data/contents/README.md says where each came
from), the record's round trip through the build manifest, and the text of `invoke show ENV --contents` and
`invoke diff ENV`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_registry import GOLDEN, golden

from shipyard.containers import contents, manifest
from shipyard.errors import ShipyardError

DATA = Path(__file__).resolve().parents[1] / "data" / "contents"
PROBE = (DATA / "probe-debian12-host.txt").read_text()
# The shape of Apptainer's /.singularity.d/labels.json (the labels it adds to every SIF, then the %labels ones).
SIF_LABELS = {"org.label-schema.build-arch": "amd64", "org.label-schema.schema-version": "1.0",
              "org.shipyard.environment": "tiny"}


def section(text: str, name: str) -> str:
    """One section of a probe output, as the parser cuts it."""
    lines = text.splitlines()
    start = lines.index(f"{contents.MARK} {name}") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(contents.MARK))
    return "\n".join(lines[start:end])


def with_sections(text: str, **replace: str) -> str:
    """The probe output with some sections' bodies replaced (as an image with a venv and labels would print)."""
    out = []
    for name in (*contents.SECTIONS, "end"):
        out.append(f"{contents.MARK} {name}")
        if name != "end":
            out.append(replace.get(name, section(text, name)))
    return "\n".join(out) + "\n"


def test_pip_list_json_of_a_real_venv():
    pkgs = contents.parse_pip_list((DATA / "pip-list.json").read_text())
    raw = json.loads((DATA / "pip-list.json").read_text())
    assert len(pkgs) == len(raw) == 93
    assert pkgs["pyyaml"] == next(p["version"] for p in raw if p["name"] == "PyYAML")  # PEP 503 name
    assert all(k == k.lower() and "_" not in k for k in pkgs)


def test_dpkg_query_of_a_real_debian():
    apt = contents.parse_dpkg(section(PROBE, "apt"))
    assert len(apt) == 790
    assert apt["automake"] == "1:1.16.5-1.3"  # the epoch is part of the version
    assert apt["binutils-common:amd64"] == "2.40-2"  # multi-arch packages keep their architecture
    assert contents.parse_dpkg("adduser\t3.134\nold-pkg\t\n") == {"adduser": "3.134"}  # config-files only: not in


def test_the_probe_output_of_a_real_machine():
    rec = contents.parse_probe(PROBE, "sh")
    assert rec.python == {} and rec.labels == {}
    assert rec.libraries == {"/usr/local/cuda-13.0/lib/libcudart.so.13": "13"}
    assert len(rec.apt) == 790


def test_an_image_with_a_venv_and_labels():
    text = with_sections(PROBE, python=(DATA / "pip-list.json").read_text(), labels=json.dumps(SIF_LABELS))
    rec = contents.parse_probe(text, "apptainer exec")
    assert len(rec.python) == 93 and rec.labels == SIF_LABELS and rec.probed == "apptainer exec"
    docker = contents.parse_probe(text, "docker run", labels={"org.shipyard.environment": "tiny"})
    assert docker.labels == {"org.shipyard.environment": "tiny"}  # the engine's labels, not a file inside


@pytest.mark.parametrize("cut", ["libraries", "end"])
def test_a_probe_cut_short_is_refused(cut):
    text = PROBE[:PROBE.index(f"{contents.MARK} {cut}")]
    with pytest.raises(ShipyardError, match=f"no {cut} section"):
        contents.parse_probe(text, "sh")


def test_garbage_from_the_image_is_one_line():
    with pytest.raises(ShipyardError, match="pip list: not pip's JSON"):
        contents.parse_probe(with_sections(PROBE, python="WARNING: pip is old\n[]"), "sh")
    with pytest.raises(ShipyardError, match="an entry without a name and version"):
        contents.parse_pip_list('[{"name": "x"}]')
    with pytest.raises(ShipyardError, match="not a JSON object of labels"):
        contents.parse_labels("[1, 2]")


def sample(**over) -> contents.Contents:
    base = dict(python={"torch": "2.3.1", "numpy": "1.26.4", "filelock": "3.13.1"},
                apt={"libc6:amd64": "2.35-0ubuntu3.8", "curl": "7.81.0-1ubuntu1.16"},
                libraries={"/usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudart.so.12.1.105": "12.1.105",
                           "/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2": "2"},
                labels={"org.shipyard.environment": "tiny", "org.label-schema.build-date": "2026-12-01"},
                probed="apptainer exec")
    base.update(over)
    return contents.Contents(**base)


def test_record_round_trip_through_the_manifest(tmp_path):
    p = tmp_path / "e.json"
    rec, before = sample(), sample(python={"torch": "2.3.1"})
    manifest.update_manifest(p, status="ok", contents=rec.to_dict(), previous_contents=before.to_dict())
    m = manifest.read_manifest(p)
    assert m.contents_record == rec and m.previous_contents_record == before
    assert json.loads(p.read_text())["contents"]["schema"] == contents.SCHEMA


def test_a_record_of_another_version_or_shape_is_refused(tmp_path):
    p = tmp_path / "e.json"
    p.write_text(json.dumps({"schema": 2, "contents": {**sample().to_dict(), "schema": 9}}))
    with pytest.raises(ShipyardError, match="contents record schema 9, this shipyard reads schema 1"):
        manifest.read_manifest(p)
    p.write_text(json.dumps({"schema": 2, "contents": {**sample().to_dict(), "python": {"torch": 2}}}))
    with pytest.raises(ShipyardError, match="python must map names to version strings"):
        manifest.read_manifest(p)


def test_show_contents_text_golden():
    golden(GOLDEN / "contents" / "show.txt", contents.render(sample(), "tiny: the image built 2026-12-01T10:00:00Z"))


def test_diff_text_golden():
    new = sample(python={"torch": "2.3.1", "numpy": "2.0.0", "requests": "2.32.3"},
                 apt={"libc6:amd64": "2.35-0ubuntu3.9", "curl": "7.81.0-1ubuntu1.16"},
                 labels={"org.shipyard.environment": "tiny", "org.label-schema.build-date": "2026-12-07"})
    changes = contents.diff(sample(), new)
    assert {(c.section, c.name) for c in changes} == {
        ("python", "numpy"), ("python", "requests"), ("python", "filelock"), ("apt", "libc6:amd64"),
        ("labels", "org.label-schema.build-date")}
    golden(GOLDEN / "contents" / "diff.txt", contents.render_diff(changes, "tiny: version 1", "tiny: version 2"))
    assert contents.diff(sample(), sample()) == []
