"""tests/handoff.py (a file one run of `invoke test` makes for another) and tests/run_order.py (a module's place in its
run): the giver makes the file only when a taker wants it, the taker gets it whole or makes its own, a giver's
failure reaches the taker, and a run says what it will give and take from what it collected."""

from __future__ import annotations

import handoff
import pytest

NAME = "image.tar"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    where = tmp_path / "handoff"
    where.mkdir()
    monkeypatch.setenv(handoff.HANDOFF_ENV, str(where))
    return where


def _write(text):
    return lambda path: path.write_text(text)


def test_without_the_folder_nothing_is_given_or_taken(monkeypatch):
    monkeypatch.delenv(handoff.HANDOFF_ENV, raising=False)
    assert handoff.give(NAME, _write("x")) is None
    assert handoff.take(NAME, 60) is None


def test_a_wanted_file_is_made_once_and_taken_whole(folder):
    (folder / f"{NAME}.promised").touch()
    (folder / f"{NAME}.wanted").touch()
    made = handoff.give(NAME, _write("the image"))
    assert made == folder / NAME and made.read_text() == "the image"
    assert not list(folder.glob(".*.part"))
    assert handoff.take(NAME, 0) == made


def test_nobody_wants_it_so_nothing_is_made_and_a_late_taker_does_not_wait(folder):
    (folder / f"{NAME}.promised").touch()
    calls = []
    assert handoff.give(NAME, calls.append) is None
    assert calls == [] and (folder / f"{NAME}.declined").exists()
    assert handoff.take(NAME, 3600, sleep=pytest.fail) is None


def test_no_promise_means_the_taker_makes_its_own_at_once(folder):
    (folder / f"{NAME}.wanted").touch()
    assert handoff.take(NAME, 3600, sleep=pytest.fail) is None


def test_the_givers_failure_fails_the_taker_with_its_reason(folder):
    (folder / f"{NAME}.promised").touch()
    (folder / f"{NAME}.wanted").touch()

    def broken(path):
        path.write_text("half")
        raise RuntimeError("docker build: step 9 exited 2")

    with pytest.raises(RuntimeError):
        handoff.give(NAME, broken)
    assert not (folder / NAME).exists()
    with pytest.raises(pytest.fail.Exception, match="step 9 exited 2"):
        handoff.take(NAME, 60)


def test_a_promise_not_kept_by_the_deadline_lets_the_taker_make_its_own(folder, capsys):
    (folder / f"{NAME}.promised").touch()
    now = [0.0]
    waits = []

    def sleep(s):
        waits.append(s)
        now[0] += s

    assert handoff.take(NAME, 10, clock=lambda: now[0], sleep=sleep) is None
    assert sum(waits) >= 10 and len(waits) == 5
    assert f"{NAME} did not come within 10 s" in capsys.readouterr().out


def test_a_file_given_while_the_taker_waits_is_taken(folder):
    (folder / f"{NAME}.promised").touch()

    def sleep(_):
        (folder / NAME).write_text("late but whole")

    assert handoff.take(NAME, 600, sleep=sleep) == folder / NAME


def test_a_run_says_what_it_will_give_and_take_and_runs_modules_in_their_order(pytester, folder, monkeypatch):
    monkeypatch.setattr(handoff, "HANDED", {NAME: ("test_give.py", "test_take.py"),
                                            "other.tar": ("test_elsewhere.py", "test_nowhere.py")})
    pytester.makepyfile(
        test_take="import pytest\npytestmark = pytest.mark.run_order(1)\ndef test_take():\n    pass\n",
        test_give="def test_give():\n    pass\n",
        test_a_first="def test_a():\n    pass\n")
    pytester.makeini("[pytest]\nmarkers =\n    run_order(n): order\n")
    res = pytester.runpytest_inprocess("-p", "handoff", "-p", "run_order", "-v", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=3)
    ran = [line.split("::")[0] for line in res.outlines if " PASSED" in line]
    assert ran == ["test_a_first.py", "test_give.py", "test_take.py"]
    assert sorted(p.name for p in folder.iterdir()) == [f"{NAME}.promised", f"{NAME}.wanted"]
    # a collection only (`invoke test`'s probe) says nothing
    for p in folder.iterdir():
        p.unlink()
    pytester.runpytest_inprocess("-p", "handoff", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert list(folder.iterdir()) == []
