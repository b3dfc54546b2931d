"""Compatibility facts (shipyard/data/compat.yaml) and the checks that read them.

The checks refuse combinations that cannot work *before* a build: a torch/CUDA variant that has no wheel, a base
image tag that nvidia/cuda never published, a driver too old for the CUDA major, a GPU arch missing from the wheel,
an image without the fast fabric's userspace or EFA below its floors (registry/fabric_checks.py). Facts marked
unknown in the data give a WARN ("not verified"), never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shipyard import facts as data
from shipyard.registry import fabric_checks, runtime_checks
from shipyard.registry.model import Cluster, Environment, vtuple

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


def same_version(a: str, b: str) -> bool:
    """'1.29' and '1.29.0' are the same version."""
    return vtuple(a) == vtuple(b)


def series(torch_version: str) -> str:
    """'2.3.1' -> '2.3'."""
    return ".".join(str(torch_version).split(".")[:2])


def torch_series(torch_version: str) -> dict | None:
    return facts()["torch"].get(series(torch_version))


def known_torch_versions() -> list[str]:
    return [p for s in facts()["torch"].values() for p in s["patches"]]


def cuda_facts(cuda: str) -> dict | None:
    return facts()["cuda"].get(cuda)


def review() -> dict:
    """When the facts were last checked against their sources and the command that refreshes what it can."""
    return facts()["review"]


def newest_known() -> dict[str, str]:
    """The newest torch release, CUDA minor and NCCL the facts know: what `show`/`check` print beside the date."""
    nccls = {str(e["nccl"]) for e in (facts().get("wheels") or {}).values() if e.get("nccl")}
    nccls |= {str(e["version"]) for req, e in (facts().get("pypi_releases") or {}).items()
              if req.startswith("nvidia-nccl-")}  # the NCCL releases PyPI had at the review
    return {"torch": max(known_torch_versions(), key=vtuple), "CUDA": max(facts()["cuda"], key=vtuple),
            "NCCL": max(nccls, key=vtuple)}


def newer_than_facts(kind: str, version: str) -> str | None:
    """"torch 2.16.0 is newer than the facts (reviewed DATE)" when ``version`` is past the newest ``kind`` the data
    knows ("torch", "CUDA" or "NCCL"): the data is behind, not the registry wrong. None otherwise."""
    try:
        newer = vtuple(version) > vtuple(newest_known()[kind])
    except ValueError:  # not a version at all: the caller's "unknown" message says what is valid
        return None
    if not newer:
        return None
    return f"{kind} {version} is newer than the facts (reviewed {review()['date']}; refresh: docs/facts.md)"


def variant_arches(torch_version: str, cuda: str) -> tuple[list[int] | None, list[int] | None]:
    """(SASS arches, PTX arches) of the wheel the environment installs: the series' lists for the default variant,
    the variant's own `wheels:` entry otherwise; None where not verified (a variant never borrows the default's)."""
    ts = torch_series(torch_version) or {}
    if cuda == ts.get("default_cuda"):
        return ts.get("arches"), ts.get("ptx")
    return wheel_fact(torch_version, cuda, "arches"), wheel_fact(torch_version, cuda, "ptx")


def driver_branch(driver: str) -> int | None:
    """The branch of a Linux driver version: its first number ('615.20.01' -> 615); None if it has none."""
    head = str(driver).split(".")[0]
    return int(head) if head.isdigit() else None


def variant_tag(cuda: str) -> str:
    """'12.8' -> 'cu128'."""
    return "cu" + str(cuda).replace(".", "")


def variant_index(cuda: str) -> str:
    """The PyTorch wheel index of a CUDA variant (compat.yaml refresh.variant_index)."""
    return facts()["refresh"]["variant_index"].format(variant=variant_tag(cuda))


# fields of a wheel that depend on its CUDA variant: a non-default variant never inherits them from the default wheel
VARIANT_FIELDS = ("nccl", "cudnn", "cuda_runtime", "arches", "ptx")
_ABSENT = object()


def wheel_keys(torch_version: str, cuda: str, field: str) -> list[str]:
    """The `wheels:` entries that may hold ``field`` for one wheel, most specific first."""
    ts = torch_series(torch_version)
    v = variant_tag(cuda)
    keys = [f"{torch_version}+{v}", f"{series(torch_version)}+{v}"]
    if ts is not None and (cuda == ts["default_cuda"] or field not in VARIANT_FIELDS):
        keys.append(str(torch_version))
    return keys


def wheel_lookup(torch_version: str, cuda: str, field: str) -> tuple[bool, object, str | None]:
    """(known, value, source mark) of one fact of the (torch patch, CUDA variant) wheel.

    known is False when no entry records the field: the caller WARNs "not verified". A recorded null is known
    (e.g. torchaudio: null = none was published).
    """
    wheels = facts().get("wheels") or {}
    for key in wheel_keys(torch_version, cuda, field):
        entry = wheels.get(key)
        if entry is not None and field in entry:
            return True, entry[field], entry.get(f"{field}_source", entry.get("source"))
    return False, None, None


def wheel_fact(torch_version: str, cuda: str, field: str):
    """One fact of the (torch patch, CUDA variant) wheel, or None when unknown / recorded as null."""
    return wheel_lookup(torch_version, cuda, field)[1]


def companion_pythons(name: str, version: str) -> list[str] | None:
    """Pythons with a Linux x86_64 wheel of torchvision/torchaudio ``version``; None when not verified."""
    entry = (facts().get("companions") or {}).get(name, {}).get(str(version))
    return None if entry is None else entry.get("python")


def companion_python_excludes(name: str, version: str) -> list[str]:
    """Python patch releases the companion's Requires-Python excludes (e.g. '3.14.1')."""
    entry = (facts().get("companions") or {}).get(name, {}).get(str(version)) or {}
    return list(entry.get("python_excludes") or [])


