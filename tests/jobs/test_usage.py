"""usage: reading the --monitor CSVs (contract in the launcher's sampler), the per-node summary, the plot, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures_invoke import task_program
from helpers_registry import GOLDEN, ROOT, golden

from shipyard.errors import ShipyardError
from shipyard.jobs import usage

HEADER = ("timestamp,node,cpu_percent,mem_used_mb,mem_total_mb,gpu_index,gpu_util_percent,gpu_mem_used_mb,"
          "gpu_mem_total_mb")


def write_samples(logs: Path, name: str = "train", jobid: str = "4242") -> None:
    """Two nodes as the sampler writes them: one with two GPUs (a row per GPU per sample), one without nvidia-smi."""
    logs.mkdir(parents=True, exist_ok=True)
    gpu_rows, cpu_rows = [HEADER], [HEADER]
    for i in range(6):
        ts = f"2026-11-29T21:00:{5 * i:02d}Z"
        gpu_rows.append(f"{ts},gpu-a,{50 + 5 * i}.0,{20000 + 100 * i},515000,0,{90 + i % 2},{70000 + i},81559")
        gpu_rows.append(f"{ts},gpu-a,{50 + 5 * i}.0,{20000 + 100 * i},515000,1,{20 + 2 * i},{40000 + i},81559")
        cpu_rows.append(f"{ts},n2,{97.5 - i},{1500 + 10 * i},23000,,,,")
    (logs / f"{name}-{jobid}.usage.gpu-a.csv").write_text("\n".join(gpu_rows) + "\n")
    (logs / f"{name}-{jobid}.usage.n2.csv").write_text("\n".join(cpu_rows) + "\n")


def test_summary_golden(tmp_path):
    write_samples(tmp_path)
    series = usage.load_job(tmp_path, "4242")
    golden(GOLDEN / "usage" / "two_nodes.txt", usage.render_summary("4242", series))


def test_parsed_values(tmp_path):
    write_samples(tmp_path)
    a, n2 = usage.load_job(tmp_path, "4242")
    assert (a.node, n2.node) == ("gpu-a", "n2")
    assert len(a.times) == 6  # CPU/RAM counted once per sample, not once per GPU row
    assert a.cpu == [50.0, 55.0, 60.0, 65.0, 70.0, 75.0]
    assert sorted(a.gpus) == ["0", "1"] and a.gpus["1"].util == [20, 22, 24, 26, 28, 30]
    assert a.gpus["0"].mem_total == 81559
    assert n2.gpus == {} and n2.mem_total == 23000
    rows = usage.summary_rows([n2])
    assert rows[0][-5:] == ["absent"] * 5


def test_hints_point_at_idle_gpu(tmp_path):
    write_samples(tmp_path)
    notes = usage.hints(usage.load_job(tmp_path, "4242"))
    assert any(n.startswith("gpu-a: GPU 1 busy less than 50%") for n in notes)
    assert not any("GPU 0" in n for n in notes)
    assert "n2: no GPU samples (nvidia-smi absent): CPU and RAM only" in notes


def test_plot_has_gpu_panels_only_when_present(tmp_path):
    write_samples(tmp_path)
    a, n2 = usage.load_job(tmp_path, "4242")
    fig = usage.plot("4242", [a, n2])
    assert [ax.get_ylabel() for ax in fig.axes] == ["CPU %", "RAM used (MB)", "GPU util %", "GPU mem (MB)"]
    cpu = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert list(cpu["gpu-a"].get_xdata()) == [0, 5, 10, 15, 20, 25]
    assert list(cpu["n2"].get_ydata()) == [97.5, 96.5, 95.5, 94.5, 93.5, 92.5]
    assert [ln.get_label() for ln in fig.axes[2].get_lines()] == ["gpu-a gpu0", "gpu-a gpu1"]
    fig = usage.plot("4242", [n2])
    assert [ax.get_ylabel() for ax in fig.axes] == ["CPU %", "RAM used (MB)"]
    assert any("GPU: absent" in t.get_text() for t in fig.axes[1].texts)


def test_command_writes_png_beside_the_logs(tmp_path):
    write_samples(tmp_path, name="my-run")
    text, png = usage.write_report(tmp_path, "4242")
    assert png == tmp_path / "my-run-4242.usage.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert text.startswith("usage of job 4242: 2 node(s)")


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_task_through_invoke(tmp_path, invoke):
    (tmp_path / "registry.yaml").write_text((ROOT / "registry.yaml").read_text())
    write_samples(tmp_path / "launch" / "logs")
    proc = invoke("usage", "4242", cwd=tmp_path, env={**os.environ, "SHIPYARD_REGISTRY": str(tmp_path / "registry.yaml")})
    assert proc.returncode == 0, proc.stderr
    assert f"plot: {tmp_path}/launch/logs/train-4242.usage.png" in proc.stdout


def _launcher(project: Path, name: str, cluster: str) -> None:
    """A launcher header as `invoke launch` writes it: the line that names the cluster it was written for."""
    (project / "launch" / f"{name}.sbatch").write_text(
        f"#!/bin/bash\n# environment pytorch-2.3, cluster {cluster}, runtime host, fabric socket: 2 node(s) x 0 GPU(s)\n")


@pytest.mark.slow  # seconds of CPU (several processes or a real build): CI runs it
def test_cluster_picks_that_clusters_samples_of_a_repeated_job_id(tmp_path, invoke, monkeypatch, capsys):
    """Job ids repeat across clusters: --cluster (default: defaults.cluster, sandbox here) reads only the samples of
    launchers written for that cluster, as `invoke logs` does; an unknown cluster is one line. The first call is the
    command line; the others run the task in this process (each plots: matplotlib once, not once per process)."""
    (tmp_path / "registry.yaml").write_text((ROOT / "registry.yaml").read_text())
    env = {**os.environ, "SHIPYARD_REGISTRY": str(tmp_path / "registry.yaml")}
    logs = tmp_path / "launch" / "logs"
    write_samples(logs, name="train-grete")
    _launcher(tmp_path, "train-grete", "grete")
    proc = invoke("usage", "4242", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"shipyard: error: job 4242: {logs}/train-grete-4242.usage.gpu-a.csv holds the samples of a job 4242 on "
        "cluster grete, not sandbox (same number, another cluster); pass --cluster grete for that one"]
    write_samples(logs, name="train-sandbox")
    _launcher(tmp_path, "train-sandbox", "sandbox")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHIPYARD_REGISTRY", str(tmp_path / "registry.yaml"))

    def run(*args):
        with pytest.raises(SystemExit) as ei:
            task_program().run(["invoke", "usage", "4242", *args])
        out = capsys.readouterr()
        return ei.value.code, out.out, out.err

    for cluster, args in (("sandbox", ()), ("sandbox", ("--cluster", "sandbox")), ("grete", ("--cluster", "grete"))):
        code, out, err = run(*args)
        assert code == 0, err
        assert out.startswith("usage of job 4242: 2 node(s)")  # one job's two nodes, not four
        assert f"plot: {logs}/train-{cluster}-4242.usage.png" in out
    code, out, err = run("--cluster", "nosuch")
    assert code == 2 and len(err.splitlines()) == 1 and "nosuch" in err, err
    assert "Traceback" not in err


def test_cluster_flag_has_help(invoke):
    proc = invoke("usage", "--help", cwd=ROOT)
    assert proc.returncode == 0 and "--cluster=STRING" in proc.stdout and "cluster the job ran on" in proc.stdout


@pytest.mark.parametrize(
    "content,message",
    [
        ("timestamp,node\n", ":1: header must be timestamp,node,cpu_percent"),
        (HEADER + "\n2026-11-29T21:00:00Z,n1,5,6\n", ":2: expected 9 fields, got 4"),
        (HEADER + "\nyesterday,n1,5,6,7,,,,\n", ":2: timestamp 'yesterday' is not ISO-8601"),
        (HEADER + "\n2026-11-29T21:00:00Z,n1,high,6,7,,,,\n", ":2: cpu_percent 'high' is not a number"),
    ],
)
def test_malformed_csv_names_file_and_line(tmp_path, content, message):
    (tmp_path / "x-7.usage.n1.csv").write_text(content)
    with pytest.raises(ShipyardError, match=message.replace("(", r"\(")):
        usage.load_job(tmp_path, "7")


def test_header_only_and_missing(tmp_path):
    with pytest.raises(ShipyardError, match="no monitoring samples for job 7 .*--monitor"):
        usage.load_job(tmp_path, "7")
    (tmp_path / "x-7.usage.n1.csv").write_text(HEADER + "\n")
    with pytest.raises(ShipyardError, match="header but no samples"):
        usage.load_job(tmp_path, "7")
    with pytest.raises(ShipyardError, match="expected a Slurm job id"):
        usage.load_job(tmp_path, "7;rm")


def test_other_jobs_files_are_not_mixed_in(tmp_path):
    write_samples(tmp_path, jobid="4242")
    write_samples(tmp_path, jobid="14242")
    assert len(usage.find_csvs(tmp_path, "4242")) == 2


def test_bad_jobid_through_invoke_is_one_line(invoke):
    proc = invoke("usage", "12x", cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "shipyard: error: JOBID '12x': expected a Slurm job id such as 1234 (or 1234_5 for an array task)"


@pytest.mark.slurm
@pytest.mark.slow
def test_usage_of_a_real_monitored_two_node_job(sandbox, tmp_path, invoke):
    """The launcher's --monitor sampler writes the CSVs on both sandbox nodes; usage reads what it really wrote."""
    import shutil
    import time

    from shipyard import sandbox as sb

    (tmp_path / "registry.yaml").write_text((ROOT / "registry.yaml").read_text())
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "train.py", tmp_path / "examples" / "train.py")
    env = {**os.environ, "SHIPYARD_REGISTRY": str(tmp_path / "registry.yaml"), sb.DIR_ENV: str(sandbox.directory)}
    proc = invoke("launch", "--cluster", "sandbox", "--nodes", "2",
                  "--monitor", "--monitor-interval", "1", "--name", "monitored", "--submit", "--",
                  "examples/train.py", "--steps", "20", "--step-delay", "0.1", "--checkpoint", str(tmp_path / "ck.pt"),
                  cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    jobid = [line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("submitted job")][0]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        state = sandbox.run(["squeue", "--noheader", "--states=all", f"--jobs={jobid}", "--format=%T"]).stdout.strip()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(0.5)
    assert state == "COMPLETED", (tmp_path / "launch" / "logs" / f"monitored-{jobid}.out").read_text()
    logs = tmp_path / "launch" / "logs"
    series = usage.load_job(logs, jobid)
    assert sorted(s.node for s in series) == sorted(sandbox.nodes)
    for s in series:
        assert len(s.times) >= 3 and s.gpus == {}  # CPU/RAM really sampled; no nvidia-smi on the sandbox
        assert all(0 <= c <= 100 for c in s.cpu) and 0 < max(s.mem_used) <= s.mem_total
    res = invoke("usage", jobid, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert f"usage of job {jobid}: 2 node(s)" in res.stdout
    assert all(f"{n}: no GPU samples (nvidia-smi absent)" in res.stdout for n in sandbox.nodes)
    assert (logs / f"monitored-{jobid}.usage.png").read_bytes()[:4] == b"\x89PNG"
