"""`invoke test` itself (tests/suite_runner.py): pytest's exit 5 (no tests ran) must fail, a real pass must pass, a
killed or short run must fail, and the verdict comes from pytest's JUnit XML."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import suite_runner as devtools

DATA = Path(__file__).parent / "data" / "pytest"


def _project(tmp_path):
    """A tiny test project of its own (the runs below start four pytest processes: the suite's conftest each time
    would cost seconds of CPU beside the real CI)."""
    (tmp_path / "test_x.py").write_text("def test_ok():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: s\n    docker: d\n    real_runtimes: r\n")
    return ["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)]


@pytest.mark.slow  # four pytest processes each: seconds
def test_no_tests_collected_is_a_failure(tmp_path, capsys):
    assert devtools.run_tests([*_project(tmp_path), "-k", "no_such_test_name_zzz"], install=False) == 1
    assert "collected no tests" in capsys.readouterr().err


@pytest.mark.slow  # four pytest processes each: seconds
def test_passing_selection_passes_and_a_selection_without_service_tests_is_one_run(tmp_path, capfd):
    assert devtools.run_tests(_project(tmp_path), install=False) == 0
    out = capfd.readouterr().out
    # no test of the selection needs a service: the service runs were not started (the quick loop's case)
    assert "1 passed in" in out and "tests marked" not in out and "deselected" not in out, out
    assert out.splitlines()[-1] == "tests: 1 passed, 0 failed"


def test_package_list_is_data_and_checked_with_dpkg():
    pkgs = devtools.debian_packages()
    assert {"slurm-wlm", "munge", "docker.io", "docker-registry", "shellcheck", "lmod"} <= set(pkgs)
    assert devtools.missing_packages(["shellcheck"]) == []
    assert devtools.missing_packages(["no-such-package-zzz"]) == ["no-such-package-zzz"]


def test_services_run_in_three_processes_of_their_own():
    real, docker, slurm, rest = devtools.phases(["-q", "-m", "not slow", "tests/launch"])
    # every test of the machine-wide real runtimes in one process; docker's and the other Slurm tests beside it
    short = "--tb=short"  # first, so that a --tb of the caller's comes later and wins
    assert real == [short, "-p", "no:xdist", "-q", "-m", "(not slow) and (real_runtimes)", "tests/launch"]
    assert docker == [short, "-p", "no:xdist", "-q", "-m", "(not slow) and (docker and not real_runtimes)",
                      "tests/launch"]
    assert slurm == [short, "-p", "no:xdist", "-q", "-m", "(not slow) and (slurm and not (docker or real_runtimes))",
                     "tests/launch"]
    assert rest == [short, "-n", "3", "--dist", "loadfile", "-q", "-m", "(not slow) and (not (slurm or docker))",
                    "tests/launch"]
    assert devtools.phases(["-x", "--tb=long"])[0] == [short, "-p", "no:xdist", "-m", "real_runtimes", "-x",
                                                       "--tb=long"]
    assert devtools.with_marks(["-mnot pypi"], "slurm") == ["-m", "(not pypi) and (slurm)"]
    # arguments that choose the workers are run as given, once
    assert devtools.phases(["-n", "4", "-q"]) == [["-n", "4", "-q"]]
    assert devtools.phases(["-p", "no:xdist"]) == [["-p", "no:xdist"]]


@pytest.mark.slow  # four pytest processes each: seconds
def test_a_failure_in_any_run_fails_the_whole(tmp_path, capsys):
    (tmp_path / "test_x.py").write_text("import pytest\n\ndef test_ok():\n    pass\n\n"
                                        "@pytest.mark.slurm\ndef test_bad():\n    assert False\n\n"
                                        "@pytest.mark.docker\ndef test_d():\n    pass\n\n"
                                        "@pytest.mark.slurm\n@pytest.mark.real_runtimes\ndef test_r():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: s\n    docker: d\n    real_runtimes: r\n")
    assert devtools.run_tests(["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                              install=False) == 1
    out = capsys.readouterr().out
    # each test ran once, in its run; one closing line with the four runs' totals, the form CI reads
    assert out.splitlines()[-1] == "tests: 3 passed, 1 failed"
    assert "tests marked slurm and not (docker or real_runtimes) (run beside the above)" in out
    assert "tests marked docker and not real_runtimes (run beside the above)" in out
    # and the closing lines say which test failed, where and why, whatever CI cuts from the middle
    assert re.search(r"\nFAILED test_x\.py::test_bad at \S*test_x\.py:8: AssertionError\n  E +assert False\ntests: 3 passed", out)


def test_results_are_read_from_pytests_junit_xml():
    """A real report (tests/data/pytest/README.md): one pass, one failure, one setup error."""
    results = devtools.read_results(DATA / "report-failures.xml")
    assert (results.passed, results.failed, results.skipped, results.ran) == (1, 2, 0, 3)
    assert [(p.nodeid, p.kind) for p in results.problems] == [("test_x.py::test_bad", "failure"),
                                                              ("test_x.py::test_err", "error")]
    assert devtools.read_results(DATA / "no-such-report.xml") is None


def test_a_truncated_report_is_no_report(tmp_path):
    """A process killed while writing leaves a cut file: it says nothing, so the run has no results."""
    cut = tmp_path / "run.xml"
    cut.write_bytes((DATA / "report-failures.xml").read_bytes()[:500])
    assert devtools.read_results(cut) is None


def test_node_ids_come_from_the_file_the_class_and_the_name():
    case = ET.fromstring('<testcase classname="tests.launch.test_a.TestB" name="test_c[1]" '
                         'file="tests/launch/test_a.py"/>')
    assert devtools._nodeid(case) == "tests/launch/test_a.py::TestB::test_c[1]"
    assert devtools._nodeid(ET.fromstring('<testcase classname="tests.x" name="t"/>')) == "tests.x.t"


def test_digest_says_what_failed_where_and_why_in_a_few_lines():
    """CI keeps the start and the end of the output: the end must name each failure (tests/data/pytest/README.md)."""
    lines = devtools.digest([devtools.read_results(DATA / "report-failures.xml"), None])
    bad = lines.index("FAILED test_x.py::test_bad at test_x.py:11: AssertionError")
    err = lines.index("ERROR test_x.py::test_err at test_x.py:5: RuntimeError")
    assert lines[err + 1].split() == ["E", "RuntimeError:", "fixture", "broke"] and err == len(lines) - 2
    # the first 3 and the last 8 of its 32 E lines, the cut marked
    assert [ln.split(None, 1)[1] for ln in lines[bad + 1:err]] == [
        "AssertionError: line 0", "line 1", "line 2", "[...]", *(f"line {i}" for i in range(23, 30)), "assert False"]
    assert devtools.digest([devtools.Results(passed=5)]) == []


def test_a_problem_without_a_traceback_is_told_by_its_message():
    """A crashed xdist worker or a collection error: pytest's message is the whole story."""
    crashed = devtools.Problem("tests/test_a.py::test_b", "failure", "worker 'gw1' crashed while running\nx", "")
    assert devtools.brief(crashed) == ["FAILED tests/test_a.py::test_b", "  E   worker 'gw1' crashed while running",
                                       "  E   x"]


