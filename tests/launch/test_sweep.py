"""Sweeps as job arrays: parsing, the combination -> run directory mapping, the array split at
MaxArraySize, the golden launcher (shellcheck) and the values reaching argv through the rendered script's own bash.
The sandbox test is in test_sweep_sandbox.py."""

from __future__ import annotations

import subprocess

import pytest
from fixtures_launch import build_launcher
from helpers_registry import GOLDEN, golden

from shipyard.errors import ShipyardError
from shipyard.launch import launcher as launch, sweep as sweeps

CMD = ("examples/train.py", "--epochs", "3")


def test_spec_is_every_combination_last_varying_fastest():
    sw = sweeps.parse_spec("lr=1e-3,1e-4 seed=0,1,2")
    assert sw.names == ("lr", "seed") and sw.count == 6
    assert sw.rows[:4] == (("1e-3", "0"), ("1e-3", "1"), ("1e-3", "2"), ("1e-4", "0"))
    assert [sw.directory_name(i) for i in (0, 5)] == ["lr=1e-3_seed=0", "lr=1e-4_seed=2"]


def test_file_values_are_exact_and_hostile_ones_get_a_distinct_stable_directory(tmp_path):
    f = tmp_path / "combos.tsv"
    f.write_text("msg\tseed\ntwo words\t0\nit's \"quoted\"\t1\n$(touch /tmp/pwned)\t2\ntwo-words\t0\n")
    sw = sweeps.parse_file(f)
    assert sw.rows[0] == ("two words", "0") and sw.rows[2] == ("$(touch /tmp/pwned)", "2")
    names = [sw.directory_name(i) for i in range(sw.count)]
    assert len(set(names)) == 4 and names == [sweeps.parse_file(f).directory_name(i) for i in range(4)]
    assert names[3] == "msg=two-words_seed=0" and names[0].startswith("msg=two-words_seed=0_")
    assert all("/" not in n and " " not in n for n in names)


@pytest.mark.parametrize(("spec", "msg"), [
    ("lr", "expected NAME=V1,V2"),
    ("lr=1,,2", "empty"),
    ("1x=1", "parameter '1x'"),
    ("lr=1 lr=2", "named twice"),
])
def test_bad_spec_one_line(spec, msg):
    with pytest.raises(ShipyardError, match=msg):
        sweeps.parse_spec(spec)


def test_arrays_split_below_max_array_size_with_the_same_mapping():
    assert sweeps.array_specs(range(4), 1001) == [(0, "0-3")]
    assert sweeps.array_specs(range(4), 3) == [(0, "0-2"), (3, "0")]
    assert sweeps.array_specs([1, 3, 4, 7], 4) == [(0, "1,3"), (4, "0,3")]


def test_flags_that_do_not_go_with_a_sweep(launch_registry):
    with pytest.raises(ShipyardError, match="--max-concurrent: only with --sweep"):
        build_launcher(launch_registry, max_concurrent=2, command=CMD)
    with pytest.raises(ShipyardError, match="--chain with a sweep"):
        build_launcher(launch_registry, sweep="lr=1,2", chain=2, command=CMD)


def test_golden_sweep_launcher(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-socket", nodes=2, sweep="lr=1e-3,1e-4 seed=0,1",
                       max_concurrent=2, command=CMD)
    text = launch.render(l)
    golden(GOLDEN / "launch" / "sweep.sbatch", text)
    assert "#SBATCH --array=0-3%2\n" in text and "-%A_%a.out\n" in text
    assert "--sweep 'lr=1e-3,1e-4 seed=0,1' --max-concurrent 2" in text.splitlines()[2]
    res = subprocess.run(["shellcheck", "-S", "warning", "-s", "bash", "-"], input=text, text=True,
                         capture_output=True)
    assert res.returncode == 0, res.stdout


