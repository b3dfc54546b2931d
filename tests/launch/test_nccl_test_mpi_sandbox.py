"""The sandbox's Slurm offers the MPI plugins nccl-test launchers use (clusters.NAME.mpi), and a 2-node step starts
with the one the sandbox's registry entry names (none: nccl-tests' own mode, one task per node) and with pmi2
(Debian's slurm-wlm-basic-plugins), whose ranks get the PMI environment it promises.

The sandbox uses none, not pmi2, because the images' Open MPI (Debian's 4.1) has no s1/s2 PMI component: under
--mpi=pmi2 every rank stops in MPI_Init (docs/nccl-tests.md). pmix is listed once Debian's libpmix-dev is installed
(Slurm's mpi_pmix_v4 opens <pmix2>/lib/libpmix.so, the unversioned link that only the -dev package ships;
shipyard/data/test-packages.txt), but a 2-node pmix step does not start here (2026-12-01: "task 1 launch failed",
both nodes' PMIx servers on one host)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slurm]


def test_srun_lists_the_plugins(sandbox):
    res = sandbox.run(["srun", "--mpi=list"], client_timeout=60)
    text = res.stdout + res.stderr
    for plugin in ("pmi2", "pmix", "none"):
        assert plugin in text, text


@pytest.mark.parametrize("plugin,variable", [("none", "SLURM_PROCID"), ("pmi2", "PMI_FD")])
def test_a_two_node_step_starts_with_the_plugin(sandbox, plugin, variable):
    res = sandbox.run(["srun", f"--mpi={plugin}", "--nodes=2", "--ntasks-per-node=1", "--time=1",
                       "bash", "-c", f'echo "rank $SLURM_PROCID {variable}=${{{variable}:-unset}}"'],
                      client_timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = sorted(res.stdout.split("\n")[:-1])
    assert [ln.split()[1] for ln in lines] == ["0", "1"], res.stdout + res.stderr
    assert all("=unset" not in ln for ln in lines), res.stdout
