"""The nccl-tests facts against the release itself: the binaries data/nccl_tests.yaml lists for a release (the image's
%test checks each one, `invoke nccl-test --test` accepts only these) are exactly those the release's own Makefile
builds (``BIN_FILES_LIST`` in src/Makefile), read from the untouched upstream archive in ../shared/vendor.

Why here and not by compiling: the compile test (tests/containers/test_nccl_tests.py) builds one binary through the
recipe's step, which proves the step compiles and links; which binaries a release makes is the Makefile's fact."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest
from ci_skips import in_ci

from shipyard import facts

ARCHIVE = "nccl-tests-{version}.tar.gz"


def _vendor() -> Path:
    from shipyard.sandbox import runtimes

    return runtimes.test_sources(Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("version", sorted(facts.load("nccl_tests")["releases"]))
def test_release_binaries_are_the_makefiles(version):
    archive = _vendor() / ARCHIVE.format(version=version)
    if not archive.is_file():
        (pytest.fail if in_ci() else pytest.skip)(f"{archive} is missing (the upstream archive, ../shared/vendor)")
    with tarfile.open(archive) as tar:
        (member,) = [m for m in tar.getmembers() if re.fullmatch(r"[^/]+/src/Makefile", m.name)]
        makefile = tar.extractfile(member).read().decode()
    words = re.search(r"^BIN_FILES_LIST\s*:?=\s*(.+)$", makefile, re.M).group(1).split()
    assert facts.load("nccl_tests")["releases"][version]["binaries"] == [f"{w}_perf" for w in words]
