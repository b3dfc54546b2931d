"""Wall time of `invoke render --all` and `invoke check`, interpreter start included, on the shipped registry and
on a generated one of N environments (default 200). Baseline in the same run: `python -c pass` (bare interpreter
start) and `python -m invoke --list` (invoke + tasks.py import), so figures read as ratios on any machine.

    python bench/registry_render_check.py [--envs 200] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def generated_registry(n: int) -> dict:
    doc = yaml.safe_load((ROOT / "registry.yaml").read_text())
    bases = list(doc["environments"].items())
    envs = {}
    for i in range(n):
        name, env = bases[i % len(bases)]
        if "extends" in env:  # it would point at a renamed parent: a copy of the first environment instead, named
            name, env = bases[0]  # after it, so that its lock (copied below by that name) is for its pins
        e = dict(env)
        e["env"] = {"RUN_ID": str(i)}
        envs[f"{name}-{i}"] = e
    doc["environments"] = envs
    doc["defaults"]["environment"] = next(iter(envs))
    return doc


def timeit(cmd: list[str], cwd: Path, env: dict, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        res = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t)
        if res.returncode not in (0,):
            raise SystemExit(f"{cmd} failed: {res.stderr.decode()[-500:]}")
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    py = sys.executable
    inv = [py, "-m", "invoke", "--search-root", str(ROOT)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copy(ROOT / "registry.yaml", tmp / "registry.yaml")
        shutil.copytree(ROOT / "definitions", tmp / "definitions", ignore=shutil.ignore_patterns("*.def", "*.sh",
                                                                                              "*.Dockerfile"))
        big = tmp / "big"
        (big / "definitions").mkdir(parents=True)
        doc = generated_registry(args.envs)
        (big / "registry.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        for name in doc["environments"]:  # each copy's hash lock is its base's (the same pins), written after
            base_name = name.rsplit("-", 1)[0]  # the registry so that it is not older than it
            shutil.copy(ROOT / "definitions" / f"{base_name}.lock", big / "definitions" / f"{name}.lock")
        base_env = {k: v for k, v in os.environ.items() if k != "SHIPYARD_REGISTRY"}
        rows = [("python -c pass (baseline)", timeit([py, "-c", "pass"], tmp, base_env, args.repeat)),
                ("invoke --list (baseline)", timeit([*inv, "--list"], tmp, base_env, args.repeat))]
        for label, d in (("shipped", tmp), (f"{args.envs} envs", big)):
            timeit([*inv, "render", "--all"], d, base_env, 1)  # first render writes files
            rows.append((f"render --all ({label})", timeit([*inv, "render", "--all"], d, base_env, args.repeat)))
            rows.append((f"render --all --check ({label})",
                         timeit([*inv, "render", "--all", "--check"], d, base_env, args.repeat)))
            rows.append((f"check ({label})", timeit([*inv, "check"], d, base_env, args.repeat)))
    base = rows[1][1]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"median of {args.repeat} runs, interpreter start included\n")
    print("| command | median s | x invoke --list |")
    print("|---|---|---|")
    for label, t in rows:
        print(f"| {label} | {t:.3f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
