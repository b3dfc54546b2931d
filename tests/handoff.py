"""A file one pytest run of `invoke test` makes for another, through a folder of that `invoke test`
(``$SHIPYARD_TEST_HANDOFF``, set by tests/suite_runner.py): an image that two runs need and that costs minutes of
both cores to build, built once.

Each handed file has one giving module and one taking module (``HANDED``). At the end of its collection a run says
what it selected: ``NAME.promised`` when it will run the giving module, ``NAME.wanted`` when it will run the taking
one. The giver makes the file only when a taker wants it (its fixture runs after its services start, seconds after
every run collected), writing under a temporary name and renaming, or writes ``NAME.failed`` with the reason. The
taker waits for the file while a promise stands, up to its deadline; with no promise (pytest run alone, or the
giving run not part of this `invoke test`), a giver that declined, or past the deadline, the taker makes the file
itself. So the folder saves time and decides no result: every test still runs on the same recipe's image.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

HANDOFF_ENV = "SHIPYARD_TEST_HANDOFF"
# file -> (the module that makes it, the module that takes it), as pytest's node ids name them
HANDED = {
    "nccl-tests-mpi-none.tar": ("tests/containers/test_nccl_tests.py",
                                "tests/containers/test_nccl_tests_real_pyxis.py"),
}
POLL_S = 2.0


def folder() -> Path | None:
    value = os.environ.get(HANDOFF_ENV)
    return Path(value) if value else None


def pytest_collection_finish(session):
    where = folder()
    if where is None or session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    modules = {item.nodeid.split("::", 1)[0] for item in session.items}
    for name, (giver, taker) in HANDED.items():
        for module, word in ((giver, "promised"), (taker, "wanted")):
            if module in modules:
                (where / f"{name}.{word}").touch()


def give(name: str, make: Callable[[Path], None]) -> Path | None:
    """In the giving module: when another run wants ``name``, ``make(path)`` writes it, and it appears under its
    name once whole; the path, or None when nobody wants it (then nothing is made and the taker is told so)."""
    where = folder()
    if where is None or not (where / f"{name}.promised").exists():
        return None
    if not (where / f"{name}.wanted").exists():
        (where / f"{name}.declined").touch()
        return None
    part = where / f".{name}.part"
    try:
        make(part)
    except BaseException as e:
        (where / f"{name}.failed").write_text(f"{type(e).__name__}: {e}"[-3000:])
        raise
    os.replace(part, where / name)
    return where / name


def take(name: str, deadline_s: float, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> Path | None:
    """In the taking module: the file once another run made it; None when no run promised it, the giver declined,
    or it did not come within ``deadline_s`` (the caller makes it itself). A giver that failed fails the taker with
    the giver's reason: the same build would fail here too."""
    where = folder()
    if where is None or not (where / f"{name}.promised").exists():
        return None
    end = clock() + deadline_s
    while True:
        if (where / name).exists():
            return where / name
        if (where / f"{name}.failed").exists():
            import pytest  # here: tests/suite_runner.py reads HANDOFF_ENV without loading pytest

            pytest.fail(f"the run that makes {name} for this one failed to: "
                        f"{(where / f'{name}.failed').read_text()}")
        if (where / f"{name}.declined").exists():
            return None
        if clock() >= end:
            print(f"handoff: {name} did not come within {deadline_s:.0f} s; making it here")
            return None
        sleep(POLL_S)
