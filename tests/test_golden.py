"""Golden files certify nothing if the test writes them: golden() only compares, and `python -m tests.update_golden`
is the one way to see (and, with --accept, take) a new output."""

from __future__ import annotations

import helpers_registry
import pytest


def test_golden_never_writes_the_file_it_compares(tmp_path, monkeypatch):
    gold = tmp_path / "golden"
    (gold / "x").mkdir(parents=True)
    (gold / "x" / "a.txt").write_text("old\n")
    monkeypatch.setattr(helpers_registry, "GOLDEN", gold)
    monkeypatch.setenv(helpers_registry.ACTUAL_ENV, str(tmp_path / "actual"))
    monkeypatch.setenv("SHIPYARD_UPDATE_GOLDEN", "1")  # the old switch: no longer honoured
    with pytest.raises(AssertionError, match="update_golden"):
        helpers_registry.golden(gold / "x" / "a.txt", "new\n")
    assert (gold / "x" / "a.txt").read_text() == "old\n"
    assert (tmp_path / "actual" / "x" / "a.txt").read_text() == "new\n"
    with pytest.raises(AssertionError, match="missing golden file"):
        helpers_registry.golden(gold / "x" / "b.txt", "b\n")
    assert not (gold / "x" / "b.txt").exists()
    helpers_registry.golden(gold / "x" / "a.txt", "old\n")  # equal: passes


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_the_update_command_prints_the_diff_and_writes_only_with_accept(tmp_path, monkeypatch, capsys):
    import update_golden

    gold = tmp_path / "golden"
    gold.mkdir()
    (gold / "a.txt").write_text("old\n")
    test = tmp_path / "test_g.py"
    test.write_text("import os\nfrom pathlib import Path\n"
                    "def test_g():\n"
                    "    Path(os.environ['SHIPYARD_GOLDEN_ACTUAL'], 'a.txt').write_text('new\\n')\n"
                    "    assert False\n")
    monkeypatch.setattr(update_golden, "GOLDEN", gold)
    assert update_golden.main([str(test)]) == 1
    out = capsys.readouterr().out
    assert "-old\n+new\n" in out and "1 golden file(s) differ" in out
    assert (gold / "a.txt").read_text() == "old\n"
    assert update_golden.main(["--accept", str(test)]) == 0
    assert (gold / "a.txt").read_text() == "new\n"
