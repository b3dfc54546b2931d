"""tests/machine_notes.py: a failed service test says how much space and memory the machine had, others do not."""

from __future__ import annotations

import machine_notes


def test_the_line_names_space_memory_and_load():
    line = machine_notes.machine_line()
    assert line.startswith("machine at the failure: /tmp ") and "GiB free" in line
    assert "GiB available" in line and ", load " in line


def test_only_a_failed_service_test_carries_it(pytester):
    pytester.makeconftest("pytest_plugins = ['machine_notes']\n")
    pytester.makeini("[pytest]\nmarkers =\n    slurm: s\n    docker: d\n")
    pytester.makepyfile("import pytest\n\n@pytest.mark.docker\ndef test_svc():\n    assert 1 == 2\n\n"
                        "def test_plain():\n    assert 1 == 3\n\n@pytest.mark.slurm\ndef test_ok():\n    pass\n")
    # -rN: no short summary (under CI=true pytest prints the whole message there, note included)
    res = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-rN")
    res.assert_outcomes(failed=2, passed=1)
    out = res.stdout.str()
    assert out.count("machine at the failure:") == 1
    assert out.index("machine at the failure:") < out.index("test_plain")  # in test_svc's report, which comes first
