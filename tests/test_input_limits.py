"""Limits everywhere input is read: a size cap before reading, integer digits, alias chains.

Each input is a file someone else may have written: an endless one (``/dev/zero``) or an oversized one must be one
line naming the file and the cap (``shipyard/data/limits.yaml``), never an OOM or a hang; a YAML number or alias chain
past the limits is one line with its key, never a ValueError or RecursionError traceback.
"""

from __future__ import annotations

import os
import threading

import pytest

from shipyard import facts, registry
from shipyard.commands import pcluster as pcluster_cmd
from shipyard.containers import manifest
from shipyard.errors import ShipyardError
from shipyard import files
from shipyard.jobs import nccl_report
from shipyard.registry import loader

ENDLESS = "/dev/zero"


def one_line(exc: BaseException, *needles: str) -> str:
    msg = str(exc)
    assert isinstance(exc, ShipyardError) and "\n" not in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_read_capped_stops_at_the_cap(tmp_path):
    cap = facts.load("limits")["input_bytes"]["stage_record"]
    ok = tmp_path / "ok"
    ok.write_bytes(b"x" * cap)
    assert files.read_capped(ok, "stage_record") == b"x" * cap
    big = tmp_path / "big"
    big.write_bytes(b"x" * (cap + 1))
    with pytest.raises(ShipyardError) as ei:
        files.read_capped(big, "stage_record", "a stage record")
    one_line(ei.value, str(big), str(cap), "limits.yaml")


def test_a_fifo_without_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(files.read_capped(fifo, "registry")), daemon=True)
    t.start()
    t.join(5)
    assert done == [b""]


@pytest.mark.parametrize("reader", ["registry", "pcluster", "nccl", "manifest"])
def test_endless_input_is_one_line_naming_the_file_and_the_cap(reader, tmp_path):
    """/dev/zero as each input: one line within a second or so, memory bounded by the cap."""
    with pytest.raises(ShipyardError) as ei:
        if reader == "registry":
            registry.load(ENDLESS)
        elif reader == "pcluster":
            (tmp_path / "registry.yaml").write_text("environments: {}\nclusters: {}\n")
            pcluster_cmd.import_pcluster(ENDLESS, "c", tmp_path / "registry.yaml", dry_run=True)
        elif reader == "nccl":
            nccl_report.parse_file(ENDLESS)
        else:
            manifest.read_manifest(ENDLESS)
    one_line(ei.value, ENDLESS, "bytes", "limits.yaml")


def test_a_5000_digit_integer_is_one_line():
    for core12 in (False, True):
        with pytest.raises(ShipyardError) as ei:
            loader.parse_yaml("a:\n  b: " + "9" * 5000 + "\n", "x.yaml", core12=core12)
        one_line(ei.value, "x.yaml:2", "a.b", "integer")
    with pytest.raises(ShipyardError) as ei:
        loader.parse_yaml("a: 0x" + "f" * 5000 + "\n", "x.yaml")
    one_line(ei.value, "x.yaml:1", "a")
    assert loader.parse_yaml("a: '" + "9" * 5000 + "'\n", "x.yaml")[0] == {"a": "9" * 5000}  # quoted: text


def test_an_alias_chain_past_the_depth_limit_is_one_line():
    """``&a1 [*a0]``, ``&a2 [*a1]``, ...: no bracket nests in the text, but the tree does."""
    depth = facts.load("limits")["registry_yaml"]["max_depth"]
    chain = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, depth + 5))
    with pytest.raises(ShipyardError) as ei:
        loader.parse_yaml(chain, "x.yaml")
    one_line(ei.value, "x.yaml:", f"more than {depth} levels", "alias")
    short = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, depth - 2))
    assert loader.parse_yaml(short, "x.yaml")[0]["a1"] == [[1]]


def test_the_registry_loader_refuses_the_chain_too(tmp_path):
    p = tmp_path / "registry.yaml"
    p.write_text("x-a: &a0 {k: 1}\n" + "".join(f"x-a{i}: &a{i} {{k: *a{i - 1}}}\n" for i in range(1, 100)))
    with pytest.raises(ShipyardError) as ei:
        registry.load(p)
    one_line(ei.value, str(p), "levels")


def test_a_pipe_with_a_writer_is_read_to_its_end(tmp_path):
    """bash's ``<(...)``: the writer may not have written yet when shipyard opens the pipe."""
    import subprocess
    import sys

    out = subprocess.run(["bash", "-c", f"{sys.executable} -c 'import sys; from shipyard import files; "
                          "print(len(files.read_capped(sys.argv[1], \"registry\")))' <(sleep 0.3; printf abc)"],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "3", out.stderr
