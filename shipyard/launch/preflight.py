"""The job's preflight: what each node must offer before torchrun starts there, from the facts `invoke check` uses.

`invoke check` compares the environment with the cluster profile before the build. The nodes of an allocation may
differ from that profile (one node with an older driver, another GPU generation, fewer GPUs visible), and then the
job fails minutes later with an error that names something else ("CUDA driver version is insufficient", "no kernel
image is available"). So the launcher carries the same facts (shipyard/data/compat.yaml: the CUDA variant's minimum
driver, the wheel's SASS and PTX arches) and each node compares them with what nvidia-smi reports, inside the
container, before torchrun: a mismatch stops the job within seconds with one line per node.

``node_checks`` is a pure function of the model objects; the shell that runs the comparison is
templates/preflight.sh.j2.
"""

from __future__ import annotations

from dataclasses import dataclass

from shipyard import facts
from shipyard.errors import ShipyardError
from shipyard.registry import compat
from shipyard.registry.model import Cluster, Environment

ON, OFF = "on", "off"


@dataclass(frozen=True)
class NodeChecks:
    """What every node is held to. An empty ``driver_min`` or ``arches`` means "not checked" (no fact, or an
    external image whose CUDA and wheel shipyard does not know)."""

    gpus: int  # the GPUs each node must show (--gpus-per-node)
    cuda: str  # the image's CUDA variant, named in the failure line
    driver_min: str  # the minimum driver for that CUDA (compat.yaml cuda.X.driver_min)
    wheel: str  # "torch 2.3.1" or "torch 2.11.0+cu126": named in the failure line
    arches: tuple[int, ...]  # SASS arches of the wheel (sm_XY as XY)
    ptx: tuple[int, ...]  # PTX arches of the wheel (JIT-compiled for newer GPUs)
    unchecked: str  # what is not checked and why ("" when everything is)
    grace: int  # seconds a failing node waits before exiting, so that the other nodes' lines reach the log


def data() -> dict:
    """shipyard/data/launch.yaml's ``preflight``."""
    return facts.load("launch")["preflight"]


def wanted(flag: str | None, gpus: int) -> bool:
    """``--preflight on|off``; not given: on when the job asks for GPUs."""
    if flag is None:
        return gpus > 0
    if flag not in (ON, OFF):
        raise ShipyardError(f"--preflight {flag!r}: expected {ON} or {OFF}")
    return flag == ON


def node_checks(env: Environment, cluster: Cluster, gpus: int, external_image: bool) -> NodeChecks:
    """The facts the nodes of ``cluster`` are held to for ``env`` with ``gpus`` GPUs each. ``external_image``
    (``--image``): the image is not the environment's build, so only the GPU count is checked."""
    skipped = []
    cuda = env.cuda.value or ""
    torch = env.torch.value or ""
    driver_min, arches, ptx, wheel = "", (), (), ""
    if external_image:
        skipped.append("driver and GPU arch (an external --image: its CUDA and wheel are not known)")
    else:
        cf = compat.cuda_facts(cuda)
        if cf and cf.get("driver_min"):
            driver_min = str(cf["driver_min"])
        else:
            skipped.append(f"driver (no minimum known for CUDA {cuda or 'unknown'})")
        ts = compat.torch_series(torch)
        sass, jit = compat.variant_arches(torch, cuda) if ts else (None, None)
        if sass:
            arches, ptx = tuple(int(a) for a in sass), tuple(int(p) for p in jit or ())
            wheel = f"torch {torch}" if cuda == ts["default_cuda"] else f"torch {torch}+{compat.variant_tag(cuda)}"
        else:
            skipped.append(f"GPU arch (the arch list of torch {torch or 'unknown'} for CUDA {cuda or 'unknown'} is "
                           "not verified)")
    return NodeChecks(gpus=gpus, cuda=cuda, driver_min=driver_min, wheel=wheel, arches=arches, ptx=ptx,
                      unchecked="; ".join(skipped), grace=int(data()["grace_s"]))
