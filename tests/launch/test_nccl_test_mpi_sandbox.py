"""The sandbox's Slurm offers the MPI plugins nccl-test launchers use (clusters.NAME.mpi), and a 2-node step starts
with the one the sandbox's registry entry names (pmi2, Debian's slurm-wlm-basic-plugins): every rank gets the PMI
environment its plugin promises.

pmix is listed once Debian's libpmix-dev is installed (Slurm's mpi_pmix_v4 opens <pmix2>/lib/libpmix.so, the
unversioned link that only the -dev package ships; shipyard/data/test-packages.txt). A 2-node pmix step does not start
here (2026-12-01: "task 1 launch failed", both nodes' PMIx servers on one host), which is why the sandbox uses pmi2."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slurm]


def test_srun_lists_the_plugins(sandbox):
    res = sandbox.run(["srun", "--mpi=list"], client_timeout=60)
    text = res.stdout + res.stderr
    for plugin in ("pmi2", "pmix", "none"):
        assert plugin in text, text


@pytest.mark.parametrize("plugin,variable", [("pmi2", "PMI_FD")])
def test_a_two_node_step_starts_with_the_plugin(sandbox, plugin, variable):
    res = sandbox.run(["srun", f"--mpi={plugin}", "--nodes=2", "--ntasks-per-node=1", "--time=1",
                       "bash", "-c", f'echo "rank $SLURM_PROCID {variable}=${{{variable}:-unset}}"'],
                      client_timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = sorted(res.stdout.split("\n")[:-1])
    assert [ln.split()[1] for ln in lines] == ["0", "1"], res.stdout + res.stderr
    assert all("=unset" not in ln for ln in lines), res.stdout