def arch_family_match(code: list[int], sm: int) -> int | None:
    """The best arch in ``code`` whose SASS runs on sm_XY: same major, minor <= the device's; None if none.

    CUDA binary compatibility: cubins for X.Y run on X.Z with Z >= Y, never across majors.
    """
    fits = [c for c in code if c // 10 == sm // 10 and c % 10 <= sm % 10]
    return max(fits) if fits else None


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


def image_flavours(version: str, os_name: str) -> dict | None:
    """The flavour set of the nvidia/cuda tags of ``version`` for ``os_name`` (compat.yaml cuda_images), or None."""
    row = (facts().get("cuda_images") or {}).get(version)
    if row is None or os_name not in row:
        return None
    return facts()["cuda_image_flavours"][row[os_name]]


def _image_problems(ref: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]] | None:
    """(errors, not-verified warnings) of an ``nvidia/cuda:`` tag against the table of tags that exist, each as
    (the environment key a derived tag's problem comes from, message); None for a non-nvidia/cuda reference."""
    m = _CUDA_TAG.match(ref)
    if not m:
        if re.match(r"^(?:docker\.io/)?nvidia/cuda:", ref):
            return [("base", f"base image {ref!r} does not fit the nvidia/cuda scheme "
                     "X.Y.Z[-cudnn8|-cudnn9|-cudnn]-{base|runtime|devel}-ubuntuYY.MM")], []
        return None
    ver, os_name = m["ver"], f"ubuntu{m['ubuntu']}"
    flavour = f"{m['cudnn']}-{m['flavor']}" if m["cudnn"] else m["flavor"]
    minor = ".".join(ver.split(".")[:2])
    cf = cuda_facts(minor)
    if cf is None:
        known = ", ".join(sorted(facts()["cuda"], key=vtuple))
        return [("cuda", f"base image {ref!r}: CUDA {minor} is not in the compatibility data (known: {known})")], []
    if ver != cf.get("image") and ver not in cf.get("eol", []):
        have = f"nvidia/cuda {cf['image']}" if cf.get("image") else "no nvidia/cuda image"
        return [("cuda", f"base image {ref!r}: the data knows {have} for CUDA {minor}, not {ver}")], []
    row = (facts().get("cuda_images") or {}).get(ver)
    if row is None:
        return [], [("cuda", f"base image {ref!r}: the tags of nvidia/cuda {ver} are not in the compatibility "
                     "data; not verified")]
    fs = image_flavours(ver, os_name)
    if fs is None:
        have = ", ".join(k for k in row if k != "source")
        return [("os", f"base image {ref!r}: nvidia/cuda {ver} is published for {have}, not {os_name}")], []
    if flavour in fs.get("unverified", []):
        return [], [("cuda_image", f"base image {ref!r}: whether nvidia/cuda {ver} has the {flavour} flavour for "
                     f"{os_name} is not in the compatibility data; not verified")]
    if flavour not in fs["exist"]:
        return [("cuda_image", f"base image {ref!r}: nvidia/cuda {ver} for {os_name} is published as "
                 f"{', '.join(fs['exist'])}; there is no {flavour} tag")], []
    return [], []