def test_digest_of_a_job_log_in_a_long_message_keeps_its_error_lines():
    """A real failure (tests/data/pytest/README.md): 160 E lines, a job log's tail, then the image's environment
    and the launcher script. The lines that say why (the torch error, srun's task exit) sit in the middle."""
    lines = devtools.digest([devtools.read_results(DATA / "report-job-log.xml")])
    assert lines[0].startswith("FAILED tests/containers/test_real_image.py::test_real_debian12_image_built_tested_"
                               "staged_and_verified_by_a_job at ")
    assert lines[0].endswith("tests/containers/test_real_image.py:245: AssertionError")
    shown = [ln.split(None, 1)[1].strip() for ln in lines[1:]]
    assert shown[0] == "AssertionError: n _call_store" and len(shown) <= 3 + 8 + 8
    for why in ("RuntimeError: Broken pipe",
                "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store "
                "has failed. See inner exception for details.",
                "srun: error: node2: task 1: Exited with exit code 1", "shipyard: job step exit code 1"):
        assert why in shown, why
    # what is not a cause: the chained-exception banner, a path with "errors" in it, the stack's plain lines
    assert not [ln for ln in shown if "above exception" in ln or "errors/__init__.py" in ln or "sys.exit" in ln]


def test_verdict_fails_a_killed_run_a_short_run_and_a_run_without_results(capsys):
    full, three = devtools.Results(passed=2, skipped=1), 3
    assert devtools.verdict([0, 0, 5, 0], [full, full, None, full], [three, three, None, three]) == 0
    # a run killed by a signal: Python reports -9; max() of the statuses would have been 0
    assert devtools.verdict([-9, 0, 0, 0], [None, full, full, full], [three] * 4) == 1
    assert devtools.verdict([0, 2, 0, 0], [full] * 4, [three] * 4) == 2
    assert devtools.verdict([0, 0, 0, 0], [full, devtools.Results(passed=2), full, full], [three] * 4) == 1
    assert devtools.verdict([0, 0, 0, 0], [full, full, None, full], [three] * 4) == 1
    assert devtools.verdict([0, 0, 0, 0], [full] * 4, [three, three, three, None]) == 1
    assert devtools.verdict([5, 5], [None, None], [None, None]) == 1
    err = capsys.readouterr().err
    assert "test run 1 was killed by signal 9: failing" in err
    assert "test run 2 ran 2 of the 3 tests it selected: failing" in err
    assert "test run 3 ended without its results: failing" in err
    assert "test run 4 ended without its results: failing" in err


