"""`invoke test` itself: pytest's exit 5 (no tests ran) must fail, a real pass must pass."""

from __future__ import annotations

from shipyard.dev import testing as devtools


def test_no_tests_collected_is_a_failure(capsys):
    assert devtools.run_tests(["-q", "tests/registry/test_compat.py", "-k", "no_such_test_name_zzz"], install=False) == 1
    assert "collected no tests" in capsys.readouterr().err


def test_passing_selection_passes():
    assert devtools.run_tests(["-q", "tests/registry/test_compat.py", "-k", "valid_combination"], install=False) == 0


def test_package_list_is_data_and_checked_with_dpkg():
    pkgs = devtools.test_packages()
    assert {"slurm-wlm", "munge", "docker.io", "docker-registry", "shellcheck", "lmod"} <= set(pkgs)
    assert devtools.missing_packages(["shellcheck"]) == []
    assert devtools.missing_packages(["no-such-package-zzz"]) == ["no-such-package-zzz"]
