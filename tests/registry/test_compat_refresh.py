"""`invoke compat.refresh`: the merge keeps source marks and never writes silently; against PyPI for real.

The `pypi` tests resolve real torch releases with uv (metadata only) and compare what PyPI says with the
committed compat.yaml: a stale or wrong fact there fails them. They need PyPI (CI has it) and take ~30 s.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import yaml

from shipyard.commands import compat as compat_commands
from shipyard.errors import ShipyardError
from shipyard.registry import compat, refresh

FEW = ["3.9", "3.10", "3.13", "3.14", "3.15"]  # candidate Pythons the PyPI tests probe (fewer uv runs)


def test_merge_keeps_marks_of_confirmed_facts_and_marks_changed_ones_p():
    old = {"nccl": "2.29.3", "cudnn": "9.1", "source": "S"}
    new = refresh.merge_entry(old, {"nccl": "2.29.3", "cudnn": "9.2", "triton": "3.7.0"})
    assert new == {"nccl": "2.29.3", "cudnn": "9.2", "cudnn_source": "P", "triton": "3.7.0", "triton_source": "P",
                   "source": "S"}
    assert refresh.merge_entry({"nccl": "1", "nccl_source": "I", "source": "P"}, {"nccl": "2"}) == \
        {"nccl": "2", "source": "P"}
    assert refresh.merge_entry(None, {"nccl": "2"}) == {"source": "P", "nccl": "2"}


def test_sections_are_replaced_in_place_and_the_rest_of_the_file_is_kept():
    text = compat.data.text("compat.yaml")
    committed = yaml.safe_load(text)
    derived = refresh.Derived(wheels={"2.10.0": {"triton": "9.9.9"}})
    new = refresh.refreshed_text(text, derived, committed)
    d = refresh.diff(text, new)
    assert d.count("\n-  ") == 1 and d.count("\n+  ") == 1 and 'triton: "9.9.9", triton_source: P' not in d
    assert '"2.10.0": {' in d and 'triton: "9.9.9"' in d
    assert yaml.safe_load(new) == {**committed, "wheels": {**committed["wheels"], "2.10.0": {
        **committed["wheels"]["2.10.0"], "triton": "9.9.9"}}}
    assert refresh.refreshed_text(text, refresh.Derived(), committed) == text  # nothing derived: no change


def test_refuses_to_write_a_value_that_is_not_a_version():
    with pytest.raises(ShipyardError, match="refusing to write"):
        refresh.entry_line("2.10.0", {"nccl": "2.27.5\nefa: {}"}, "  ")


@pytest.fixture(scope="module")
def pypi():
    """The metadata of two releases (the newest, whose companions came later, and one with cu12/cu13 variants)."""
    uv = refresh.Uv.default()
    return refresh.derive(["2.10.0", "2.15.0"], uv, pythons=FEW), uv


@pytest.mark.pypi
@pytest.mark.parametrize("torch", ["2.10.0", "2.15.0"])
def test_pypi_metadata_agrees_with_the_committed_wheel_facts(pypi, torch):
    derived, _ = pypi
    got = derived.wheels[torch]
    committed = compat.facts()["wheels"][torch]
    for fld in ("nccl", "cudnn", "cuda_runtime", "triton", "min_glibc", "torchvision", "torchaudio"):
        assert got.get(fld) == committed.get(fld), fld
    assert got["python"] == [p for p in committed["python"] if p in FEW]


@pytest.mark.pypi
def test_pypi_companion_pythons_agree_with_the_committed_ones(pypi):
    derived, _ = pypi
    for name, entries in derived.companions.items():
        for ver, got in entries.items():
            committed = compat.facts()["companions"][name][ver]["python"]
            assert got["python"] == [p for p in committed if p in FEW], (name, ver)


@pytest.mark.pypi
def test_pypi_refresh_command_shows_a_diff_and_writes_only_with_write(tmp_path, capsys):
    """A copy of compat.yaml with one wrong fact: the diff names it; the file changes only with --write."""
    path = tmp_path / "compat.yaml"
    shutil.copy(refresh.COMPAT_PATH, path)
    text = path.read_text().replace('"2.10.0": {nccl: "2.27.5"', '"2.10.0": {nccl: "2.27.1"')
    assert text != refresh.COMPAT_PATH.read_text()
    path.write_text(text)
    assert compat_commands.compat_refresh("2.10.0", companions=False, path=path) == 1
    out = capsys.readouterr().out
    assert '-  "2.10.0": {nccl: "2.27.1"' in out and '+  "2.10.0": {nccl: "2.27.5"' in out
    assert "NOT written" in out and path.read_text() == text
    assert "PyTorch index" in out  # the non-default variants are named as not refreshed (unreachable here)
    assert compat_commands.compat_refresh("2.10.0", companions=False, path=path, write=True) == 0
    assert path.read_text() == refresh.COMPAT_PATH.read_text()


def test_an_index_that_lists_nothing_is_not_agreement(tmp_path, monkeypatch, capsys):
    """An empty index (a mirror without torch, an offline cache): nothing was compared, so the refresh must not
    say that compat.yaml "agrees with the metadata"; one line, exit 2, the file unchanged. No network: uv reads an
    empty local index."""
    (tmp_path / "simple").mkdir()
    monkeypatch.setenv("UV_DEFAULT_INDEX", (tmp_path / "simple").as_uri())
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setattr(refresh, "variant_coverage", lambda *args: [])
    monkeypatch.setitem(refresh.settings(), "pythons", ["3.11"])
    path = tmp_path / "compat.yaml"
    path.write_text(refresh.COMPAT_PATH.read_text())
    with pytest.raises(ShipyardError) as ei:
        compat_commands.compat_refresh("2.10.0", companions=False, path=path)
    msg = str(ei.value)
    assert "listed no wheel" in msg and "nothing was compared" in msg and "\n" not in msg, msg
    assert "agrees" not in capsys.readouterr().out
    assert path.read_text() == refresh.COMPAT_PATH.read_text()


def test_arch_lists_stay_numbers_when_a_section_is_rewritten():
    """A variant's sm_* list is written back as numbers, as compat.py compares them."""
    assert refresh.entry_line("2.11+cu128", {"nccl": "2.28.9", "arches": [75, 80], "source": "P"}, "  ") == \
        '  "2.11+cu128": {nccl: "2.28.9", arches: [75, 80], source: P}'