@pytest.mark.slow  # a pytest process: seconds
def test_a_run_that_exits_0_early_fails(tmp_path, capsys):
    """pytest.exit(returncode=0) half-way: the process says success, the counts say test_b never ran."""
    (tmp_path / "test_x.py").write_text("import pytest\n\ndef test_a():\n    pytest.exit('gone', returncode=0)\n\n"
                                        "def test_b():\n    pass\n")
    assert devtools.run_tests(["-p", "no:xdist", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                               str(tmp_path)], install=False) == 1
    assert "ran 1 of the 2 tests it selected" in capsys.readouterr().err  # test_a started, test_b never


@pytest.mark.slow  # four pytest processes: seconds
def test_a_killed_pytest_process_fails_the_run(tmp_path, capsys):
    """A service run's pytest process dies of SIGKILL (the kernel's OOM killer, a stray kill) while the other runs
    pass: no JUnit XML, status -9, and the whole run fails, whatever the other runs' totals say."""
    (tmp_path / "test_x.py").write_text("import os, signal\nimport pytest\n\ndef test_ok():\n    pass\n\n"
                                        "@pytest.mark.slurm\ndef test_killed():\n"
                                        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: s\n    docker: d\n    real_runtimes: r\n")
    assert devtools.run_tests(["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                              install=False) == 1
    captured = capsys.readouterr()
    assert "test run 3 was killed by signal 9: failing" in captured.err
    assert captured.out.splitlines()[-1] == "tests: 1 passed, 0 failed"  # what the XML shows; the verdict is 1


@pytest.mark.parametrize("args,can", [
    (["-m", "not slurm and not docker and not pypi and not slow"], False),  # the quick loop
    (["-mnot (slurm or docker)"], False),
    (["-m", "slurm"], True),
    (["-m", "not slow"], True),
    (["-m", "not docker", "-m", "not slurm and not docker"], False),  # pytest reads the last -m
    (["-m", "not slurm and not docker", "-m", "not slow"], True),
    (["-k", "x"], True),  # no -m: anything may be selected
    (["-m", "mark(key=1)"], True),  # beyond plain names: pytest decides
    (["-m", "slurm or"], True),  # not an expression: pytest says so
])
def test_an_expression_that_rules_out_every_service_test_needs_no_collection(args, can):
    assert devtools.may_select(args, devtools.SERVICES) is can
