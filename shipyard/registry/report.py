"""Text reports for `invoke list`, `invoke show` and `invoke check` (pure functions of the model -> text)."""

from __future__ import annotations

from shipyard import facts
from shipyard.files import table
from shipyard.registry import compat
from shipyard.registry.model import Environment, Registry


def list_tables(reg: Registry) -> str:
    envs = table(
        ["environment", "torch", "cuda", "python", "os", "nccl", "base", "extends"],
        [
            [
                e.name + (" *" if e.name == reg.default_environment else ""),
                e.torch.value, e.cuda.value, e.python.value, e.os.value, e.nccl.value,
                e.base.value, " <- ".join(e.extends_chain) or "-",
            ]
            for e in reg.environments.values()
        ],
    )
    clusters = table(
        ["cluster", "runtime", "fabric", "partition", "gpus/node", "gpus", "driver", "storage"],
        [
            [
                c.name + (" *" if c.name == reg.default_cluster else ""),
                c.runtime, c.fabric, c.partition, c.gpus_per_node,
                ", ".join(f"{g.model} ({g.arch})" for g in c.gpus) or "-", c.driver or "-", c.storage or "-",
            ]
            for c in reg.clusters.values()
        ],
    )
    out = [envs, "", clusters]
    if reg.registries:
        out += ["", table(["registry", "uri", "insecure", "require_signed"],
                          [[r.name + (" *" if r.name == reg.default_registry else ""), r.uri, r.insecure,
                            r.require_signed] for r in reg.registries.values()])]
    out += ["", "* = default (registry.yaml `defaults`)"]
    return "\n".join(out)


def show(env: Environment) -> str:
    rows = [[k, p.value if p.value is not None else "-", p.source] for k, p in env.pins().items()]
    rows.append(["nccl_package", env.nccl_package or "-", "compat data"])
    for req in env.pip:
        rows.append(["pip", req, "explicit"])
    out = [f"environment {env.name}" + (f" (extends {' <- '.join(env.extends_chain)})" if env.extends_chain else ""),
           table(["pin", "value", "source"], rows)]
    if env.nccl_override:
        out.append(f"note: NCCL {env.nccl.value} overrides the {env.nccl_default} that torch pins")
    if env.nccl_tests:
        out.append(nccl_tests_line(env))
    out.append(f"spec sha256: {env.spec_hash}")
    return "\n".join(out)


def nccl_tests_line(env: Environment) -> str:
    """What `nccl_tests:` builds into the image and what it costs in image size (shipyard/data/nccl_tests.yaml)."""
    nt = env.nccl_tests
    data = facts.load("nccl_tests")
    size = data["size_mb"]
    mpi_mb = size["mpi"].get(nt.mpi, 0)
    compiler = ("/usr/local/cuda of the devel base" if nt.compiler == "cuda-image"
                else f"pip's CUDA {env.cuda.value} compiler wheels, used for the build only")
    return (f"nccl-tests {nt.version} (commit {nt.commit[:12]}, sha256 {nt.sha256[:12]}) in {data['prefix']}/bin, "
            f"against torch's NCCL {env.nccl.value or '(the wheel torch brings)'}, MPI: {nt.mpi}, compiler: {compiler}; image size: about "
            f"+{size['binaries'] + mpi_mb} MB ({size['binaries']} MB binaries as measured for one GPU architecture, "
            "more for the release's default list"
            + (f"; {mpi_mb} MB {nt.mpi} packages" if mpi_mb else "") + f"; source {nt.source})")


def facts_line() -> str:
    """When the compatibility facts were last reviewed, the newest of them, and what refreshes them."""
    newest = ", ".join(f"{k} {v}" for k, v in compat.newest_known().items())
    return (f"facts: compat.yaml reviewed {compat.review()['date']}; newest known: {newest}; refresh the "
            f"PyPI-derived facts with: {compat.review()['refresh']} (the others by hand: docs/facts.md)")


def select(problems, env_name: str | None, cluster_name: str | None) -> list:
    """The problems about ``env_name`` (and environment-less ones) on ``cluster_name`` (and cluster-less ones),
    ERRORs first: what `invoke check ENV --cluster C` shows and what the enforcing commands judge."""
    out = [p for p in problems
           if (not env_name or p.environment in (env_name, "")) and (not cluster_name or p.cluster in (cluster_name, ""))]
    out.sort(key=lambda p: (p.severity != compat.ERROR, p.environment, p.cluster, p.key))
    return out


def table_text(reg, problems, n_env: int, n_clusters: int) -> tuple[str, int]:
    """The check table and its summary line (lines ending in newlines), and the number of ERRORs."""
    errors = sum(p.severity == compat.ERROR for p in problems)
    warns = len(problems) - errors
    text = ""
    if problems:
        text = table(["severity", "environment", "cluster", "key", "problem"],
                     [[p.severity, p.environment or "-", p.cluster or "-", p.key, p.message] for p in problems]) + "\n"
    text += f"{reg.path}: {n_env} environment(s), {n_clusters} cluster(s): {errors} error(s), {warns} warning(s)\n"
    return text, errors