@dataclasses.dataclass
class ScriptedUv(refresh.Uv):
    """A Uv whose answers are a table (index or "pypi", requirement) -> resolution: no network, no uv binary."""

    answers: dict = dataclasses.field(default_factory=dict)
    reachable: bool = True

    @classmethod
    def of(cls, answers: dict, reachable: bool = True) -> "ScriptedUv":
        return cls("uv", "x86_64-manylinux_2_28", 20, 120, ("--exclude-newer", refresh.cutoff()),
                   answers=answers, reachable=reachable)

    def compile(self, reqs, python, no_deps=False, platform=None):
        index = self.extra[-1] if "--default-index" in self.extra else "pypi"
        if index != "pypi" and not self.reachable:
            raise ShipyardError("uv pip compile: dns error")
        return self.answers.get((index, reqs[0]))


def test_every_refresh_run_resolves_at_the_review_date_cut_off():
    assert refresh.cutoff() == f"{compat.review()['date']}T00:00:00Z"
    uv = refresh.Uv.default()
    assert uv.argv("3.12")[-2:] == ["--exclude-newer", refresh.cutoff()]


def test_releases_are_the_nccl_wheels_and_cuda_toolkit_per_minor():
    reqs = refresh.release_requirements(compat.facts())
    assert reqs[:2] == ["nvidia-nccl-cu12", "nvidia-nccl-cu13"]
    assert "cuda-toolkit==13.4.*" in reqs and "cuda-toolkit==11.8.*" not in reqs  # CUDA 11 images are end-of-life


def test_a_newer_toolkit_than_the_image_is_a_note_and_the_release_a_diff():
    uv = ScriptedUv.of({("pypi", "nvidia-nccl-cu13"): {"nvidia-nccl-cu13": "2.33.1"},
                     ("pypi", "cuda-toolkit==13.4.*"): {"cuda-toolkit": "13.4.3"}})
    text = refresh.COMPAT_PATH.read_text()
    committed = yaml.safe_load(text)
    derived = refresh.Derived()
    refresh.derive_releases(uv, committed, derived)
    assert derived.releases == {"nvidia-nccl-cu13": {"version": "2.33.1"}, "cuda-toolkit==13.4.*": {"version": "13.4.3"}}
    assert ("cuda-toolkit 13.4.3 is on PyPI; compat.yaml's nvidia/cuda image for CUDA 13.4 is 13.4.2: check "
            "NVIDIA's tags by hand (docs/facts.md)") in derived.notes
    d = refresh.diff(text, refresh.refreshed_text(text, derived, committed))
    assert '+  "nvidia-nccl-cu13": {version: "2.33.1", source: P}' in d and d.count("\n+  ") == 1


def test_variant_nccl_pins_are_read_when_the_pytorch_index_answers():
    index = compat.variant_index("12.6")
    pins = {"torch": "2.14.1", "nvidia-nccl-cu12": "2.29.4"}
    uv = ScriptedUv.of({(index, "torch==2.14.1"): pins, (compat.variant_index("13.2"), "torch==2.14.1"): pins})
    derived = refresh.Derived()
    notes = refresh.variant_coverage(uv, ["2.14.1"], derived)
    assert derived.wheels["2.14+cu126"] == {"nccl": "2.29.4"} and "were read off it" in notes[-1]
    unreachable = refresh.Derived()
    (note,) = refresh.variant_coverage(ScriptedUv.of({}, reachable=False), ["2.14.1"], unreachable)
    assert "unreachable from here" in note and unreachable.wheels == {}


@pytest.mark.pypi
def test_pypi_releases_agree_with_the_committed_ones():
    derived = refresh.Derived()
    committed = compat.facts()
    refresh.derive_releases(refresh.Uv.default(), committed, derived)
    assert derived.releases == {k: {"version": v["version"]} for k, v in committed["pypi_releases"].items()}