def test_the_scripts_own_lines_read_the_values_intact(launch_registry, tmp_path):
    """The sweep block of the rendered launcher, run by bash against a written table: argv words exact."""
    f = tmp_path / "combos.tsv"
    f.write_text("msg\tn\ntwo  words\t1\nit's \"q\" `id` $(touch /tmp/pwned) $HOME *\t2\n")
    l = build_launcher(launch_registry, cluster="lab-socket", sweep_file=str(f), command=CMD)
    text = launch.render(l)
    block = text[text.index("sweep_table="):text.index('echo "shipyard: sweep combination')]
    table = tmp_path / "t.tsv"
    table.write_text(sweeps.render_table(l.combinations))
    block = block.replace(block.split("\n")[0], f"sweep_table={table}").replace(str(sweeps.runs_dir(l.root, l.name)),
                                                                            str(tmp_path / "runs"))
    script = block + 'printf "%s\\0" "$sweep_dir" "${sweep_args[@]}"'
    for i, row in enumerate(l.combinations.rows):
        out = subprocess.run(["bash", "-c", script], env={"SLURM_ARRAY_TASK_ID": str(i), "PATH": "/usr/bin:/bin"},
                             capture_output=True, check=True).stdout.decode().split("\0")[:-1]
        assert out[1:] == ["--msg", row[0], "--n", row[1]]
        assert out[0] == str(tmp_path / "runs" / l.combinations.directory_name(i))


def test_submit_splits_at_max_array_size_and_skips_finished(launch_registry, monkeypatch, tmp_path):
    from dataclasses import replace

    from shipyard import slurm

    l = build_launcher(launch_registry, cluster="lab-socket", sweep="lr=1,2 seed=0,1", max_concurrent=2,
                       command=CMD)
    l = replace(l, root=str(tmp_path))
    calls = []
    monkeypatch.setattr(slurm, "submit", lambda cluster, path, extra=(): calls.append(list(extra)) or str(len(calls)))
    ids, finished = launch.submit_sweep(l, tmp_path / "x.sbatch", 3)
    assert (ids, finished) == (["1", "2"], 0)
    assert calls == [["--array=0-2%2"], ["--array=0%2", "--export=ALL,SHIPYARD_SWEEP_OFFSET=3"]]
    for i in (0, 3):
        d = sweeps.runs_dir(l.root, l.name) / l.combinations.directory_name(i)
        d.mkdir(parents=True)
        (d / sweeps.DONE).write_text("")
    calls.clear()
    assert launch.submit_sweep(l, tmp_path / "x.sbatch", 3) == (["1"], 2)
    assert calls == [["--array=1-2%2"]]


@pytest.mark.parametrize(("text", "rows"), [
    ("tag\tseed\n#1\t0\nb\t1\n", (("#1", "0"), ("b", "1"))),  # a row starting with '#' is a row
    ("tag\tseed\r\na\t0\r\n\r\nb\t1", (("a", "0"), ("b", "1"))),  # CRLF ends a row; an empty line is skipped
    ("tag\n  \n", (("  ",),)),  # spaces are a value
])
def test_sweep_file_rows_are_kept_as_written(tmp_path, text, rows):
    f = tmp_path / "combos.tsv"
    f.write_bytes(text.encode())
    assert sweeps.parse_file(f).rows == rows


@pytest.mark.parametrize(("text", "msg"), [
    ("tag\tseed\na\vb\t0\n", "row 2: value 'a\\\\x0bb' of tag"),  # a vertical tab stays in its cell, refused there
    ("tag\tseed\na\x1cb\t0\n", "row 2: value"),
    ("tag\tseed\na\u2028b\t0\n", "row 2: value"),
    ("tag\tseed\na\rb\t0\n", "line 2: new-line character"),
])
def test_a_line_break_inside_a_cell_is_one_line_not_two_rows(tmp_path, text, msg):
    f = tmp_path / "combos.tsv"
    f.write_bytes(text.encode())
    with pytest.raises(ShipyardError, match=msg) as exc:
        sweeps.parse_file(f)
    assert "\n" not in str(exc.value)


