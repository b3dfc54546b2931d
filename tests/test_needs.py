"""The marks say what a test needs, and tests/needs.py enforces them: proven here on a throw-away test suite."""

from __future__ import annotations

import os

import pytest

CONFTEST = '''
import pytest

@pytest.fixture(scope="session")
def sandbox(tmp_path_factory):
    open("STARTED-sandbox", "w").close()
    yield "sandbox"

@pytest.fixture(scope="session")
def docker_services():
    open("STARTED-docker", "w").close()
    yield "docker"

@pytest.fixture
def docker_env(docker_services):
    return docker_services
'''


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    slurm: s\n    docker: d\n    pypi: p\n")
    return pytester


def test_sandbox_without_the_slurm_mark_fails_before_slurm_starts(suite):
    suite.makepyfile("def test_unmarked(sandbox):\n    pass\n")
    res = suite.runpytest("-p", "needs")
    res.assert_outcomes(errors=1)
    res.stdout.fnmatch_lines(["*sandbox needs @pytest.mark.slurm*"])
    assert not (suite.path / "STARTED-sandbox").exists()


def test_docker_fixtures_without_the_docker_mark_fail(suite):
    suite.makepyfile("def test_direct(docker_services):\n    pass\n\n"
                     "def test_through_another_fixture(docker_env):\n    pass\n")
    res = suite.runpytest("-p", "needs")
    res.assert_outcomes(errors=2)
    assert not (suite.path / "STARTED-docker").exists()


def test_marked_service_tests_run(suite):
    suite.makepyfile("import pytest\n\n@pytest.mark.slurm\ndef test_s(sandbox):\n    pass\n\n"
                     "@pytest.mark.docker\ndef test_d(docker_env):\n    pass\n")
    suite.runpytest("-p", "needs").assert_outcomes(passed=2)


def test_only_pypi_tests_may_reach_the_index(suite, monkeypatch):
    monkeypatch.delenv("UV_OFFLINE")  # this test itself runs offline; the inner suite starts as a user's shell would
    suite.makepyfile("import os, pytest\n\n"
                     "def test_offline():\n    assert os.environ['UV_OFFLINE'] == '1'\n\n"
                     "@pytest.mark.pypi\ndef test_online():\n    assert 'UV_OFFLINE' not in os.environ\n")
    suite.runpytest("-p", "needs").assert_outcomes(passed=2)


def test_this_test_runs_offline():
    assert os.environ.get("UV_OFFLINE") == "1"

