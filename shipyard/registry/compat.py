"""Compatibility facts (shipyard/data/compat.yaml) and the checks that read them.

The checks refuse combinations that cannot work *before* a build: a torch/CUDA variant that has no wheel, a base
image tag that nvidia/cuda never published, a driver too old for the CUDA major, a GPU arch missing from the wheel,
EFA with too old a CUDA/NCCL. Facts marked unknown in the data give a WARN ("not verified"), never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shipyard import facts as data
from shipyard.registry.model import Cluster, Environment

ERROR = "ERROR"
WARN = "WARN"


@dataclass(frozen=True)
class Problem:
    """One finding of `invoke check`."""

    severity: str  # ERROR | WARN
    environment: str
    cluster: str  # "" when not cluster-specific
    key: str  # the registry key the finding is about, e.g. environments.pytorch-2.3.cuda
    message: str


def facts() -> dict:
    """The compatibility data file (shipyard/data/compat.yaml), parsed once per process."""
    return data.load("compat")


def vtuple(version: str) -> tuple[int, ...]:
    """'12.4.1' -> (12, 4, 1); non-numeric parts compare as 0 (only used on validated versions)."""
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", str(version)) if p != "")


def series(torch_version: str) -> str:
    """'2.3.1' -> '2.3'."""
    return ".".join(str(torch_version).split(".")[:2])


def torch_series(torch_version: str) -> dict | None:
    return facts()["torch"].get(series(torch_version))


def known_torch_versions() -> list[str]:
    return [p for s in facts()["torch"].values() for p in s["patches"]]


def cuda_facts(cuda: str) -> dict | None:
    return facts()["cuda"].get(cuda)


def cudnn_tag_for(image_version: str) -> str:
    """The cudnn spelling nvidia/cuda used for a full image version (cudnn8, cudnn9 or cudnn)."""
    for rule in facts()["cudnn_tag_rules"]:
        if vtuple(image_version) <= vtuple(rule["upto"]):
            return rule["tag"]
    return "cudnn"


def nccl_package(cuda: str) -> str:
    """The pip wheel that carries NCCL for a CUDA major: nvidia-nccl-cu11 / -cu12 / -cu13."""
    return f"nvidia-nccl-cu{cuda.split('.')[0]}"


def cuda_image_tag(cuda: str, flavor: str, cudnn: bool, os_name: str) -> str | None:
    """Derive ``nvidia/cuda:<X.Y.Z>[-cudnnN]-<flavor>-ubuntuYY.MM`` from the data, or None if unknown."""
    cf = cuda_facts(cuda)
    if not cf or not cf.get("image"):
        return None
    parts = [cf["image"]]
    if cudnn:
        parts.append(cudnn_tag_for(cf["image"]))
    parts += [flavor, os_name]
    return "nvidia/cuda:" + "-".join(parts)


_CUDA_TAG = re.compile(
    r"^(?:docker\.io/)?nvidia/cuda:(?P<ver>\d+\.\d+\.\d+)(?:-(?P<cudnn>cudnn\d*))?-(?P<flavor>base|runtime|devel)"
    r"-ubuntu(?P<ubuntu>\d+\.\d+)$"
)


def check_cuda_image(ref: str) -> list[str]:
    """Problems with an ``nvidia/cuda:`` tag against the published scheme; [] when it fits.

    Returns ["not-cuda"] for references that are not nvidia/cuda images (the caller only warns then).
    """
    m = _CUDA_TAG.match(ref)
    if not m:
        if re.match(r"^(?:docker\.io/)?nvidia/cuda:", ref):
            return [
                f"base image {ref!r} does not fit the nvidia/cuda scheme "
                "X.Y.Z[-cudnn8|-cudnn9|-cudnn]-{base|runtime|devel}-ubuntuYY.MM"
            ]
        return ["not-cuda"]
    ver, cudnn, flavor, ubuntu = m["ver"], m["cudnn"], m["flavor"], m["ubuntu"]
    out = []
    minor = ".".join(ver.split(".")[:2])
    cf = cuda_facts(minor)
    if cf is None:
        known = ", ".join(sorted(facts()["cuda"], key=vtuple))
        return [f"base image {ref!r}: CUDA {minor} is not in the compatibility data (known: {known})"]
    if cf.get("image") and cf["image"] != ver:
        out.append(f"base image {ref!r}: the data knows nvidia/cuda {cf['image']} for CUDA {minor}, not {ver}")
    if cudnn:
        want = cudnn_tag_for(ver)
        if flavor == "base":
            out.append(f"base image {ref!r}: nvidia/cuda publishes cuDNN only with runtime/devel, not base")
        elif cudnn != want:
            out.append(f"base image {ref!r}: CUDA {ver} images spell cuDNN as '-{want}-', not '-{cudnn}-'")
    if ubuntu not in cf.get("ubuntu", []):
        have = ", ".join(cf.get("ubuntu", [])) or "none known"
        out.append(f"base image {ref!r}: nvidia/cuda {minor} is published for Ubuntu {have}, not {ubuntu}")
    return out


def _fmt_variants(variants: list[str]) -> str:
    return ", ".join("cu" + v.replace(".", "") for v in variants)


def check_environment(env: Environment) -> list[Problem]:
    """Checks that need only the environment: the wheel combination exists and the base image tag is real."""
    out: list[Problem] = []
    key = f"environments.{env.name}"

    def err(sub: str, msg: str, sev: str = ERROR) -> None:
        out.append(Problem(sev, env.name, "", f"{key}.{sub}", msg))

    torch = env.torch.value or ""
    ts = torch_series(torch)
    if ts is None or torch not in ts["patches"]:
        near = [v for v in known_torch_versions() if v.startswith(series(torch) + ".")] or known_torch_versions()[-6:]
        err("torch", f"torch {torch} is not a known release (known: {', '.join(near)})")
        return out  # everything else depends on the series
    cuda = env.cuda.value or ""
    variants = ts.get("cuda_variants")
    if variants is None:
        if cuda != ts["default_cuda"]:
            err("cuda", f"torch {torch} with CUDA {cuda}: only the default variant "
                f"cu{ts['default_cuda'].replace('.', '')} is known for torch {series(torch)}; not verified", WARN)
    elif cuda not in variants:
        err("cuda", f"torch {torch} has no CUDA {cuda} wheel (cu{cuda.replace('.', '')}); "
            f"variants that exist: {_fmt_variants(variants)}")
    py = env.python.value or ""
    if py not in ts["python"]:
        err("python", f"torch {torch} has no wheel for Python {py} (supported: {', '.join(ts['python'])})")
    tv = env.torchvision
    want_tv = ts["torchvision"].get(torch)
    if tv.value is not None and want_tv is not None and tv.value != want_tv:
        err("torchvision", f"torchvision {tv.value} does not match torch {torch} (the companion release is {want_tv})")
    ta = env.torchaudio
    want_ta = ts["torchaudio"].get(torch)
    if ta.value is not None and torch in ts["torchaudio"] and want_ta is None:
        err("torchaudio", f"torchaudio was not published for torch {torch}; remove the key or set it to false")
    elif ta.value is not None and want_ta is not None and ta.value != want_ta:
        err("torchaudio", f"torchaudio {ta.value} does not match torch {torch} (the companion release is {want_ta})")
    nccl = env.nccl.value
    if ts.get("nccl_static") and nccl and nccl != ts["nccl"]:
        err("nccl", f"torch {torch} links NCCL {ts['nccl']} statically; another NCCL cannot be swapped in")
    elif env.nccl_override:
        err("nccl", f"NCCL {nccl} overrides the {ts['nccl']} that torch {torch} pins: the definition installs it "
            f"after torch with --no-deps and pip check will report the mismatch", WARN)
    cf = cuda_facts(cuda)
    if cf is None:
        err("cuda", f"CUDA {cuda} is not in the compatibility data (known: {', '.join(sorted(facts()['cuda'], key=vtuple))})")
    if env.base_is_cuda_image:
        for msg in check_cuda_image(env.base.value or ""):
            if msg != "not-cuda":
                err("base" if env.base.source != COMPAT_DERIVED else "os", msg)
    elif env.base.source == COMPAT_OS_BASE:
        pass  # the OS's own base image; CUDA comes from the torch wheel's nvidia-* packages
    elif env.base.value is None:
        err("cuda", f"no nvidia/cuda image is known for CUDA {cuda}; set `base` explicitly")
    else:
        err("base", f"base image {env.base.value!r} is not an nvidia/cuda tag: its CUDA, OS and Python are not "
            "verified against the pins", WARN)
    glibc_min = ts.get("min_glibc")
    os_facts = facts()["os"].get(env.os.value or "", {})
    if env.stack == "shipyard" and os_facts and py != os_facts.get("system_python") \
            and not os_facts.get("python_ppa"):
        err("python", f"{env.os.value} ships Python {os_facts.get('system_python')} only (no PPA for other "
            f"versions); use python: \"{os_facts.get('system_python')}\" or an Ubuntu os")
    if glibc_min and os_facts.get("glibc") and vtuple(os_facts["glibc"]) < vtuple(glibc_min):
        err("os", f"torch {torch} wheels need glibc >= {glibc_min}; {env.os.value} has {os_facts['glibc']}")
    return out


COMPAT_DERIVED = "compat data (derived nvidia/cuda tag)"
COMPAT_OS_BASE = "compat data (the OS's own base image; CUDA from the torch wheel's pip packages)"


def os_base(os_name: str) -> str | None:
    """The plain OS base image of an OS whose CUDA comes from pip wheels (debian12), else None."""
    return (facts()["os"].get(os_name) or {}).get("base")


def _arch_ok(env: Environment, sm: int) -> str | None:
    """None if the wheel runs on sm_XX, else why not."""
    ts = torch_series(env.torch.value or "")
    if ts is None:
        return None
    cuda = env.cuda.value or ""
    arch = facts()["arches"].get(sm)
    if arch:
        if vtuple(cuda) < vtuple(arch["cuda_min"]):
            return f"sm_{sm} needs CUDA >= {arch['cuda_min']}, the wheel has {cuda}"
        if arch.get("cuda_max") and vtuple(cuda) > vtuple(arch["cuda_max"]):
            return f"CUDA {cuda} no longer compiles for sm_{sm} (last: {arch['cuda_max']})"
    if cuda == ts["default_cuda"] and sm not in ts["arches"]:
        return (f"the torch {env.torch.value} wheel is built for sm_{', sm_'.join(map(str, ts['arches']))}, "
                f"not sm_{sm}")
    return None


def check_on_cluster(env: Environment, cluster: Cluster) -> list[Problem]:
    """Checks of an environment against one cluster it is used on: driver, GPU arch, fabric."""
    out: list[Problem] = []
    ts = torch_series(env.torch.value or "")
    cf = cuda_facts(env.cuda.value or "")

    def add(sev: str, key: str, msg: str) -> None:
        out.append(Problem(sev, env.name, cluster.name, key, msg))

    ckey = f"clusters.{cluster.name}"
    if cluster.driver and cf:
        need = cf["driver_min"]
        if vtuple(cluster.driver) < vtuple(need):
            major = (env.cuda.value or "").split(".")[0]
            add(ERROR, f"{ckey}.driver", f"driver {cluster.driver} is too old for CUDA {env.cuda.value} "
                f"(CUDA {major}.x needs >= {need})")
        elif cf.get("driver_full") and vtuple(cluster.driver) < vtuple(cf["driver_full"]):
            add(WARN, f"{ckey}.driver", f"driver {cluster.driver} runs CUDA {env.cuda.value} only in minor-version "
                f"compatibility (full compatibility needs >= {cf['driver_full']}); PTX JIT of newer code may fail")
    elif cluster.gpus and not cluster.driver:
        add(WARN, f"{ckey}.driver", "no driver version in the cluster profile: driver compatibility not checked")
    if ts:
        for gpu in cluster.gpus:
            why = _arch_ok(env, gpu.sm)
            if why:
                add(ERROR, f"{ckey}.gpus", f"{gpu.model} ({gpu.arch}) cannot run {env.name}: {why}")
            elif env.cuda.value != ts["default_cuda"] and gpu.sm not in ts["arches"]:
                add(WARN, f"{ckey}.gpus", f"{gpu.model} ({gpu.arch}): the arch list of the {env.cuda_variant} "
                    "wheel is not verified")
    if cluster.fabric == "efa":
        efa = facts()["efa"]
        if vtuple(env.cuda.value or "0") < vtuple(efa["min_cuda"]):
            add(ERROR, f"{ckey}.fabric", f"EFA needs CUDA >= {efa['min_cuda']}, {env.name} has {env.cuda.value}")
        if env.nccl.value and vtuple(env.nccl.value) < vtuple(efa["min_nccl"]):
            add(ERROR, f"{ckey}.fabric", f"EFA needs NCCL >= {efa['min_nccl']}, {env.name} has {env.nccl.value}")
        inst = cluster.fabric_options.get("efa_installer")
        ofi = cluster.fabric_options.get("aws_ofi_nccl")
        if inst:
            known = efa["installers"].get(str(inst))
            if known and known.get("bad"):
                add(ERROR, f"{ckey}.fabric_options.efa_installer", f"EFA installer {inst}: {known['bad']}")
            if known and not ofi:
                ofi = known["aws_ofi_nccl"]
        if ofi and vtuple(str(ofi)) < vtuple(efa["min_aws_ofi_nccl"]):
            add(ERROR, f"{ckey}.fabric_options.aws_ofi_nccl",
                f"aws-ofi-nccl {ofi} is too old for p5/EFA (needs >= {efa['min_aws_ofi_nccl']})")
    return out


def check_all(reg) -> list[Problem]:
    """Every problem in the registry at once: each environment, then each (environment, cluster) it is used on."""
    problems: list[Problem] = []
    for env in reg.environments.values():
        problems += check_environment(env)
        names = env.clusters if env.clusters is not None else tuple(reg.clusters)
        for cname in names:
            cluster = reg.clusters.get(cname)
            if cluster is None:
                problems.append(Problem(ERROR, env.name, cname, f"environments.{env.name}.clusters",
                                        f"unknown cluster {cname!r} (known: {', '.join(reg.clusters)})"))
                continue
            problems += check_on_cluster(env, cluster)
    for cname, cluster in reg.clusters.items():
        parts = set(cluster.partitions)
        for attr in ("partition", "interactive_partition", "build_partition"):
            p = getattr(cluster, attr)
            if p not in parts:
                problems.append(Problem(ERROR, "", cname, f"clusters.{cname}.scheduler.{attr}",
                                        f"partition {p!r} is not in scheduler.partitions ({', '.join(cluster.partitions)})"))
        if cluster.gpus_per_node and cluster.runtime != "host" and not cluster.gpus:
            problems.append(Problem(WARN, "", cname, f"clusters.{cname}.gpus",
                                    "no GPU models listed: arch compatibility not checked"))
    return problems