def _within(fn, seconds=20):
    import threading
    got = {}

    def run():
        try:
            got["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test looks at whatever it was
            got["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return t.is_alive(), got


def test_sweep_file_on_dev_zero_and_a_fifo_is_one_line(tmp_path):
    import os
    hung, got = _within(lambda: sweeps.parse_file("/dev/zero"))
    assert not hung and isinstance(got["error"], ShipyardError) and "larger than" in str(got["error"])
    os.mkfifo(tmp_path / "fifo")
    hung, got = _within(lambda: sweeps.parse_file(tmp_path / "fifo"))
    if hung:
        os.close(os.open(tmp_path / "fifo", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("--sweep-file hangs on a FIFO")
    assert isinstance(got["error"], ShipyardError) and "empty" in str(got["error"])


@pytest.mark.parametrize("plant", ["zero", "fifo", "bad"])
def test_sweep_status_on_a_planted_table_is_one_line(tmp_path, plant):
    import os
    path = sweeps.table_path(tmp_path, "s")
    path.parent.mkdir(parents=True)
    if plant == "zero":
        path.symlink_to("/dev/zero")
    elif plant == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("index\tdir\tlr\n0\t../../x\t1\n")
    hung, got = _within(lambda: sweeps.read_table(tmp_path, "s"))
    if hung:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("sweep-status hangs")
    assert isinstance(got.get("error"), ShipyardError), got
    assert "\n" not in str(got["error"])


def test_the_written_table_reads_back(tmp_path):
    sw = sweeps.parse_spec("lr=1e-3,1e-4 seed=0,1")
    sweeps.write_table(tmp_path, "s", sw)
    back, dirs = sweeps.read_table(tmp_path, "s")
    assert back == sw and dirs == [sw.directory_name(i) for i in range(sw.count)]


def test_a_pending_task_reads_the_table_it_was_submitted_with(launch_registry, tmp_path):
    """Launcher A is submitted; `invoke launch --name SAME` then writes another sweep under the same name. A's
    pending or requeued task still runs A's combination, in A's run directory, under A's parameter name."""
    from dataclasses import replace

    a = replace(build_launcher(launch_registry, cluster="lab-socket", sweep="lr=1e-3,1e-4", command=CMD),
                root=str(tmp_path))
    b = replace(build_launcher(launch_registry, cluster="lab-socket", sweep="wd=0.1,0.2,0.3", command=CMD),
                root=str(tmp_path))
    a_text = launch.render(a)
    sweeps.write_table(a.root, a.name, a.combinations)
    assert b.name == a.name
    sweeps.write_table(b.root, b.name, b.combinations)
    block = a_text[a_text.index("sweep_table="):a_text.index('echo "shipyard: sweep combination')]
    script = block + 'printf "%s\\0" "$sweep_dir" "${sweep_args[@]}"'
    out = subprocess.run(["bash", "-c", script], env={"SLURM_ARRAY_TASK_ID": "1", "PATH": "/usr/bin:/bin"},
                         capture_output=True, check=True).stdout.decode().split("\0")[:-1]
    assert out[1:] == ["--lr", "1e-4"] and out[0].endswith("/lr=1e-4")
    # the latest table of that name is B's (sweep-status), A's copy is unchanged and read-only
    assert sweeps.read_table(a.root, a.name)[0] == b.combinations
    copy = sweeps.submitted_table_path(a.root, a.name, a.combinations)
    assert copy.read_text() == sweeps.render_table(a.combinations) and copy.stat().st_mode & 0o222 == 0
    # a copy changed after the launcher was written is refused, not read
    copy.chmod(0o644)
    copy.write_text(sweeps.render_table(b.combinations))
    res = subprocess.run(["bash", "-c", script], env={"SLURM_ARRAY_TASK_ID": "1", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert res.returncode == 3 and "not the sweep table this launcher was written for" in res.stderr
