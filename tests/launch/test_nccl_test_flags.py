"""`invoke nccl-test`'s own flags: --binary, --sizes, --iters, --check (defaults in shipyard/data/launch.yaml), and
the cluster's MPI plugin (clusters.NAME.mpi: pmix, pmi2, none), in golden launchers; bad values refused in one line."""

from __future__ import annotations

import pytest
from fixtures_launch import FAKE_ROOT, LAUNCH_REGISTRY, build_launcher
from helpers_registry import GOLDEN, golden

from shipyard import registry
from shipyard.errors import ShipyardError
from shipyard.launch import launcher


def _reg(mpi: str | None = None):
    text = LAUNCH_REGISTRY
    if mpi:
        text = text.replace("  lab-socket:\n    runtime: host\n", f"  lab-socket:\n    runtime: host\n    mpi: {mpi}\n")
    return registry.load_text(text, "registry.yaml", path=FAKE_ROOT / "registry.yaml")


def test_golden_nccl_test_with_the_course_flags():
    l = build_launcher(_reg(), cluster="lab-socket", nodes=2, kind="nccl-test", binary="all_gather_perf",
                       sizes="128M:4G", iters="20", check="0")
    text = launcher.render(l)
    assert "  all_gather_perf -b 128M -e 4G -f 2 -g 1 -c 0 -n 20 &" in text
    assert "--binary all_gather_perf --sizes 128M:4G --iters 20 --check 0" in text  # the "regenerate with" line
    golden(GOLDEN / "launch" / "nccl-test-flags.sbatch", text)


@pytest.mark.parametrize("mpi", ["pmi2", "none"])
def test_golden_nccl_test_per_cluster_mpi(mpi):
    text = launcher.render(build_launcher(_reg(mpi), cluster="lab-socket", nodes=2, kind="nccl-test"))
    assert f"srun --mpi={mpi} " in text
    if mpi == "none":  # one process per node drives both GPUs
        assert "#SBATCH --ntasks-per-node=1" in text and " -g 2 " in text
    golden(GOLDEN / "launch" / f"nccl-test-mpi-{mpi}.sbatch", text)


@pytest.mark.parametrize("flags,message", [
    (dict(binary="rm -rf /"), r"^--binary 'rm -rf /': not an nccl-tests binary \(valid: all_gather_perf, "),
    (dict(sizes="128M-4G"), r"^--sizes '128M-4G': expected MIN:MAX sizes like 128M:4G"),
    (dict(sizes="1G:$(id)"), r"^--sizes '1G:\$\(id\)': expected MIN:MAX"),
    (dict(iters="0"), r"^--iters 0: must be at least 1"),
    (dict(check="yes"), r"^--check 'yes': expected 1"),
])
def test_bad_values_are_refused_in_one_line(flags, message):
    with pytest.raises(ShipyardError, match=message) as e:
        build_launcher(_reg(), cluster="lab-socket", nodes=2, kind="nccl-test", **flags)
    assert "\n" not in str(e.value)


def test_a_cluster_mpi_outside_the_schema_is_refused():
    with pytest.raises(ShipyardError, match=r"clusters\.lab-socket\.mpi: 'openmpi' is not one of: pmix, pmi2, none"):
        _reg("openmpi")