def check_cuda_image(ref: str) -> list[str]:
    """Errors of an ``nvidia/cuda:`` tag: its (version, OS, flavour) is not in the table of tags NVIDIA publishes
    (compat.yaml cuda_images); [] when it exists or is not verified.

    Returns ["not-cuda"] for references that are not nvidia/cuda images (the caller only warns then).
    """
    found = _image_problems(ref)
    return ["not-cuda"] if found is None else [msg for _, msg in found[0]]


def cuda_image_unverified(ref: str) -> list[str]:
    """Warnings for an ``nvidia/cuda:`` tag whose existence the data does not record either way."""
    found = _image_problems(ref)
    return [] if found is None else [msg for _, msg in found[1]]


def cuda_image_eol(ref: str) -> str | None:
    """A warning when ``ref`` is an end-of-life nvidia/cuda tag (NVIDIA deletes those): a superseded point release
    (naming the current tag) or a CUDA major NVIDIA no longer supports."""
    m = _CUDA_TAG.match(ref)
    if not m:
        return None
    ver = m["ver"]
    policy = facts()["cuda_image_policy"]
    major = int(ver.split(".")[0])
    if major not in policy["supported_majors"]:
        majors = " and ".join(str(x) for x in policy["supported_majors"])
        return (f"base image {ref!r} is end-of-life: NVIDIA supports images of CUDA {majors} only and deletes "
                f"end-of-life tags [{policy['source']}]; move to a CUDA {policy['supported_majors'][0]}+ wheel")
    cf = cuda_facts(".".join(ver.split(".")[:2])) or {}
    if ver not in cf.get("eol", []) or not cf.get("image"):
        return None
    current = ref.replace(f":{ver}-", f":{cf['image']}-", 1)
    return (f"base image {ref!r} is end-of-life: NVIDIA supports only the latest point release of each CUDA minor "
            f"and deletes end-of-life tags about six months later; use {current}")


def _fmt_variants(variants: list[str]) -> str:
    return ", ".join("cu" + v.replace(".", "") for v in variants)


def _variant_end_note(cuda: str, torch: str) -> str:
    """'; the last torch with a cu126 wheel is 2.14.1 (...)' when the variant ended before ``torch``'s series."""
    end = (facts().get("variant_ends") or {}).get(cuda)
    if not end or vtuple(series(torch)) <= vtuple(end["last_series"]):
        return ""
    last = torch_series(end["last_series"])["patches"][-1]
    return (f"; the last torch with a {variant_tag(cuda)} wheel is {last} "
            f"(the last release for sm_{', sm_'.join(map(str, end['arches']))})")


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
        what = newer_than_facts("torch", torch) or f"torch {torch} is not a known release"
        err("torch", f"{what} (known: {', '.join(near)})")
        return out  # everything else depends on the series
    cuda = env.cuda.value or ""
    variants = ts.get("cuda_variants")
    if variants is None:
        if cuda != ts["default_cuda"]:
            err("cuda", f"torch {torch} with CUDA {cuda}: only the default variant "
                f"cu{ts['default_cuda'].replace('.', '')} is known for torch {series(torch)}; not verified", WARN)
    elif cuda in (ts.get("cuda_variants_unadvertised") or []):
        err("cuda", f"torch {torch}'s {variant_tag(cuda)} wheels were built in PyTorch's test channel but are not "
            f"in its release matrix (RELEASE.md); not verified (advertised: {_fmt_variants(variants)})", WARN)
    elif cuda not in variants:
        err("cuda", f"torch {torch} has no CUDA {cuda} wheel (cu{cuda.replace('.', '')}); "
            f"variants that exist: {_fmt_variants(variants)}{_variant_end_note(cuda, torch)}")
    end = (facts().get("variant_ends") or {}).get(cuda)
    if end and series(torch) == end["last_series"] and cuda in (variants or []):
        last = torch_series(end["last_series"])["patches"][-1]
        err("cuda", f"CUDA {cuda} wheels end with torch {end['last_series']}: {last} is the last release with a "
            f"{variant_tag(cuda)} wheel (the last for sm_{', sm_'.join(map(str, end['arches']))}); a later torch "
            f"needs another variant, which does not run on those GPUs [{end['source'].split(':')[0]}]", WARN)
    py = env.python.value or ""
    known, pythons, _ = wheel_lookup(torch, cuda, "python")
    torch_has_py = bool(known and pythons and py in pythons)  # else the companions' Pythons are beside the point
    if not known or pythons is None:
        err("python", f"the Pythons of the torch {torch} wheels are not in the compatibility data; "
            f"Python {py} not verified", WARN)
    elif py not in pythons:
        err("python", f"torch {torch} has no wheel for Python {py} (supported: {', '.join(pythons)})")
    broken = facts().get("torchrun_broken", {}).get(series(torch), {})
    if py in broken.get("python", []):
        err("python", f"torch {torch} installs on Python {py}, but its torchrun stops at start there (every launcher "
            f"uses it; compat.yaml torchrun_broken): use torch >= 2.0 or Python "
            f"{', '.join(p for p in pythons or [] if p not in broken['python'])}")
    for name in ("torchvision", "torchaudio"):
        pin = getattr(env, name)
        known, want, _ = wheel_lookup(torch, cuda, name)
        if pin.value is None:
            continue
        if known and want is None:
            err(name, f"{name} was not published for torch {torch}; remove the key or set it to false")
            continue
        if want is not None and pin.value != want:
            err(name, f"{name} {pin.value} does not match torch {torch} (the companion release is {want})")
            continue
        pys = companion_pythons(name, pin.value)
        if not torch_has_py:
            continue
        if pys is None:
            err(name, f"the Pythons of {name} {pin.value} are not in the compatibility data; "
                f"Python {py} not verified", WARN)
        elif py not in pys:
            err(name, f"{name} {pin.value} has no wheel for Python {py} (it has {', '.join(pys)}); "
                f"use one of those Pythons or set {name}: false")
        excluded = [x for x in companion_python_excludes(name, pin.value) if series(x) == py]
        if excluded and py in (pys or []):
            err(name, f"{name} {pin.value} excludes Python {', '.join(excluded)} (its Requires-Python): the image's "
                f"Python {py} must not be that patch release", WARN)
    nccl = env.nccl.value
    static = ts.get("nccl_static")
    wheel_nccl = wheel_fact(torch, cuda, "nccl")
    if static and nccl and wheel_nccl and nccl != wheel_nccl:
        err("nccl", f"torch {torch} links NCCL {wheel_nccl} statically; another NCCL cannot be swapped in")
    elif env.nccl_override:
        err("nccl", f"NCCL {nccl} overrides the {env.nccl_default} that the {env.cuda_variant} wheel of torch "
            f"{torch} pins: the definition installs it after torch with --no-deps and pip check will report the "
            "mismatch", WARN)
        newer = newer_than_facts("NCCL", nccl or "")
        if newer:
            err("nccl", f"{newer}: no NCCL release that new is in the compatibility data; not verified", WARN)
    elif wheel_nccl is None and not static:
        what = f"NCCL {nccl} is" if nccl else "no NCCL version is asserted:"
        err("nccl", f"the NCCL that the {env.cuda_variant} wheel of torch {torch} pins is not in the compatibility "
            f"data; {what} not verified", WARN)
    cf = cuda_facts(cuda)
    if cf is None:
        what = newer_than_facts("CUDA", cuda) or f"CUDA {cuda} is not in the compatibility data"
        err("cuda", f"{what} (known: {', '.join(sorted(facts()['cuda'], key=vtuple))})")
    if env.base_is_cuda_image:
        derived = env.base.source == COMPAT_DERIVED
        errs, warns = _image_problems(env.base.value or "") or ([], [])
        for sev, found in ((ERROR, errs), (WARN, warns)):
            for field, msg in found:
                err(field if derived else "base", msg, sev)
        eol = cuda_image_eol(env.base.value or "")
        if eol:
            err("base" if env.base.source != COMPAT_DERIVED else "cuda", eol, WARN)
    elif env.base.source == COMPAT_OS_BASE:
        pass  # the OS's own base image; CUDA comes from the torch wheel's nvidia-* packages
    elif env.base.value is None:
        err("cuda", f"no nvidia/cuda image is known for CUDA {cuda}; set `base` explicitly")
    else:
        err("base", f"base image {env.base.value!r} is not an nvidia/cuda tag: its CUDA, OS and Python are not "
            "verified against the pins", WARN)
    plain = os_base(env.os.value or "")
    if env.stack == "base" and plain and env.base.value == plain:
        err("stack", f"stack: base runs the Python and torch of the base image, and {plain} (the plain "
            f"{env.os.value} image) has no torch; use stack: shipyard, or a base image that carries torch")
    glibc_min = wheel_fact(torch, cuda, "min_glibc")
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
    """None if the wheel runs on sm_XY, else why not. GPUs are judged by family (see :func:`arch_family_match`)."""
    ts = torch_series(env.torch.value or "")
    if ts is None:
        return None
    cuda = env.cuda.value or ""
    table = facts()["arches"]
    # the arches of sm's family that this CUDA can compile for (only those with a known CUDA range count)
    family = [a for a in table if a // 10 == sm // 10 and a % 10 <= sm % 10 and table[a].get("cuda_min")]
    if family:
        too_new = [a for a in family if vtuple(cuda) < vtuple(table[a]["cuda_min"])]
        too_old = [a for a in family if table[a].get("cuda_max") and vtuple(cuda) > vtuple(table[a]["cuda_max"])]
        if len(too_new) == len(family):
            need = min(table[a]["cuda_min"] for a in family)
            return f"sm_{sm} needs CUDA >= {need}, the wheel has {cuda}"
        if len(too_old) == len(family):
            last = max((table[a]["cuda_max"] for a in family), key=vtuple)
            return f"CUDA {cuda} no longer compiles for sm_{sm} (last: {last})"
    arches, ptx = variant_arches(env.torch.value or "", cuda)
    if arches is not None and arch_family_match(arches, sm) is None:
        if ptx and any(p <= sm for p in ptx):
            return None  # PTX is JIT-compiled for newer GPUs; check_on_cluster warns about it
        note = "" if ptx is not None else "; PTX in the wheel not verified"
        wheel = env.torch.value if cuda == ts["default_cuda"] else f"{env.torch.value}+{variant_tag(cuda)}"
        return (f"the torch {wheel} wheel is built for sm_{', sm_'.join(map(str, arches))}, "
                f"none of which runs on sm_{sm} (needs the same major and a minor <= {sm % 10}){note}")
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
        elif cf.get("driver_branch") and (driver_branch(cluster.driver) or 0) < cf["driver_branch"]:
            add(WARN, f"{ckey}.driver", f"driver {cluster.driver} (branch R{driver_branch(cluster.driver)}) runs "
                f"CUDA {env.cuda.value} only in minor-version compatibility: its new features and newly enabled "
                f"platforms need an R{cf['driver_branch']} or later driver")
        elif cf.get("driver_full") and vtuple(cluster.driver) < vtuple(cf["driver_full"]):
            add(WARN, f"{ckey}.driver", f"driver {cluster.driver} runs CUDA {env.cuda.value} only in minor-version "
                f"compatibility (full compatibility needs >= {cf['driver_full']}); PTX JIT of newer code may fail")
    elif cluster.gpus and not cluster.driver:
        add(WARN, f"{ckey}.driver", "no driver version in the cluster profile: driver compatibility not checked")
    for gpu in cluster.gpus:  # a GPU first enabled by a CUDA whose branch the driver is below cannot run at all
        need = (facts()["arches"].get(gpu.sm) or {}).get("driver_branch")
        if need and cluster.driver and (driver_branch(cluster.driver) or 0) < need:
            add(ERROR, f"{ckey}.driver", f"{gpu.model} ({gpu.arch}) is a newly enabled platform that needs an "
                f"R{need} or later driver; the cluster has {cluster.driver} (branch R{driver_branch(cluster.driver)})")
    if ts:
        arches, _ = variant_arches(env.torch.value or "", env.cuda.value or "")
        for gpu in cluster.gpus:
            why = _arch_ok(env, gpu.sm)
            if why:
                add(ERROR, f"{ckey}.gpus", f"{gpu.model} ({gpu.arch}) cannot run {env.name}: {why}")
            elif arches is None and arch_family_match(ts["arches"], gpu.sm) is None:
                add(WARN, f"{ckey}.gpus", f"{gpu.model} ({gpu.arch}): the arch list of the {env.cuda_variant} "
                    "wheel is not verified")
            elif arches is not None and arch_family_match(arches, gpu.sm) is None:
                add(WARN, f"{ckey}.gpus", f"{gpu.model} ({gpu.arch}) runs {env.name} only through PTX JIT "
                    "(no SASS for its family in the wheel): slow first start, needs a driver with full compatibility")
    fabric_checks.check(env, cluster, add)  # IB/EFA userspace in the image, EFA floors
    runtime_checks.check(env, cluster, add)  # Charliecloud without GPU libraries, MIG instances per node
    return out


def _check_on_partitions(env: Environment, cluster: Cluster) -> list[Problem]:
    """:func:`check_on_cluster` with each partition's own GPUs, arch and fabric; a problem of a fact a partition
    sets itself is keyed to that partition's entry, and one inherited from the cluster is reported once."""
    out: dict[tuple, Problem] = {}
    for pname in cluster.partitions:
        for pr in check_on_cluster(env, cluster.on(pname)):
            field_name = pr.key.removeprefix(f"clusters.{cluster.name}.").split(".")[0]
            key = cluster.key(field_name, pname) + pr.key.removeprefix(f"clusters.{cluster.name}.{field_name}")
            pr = Problem(pr.severity, pr.environment, pr.cluster, key, pr.message)
            out.setdefault((pr.severity, pr.key, pr.message), pr)
    return list(out.values())


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
            problems += _check_on_partitions(env, cluster)
    for cluster in reg.clusters.values():
        problems += check_cluster(cluster)
    return problems


def check_cluster(cluster: Cluster) -> list[Problem]:
    """The problems of ``cluster`` itself, whatever runs on it (their environment is "")."""
    problems: list[Problem] = []
    cname = cluster.name
    parts = set(cluster.partitions)
    for attr in ("partition", "interactive_partition", "build_partition"):
        p = getattr(cluster, attr)
        if p not in parts:
            problems.append(Problem(ERROR, "", cname, f"clusters.{cname}.scheduler.{attr}",
                                    f"partition {p!r} is not in scheduler.partitions ({', '.join(cluster.partitions)})"))
    for pname in cluster.partitions:
        part = cluster.partition_info(pname)
        if part.gpus_per_node and cluster.runtime != "host" and not part.gpus:
            problems.append(Problem(WARN, "", cname, cluster.key("gpus", pname),
                                    "no GPU models listed: arch compatibility not checked"))
            if "gpus" not in part.own:
                break  # the cluster-wide list is missing: one warning, not one per partition
    problems += [Problem(WARN, "", cname, key, msg) for key, msg in fabric_checks.efa_unused(cluster)]
    return problems
