"""Load registry.yaml into the model: parse with line numbers, validate against the JSON Schema, resolve.

Why JSON Schema (the `jsonschema` library) rather than pydantic: the same schema file serves editors through the
``# yaml-language-server: $schema=`` line while the user types, and shipyard at load time: one source of truth.
Errors are turned into one line with ``file:line``, the key path and what would be valid.

A valid registry never imports ``jsonschema`` (its import costs more CPU than the rest of ``invoke check``): it is
checked by :mod:`shipyard.registry.schema_validator`, plain Python generated from the same schema file
(``python -m shipyard.dev.schema_codegen``). Only when that finds a violation does ``jsonschema`` collect and explain
every error, so the messages are the same as ever.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from shipyard import facts
from shipyard.errors import ShipyardError, did_you_mean
from shipyard.registry import compat, schema_validator
from shipyard.registry.model import (
    COMPAT,
    DEFAULT,
    EXPLICIT,
    Cluster,
    Environment,
    FileCopy,
    Gpu,
    Pin,
    Registry,
    RegistryTarget,
)

REGISTRY_ENV = "SHIPYARD_REGISTRY"
# libyaml's parser when PyYAML was built with it (it keeps marks, so file:line errors still work)
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_CUDA_IMAGE = re.compile(r"^(?:docker\.io/)?nvidia/cuda:")

if TYPE_CHECKING:
    import jsonschema  # lazy: annotations only; imported in validate() when a registry is invalid


def registry_path(explicit: str | os.PathLike | None = None) -> Path:
    """``--registry`` flag, else $SHIPYARD_REGISTRY, else ./registry.yaml."""
    if explicit:
        return Path(explicit)
    if os.environ.get(REGISTRY_ENV):
        return Path(os.environ[REGISTRY_ENV])
    return Path("registry.yaml")


def schema() -> dict:
    return facts.load("registry.schema.json")


# --------------------------------------------------------------------------------------------------------------
# YAML with line numbers


class _Lines(dict):
    """key path tuple -> 1-based line of that key (or of the item, for list entries)."""


def _construct(node: yaml.Node, path: tuple, lines: _Lines, fname: str,
               scalars: yaml.constructor.SafeConstructor) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for knode, vnode in node.value:
            if not isinstance(knode, yaml.ScalarNode):
                raise ShipyardError(f"{fname}:{knode.start_mark.line + 1}: {_dotted(path) or '<top>'}: "
                                    "keys must be plain strings")
            key = str(knode.value)  # keys stay strings: '2.3' not 2.3
            if key in out:
                raise ShipyardError(f"{fname}:{knode.start_mark.line + 1}: {_dotted(path + (key,))}: duplicate key")
            lines[path + (key,)] = knode.start_mark.line + 1
            out[key] = _construct(vnode, path + (key,), lines, fname, scalars)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, path + (i,), lines, fname, scalars) for i, v in enumerate(node.value)]
    try:
        return scalars.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise ShipyardError(f"{fname}:{node.start_mark.line + 1}: {_dotted(path)}: {exc}") from None


def parse_yaml(text: str, fname: str) -> tuple[Any, _Lines]:
    """Parse YAML into plain data plus a map of key paths to lines; malformed YAML -> one-line ShipyardError."""
    try:
        node = yaml.compose(text, Loader=_FAST_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        what = (exc.problem or "malformed YAML").strip()
        raise ShipyardError(f"{fname}:{line}: malformed YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ShipyardError(f"{fname}: malformed YAML: {str(exc).splitlines()[0]}") from None
    lines = _Lines()
    if node is None:
        return None, lines
    # one scalar constructor per document (YAML 1.1 safe types: ints, floats, bools, null, timestamps)
    return _construct(node, (), lines, fname, yaml.constructor.SafeConstructor()), lines


def _dotted(path) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")


def _line(lines: Mapping, path) -> int | None:
    path = tuple(path)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get((), None)


# --------------------------------------------------------------------------------------------------------------
# Schema validation -> one line


def _subschema(path) -> dict | None:
    """Walk the schema along a data path (enough for the did-you-mean hints)."""
    s = schema()
    defs = s["$defs"]

    def deref(x):
        while isinstance(x, dict) and "$ref" in x:
            x = defs[x["$ref"].split("/")[-1]]
        return x

    cur = s
    for p in path:
        cur = deref(cur)
        if isinstance(p, int):
            cur = cur.get("items", {})
        elif p in cur.get("properties", {}):
            cur = cur["properties"][p]
        elif isinstance(cur.get("additionalProperties"), dict):
            cur = cur["additionalProperties"]
        else:
            return None
    return deref(cur)


def _unknown_key(err: jsonschema.ValidationError) -> str | None:
    """The first key an additionalProperties error is about (the schema names no key itself)."""
    if err.validator != "additionalProperties" or not isinstance(err.instance, dict):
        return None
    allowed = _subschema(list(err.absolute_path)).get("properties", {})
    return next((k for k in err.instance if k not in allowed), None)


def _describe(err: jsonschema.ValidationError) -> str:
    sub = err.schema if isinstance(err.schema, dict) else {}
    v = err.validator
    inst = err.instance
    if v == "additionalProperties":
        allowed = sorted(_subschema(list(err.absolute_path)).get("properties", {}))
        key = _unknown_key(err) or "?"
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (valid: {', '.join(allowed)})"
        return f"unknown key '{key}'{hint}"
    if v == "type":
        want = sub.get("type")
        want = " or ".join(want) if isinstance(want, list) else want
        return f"expected {want}, got {type(inst).__name__} {inst!r}" if not isinstance(inst, (dict, list)) \
            else f"expected {want}, got {type(inst).__name__}"
    if v == "enum":
        return f"{inst!r} is not one of: {', '.join(map(str, sub['enum']))}"
    if v == "required":
        return err.message.replace("is a required property", "is required")
    if v == "pattern":
        desc = sub.get("description") or ""
        path = list(err.absolute_path)
        if len(path) >= 2 and path[-2] == "pip":
            return f"{inst!r} is not pinned: extra pip packages must be exact, NAME==VERSION"
        if len(path) >= 2 and path[-2] == "apt":
            return f"{inst!r} is not an apt package name (NAME or NAME=VERSION)"
        extra = f" ({desc})" if desc else ""
        return f"{inst!r} does not match the expected form {sub['pattern']}{extra}"
    if v == "oneOf":
        return f"{inst!r} is not valid: expected a version string like \"0.18.1\" or false"
    return err.message


def validate(data: Any, lines: Mapping, fname: str) -> None:
    """Raise one ShipyardError for the first schema violation in file order, counting the rest."""
    if not isinstance(data, dict):
        raise ShipyardError(f"{fname}:1: the registry must be a mapping with 'environments' and 'clusters'")
    try:
        schema_validator.validate(data)
        return
    except schema_validator.JsonSchemaValueException:
        pass  # explain it with jsonschema (the generated code is stricter in corners jsonschema allows, e.g. "1.0\n")
    import jsonschema  # lazy: ~40 ms of imports, paid only for an invalid registry

    validator = jsonschema.Draft202012Validator(schema())
    errors = list(validator.iter_errors(data))
    if not errors:
        return
    errors.sort(key=lambda e: (_line(lines, e.absolute_path) or 0, _dotted(e.absolute_path)))
    e = errors[0]
    key = _unknown_key(e)
    path = list(e.absolute_path) + ([key] if key is not None else [])
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    raise ShipyardError(f"{fname}:{_line(lines, path) or 1}: {_dotted(path) or '<top>'}: {_describe(e)}{more}")


# --------------------------------------------------------------------------------------------------------------
# Resolution


def _merged_environment(name: str, envs: Mapping[str, dict], lines, fname: str) -> tuple[dict, dict, tuple]:
    """Follow `extends`; return (merged fields, field -> source, chain). Detects unknown parents and cycles."""
    chain: list[str] = []
    cur = name
    while True:
        if cur in chain:
            cyc = " -> ".join(chain[chain.index(cur):] + [cur])
            raise ShipyardError(f"{fname}:{_line(lines, ('environments', name, 'extends'))}: "
                                f"environments.{name}.extends: cycle {cyc}")
        chain.append(cur)
        parent = envs[cur].get("extends")
        if parent is None:
            break
        if parent not in envs:
            hint = did_you_mean(parent, envs)
            raise ShipyardError(f"{fname}:{_line(lines, ('environments', cur, 'extends'))}: "
                                f"environments.{cur}.extends: unknown environment '{parent}' "
                                f"({hint}known: {', '.join(envs)})")
        cur = parent
    merged: dict = {}
    source: dict = {}
    for env_name in reversed(chain):  # root ancestor first, the environment itself last
        tag = EXPLICIT if env_name == name else f"inherited from {env_name}"
        for k, v in envs[env_name].items():
            if k == "extends":
                continue
            if k in ("env", "labels", "build_args") and isinstance(merged.get(k), dict):
                merged[k] = {**merged[k], **v}
            elif k == "pip" and k in merged:
                by_name = {_pip_name(p): p for p in merged[k]}
                by_name.update({_pip_name(p): p for p in v})
                merged[k] = list(by_name.values())
            elif k == "apt" and k in merged:
                merged[k] = list(dict.fromkeys([*merged[k], *v]))
            elif k == "cuda_image" and k in merged:
                merged[k] = {**merged[k], **v}
            else:
                merged[k] = v
            source[k] = tag
    return merged, source, tuple(chain)


def _pip_name(req: str) -> str:
    return re.split(r"[\[=]", req, maxsplit=1)[0].lower().replace("_", "-")


def _resolve_environment(name: str, envs: Mapping[str, dict], lines, fname: str) -> Environment:
    raw, src, chain = _merged_environment(name, envs, lines, fname)
    eline = _line(lines, ("environments", name))

    def at(key: str) -> str:
        # the line where the value was written: in this environment or in the ancestor it came from
        owner = name if src.get(key, EXPLICIT) == EXPLICIT else src[key].removeprefix("inherited from ")
        return f"{fname}:{_line(lines, ('environments', owner, key)) or eline}"

    for req in ("torch", "cuda", "python", "os"):
        if req not in raw:
            raise ShipyardError(f"{fname}:{eline}: environments.{name}: '{req}' is required "
                                f"(directly or through extends)")
    torch = str(raw["torch"])
    ts = compat.torch_series(torch)
    if ts is None or torch not in ts["patches"]:
        near = [v for v in compat.known_torch_versions() if v.startswith(compat.series(torch) + ".")]
        near = near or compat.known_torch_versions()[-5:]
        raise ShipyardError(f"{at('torch')}: environments.{name}.torch: torch {torch} does not exist "
                            f"(known: {', '.join(near)})")
    cuda = str(raw["cuda"])
    if compat.cuda_facts(cuda) is None:
        known = ", ".join(sorted(compat.facts()["cuda"], key=compat.vtuple))
        raise ShipyardError(f"{at('cuda')}: environments.{name}.cuda: CUDA {cuda} is not a known CUDA release "
                            f"(known: {known})")

    def pin(key: str, default: Any, default_source: str) -> Pin:
        if key in raw:
            val = raw[key]
            return Pin(None if val is False else str(val), src[key])
        return Pin(None if default is None else str(default), default_source)

    # wheel facts by (torch patch, CUDA variant): a non-default variant pins its own NCCL/cuDNN (compat.yaml wheels:)
    tv_default = compat.wheel_fact(torch, cuda, "torchvision")
    ta_default = compat.wheel_fact(torch, cuda, "torchaudio")
    comp_src = f"{DEFAULT} (companion of torch {torch})"
    wheel_nccl = compat.wheel_fact(torch, cuda, "nccl")
    nccl_default = None if ts.get("nccl_static") else wheel_nccl
    variant = compat.variant_tag(cuda)
    flavor = raw.get("cuda_image", {}).get("flavor", "runtime")
    cudnn = bool(raw.get("cuda_image", {}).get("cudnn", False))
    os_name = raw["os"]
    if "base" in raw:
        base = Pin(raw["base"], src["base"])
    else:
        base = Pin(compat.cuda_image_tag(cuda, flavor, cudnn, os_name), compat.COMPAT_DERIVED)
    index = None if cuda == ts["default_cuda"] else compat.variant_index(cuda)
    return Environment(
        name=name,
        torch=pin("torch", None, EXPLICIT),
        cuda=pin("cuda", None, EXPLICIT),
        python=pin("python", None, EXPLICIT),
        os=pin("os", None, EXPLICIT),
        nccl=pin("nccl", wheel_nccl, f"{DEFAULT} (pinned by the {variant} wheel of torch {torch})" if wheel_nccl
                 else f"{COMPAT} (not verified for the {variant} wheel of torch {torch})"),
        torchvision=pin("torchvision", tv_default, comp_src),
        torchaudio=pin("torchaudio", ta_default, comp_src),
        cudnn=Pin(compat.wheel_fact(torch, cuda, "cudnn"), f"{COMPAT} (brought by the {variant} wheel)"),
        base=base,
        torch_index=Pin(index, f"{COMPAT} ({'default variant: PyPI' if index is None else 'non-default variant'})"),
        nccl_default=nccl_default,
        nccl_package=None if ts.get("nccl_static") else compat.nccl_package(cuda),
        cuda_image_flavor=flavor,
        cuda_image_cudnn=cudnn,
        base_is_cuda_image=bool(base.value and _CUDA_IMAGE.match(base.value)),
        system_python=compat.facts()["os"].get(os_name, {}).get("system_python"),
        stack=raw.get("stack", "shipyard"),
        pip=tuple(raw.get("pip", ())),
        apt=tuple(raw.get("apt", ())),
        env=tuple((k, _scalar(v)) for k, v in raw.get("env", {}).items()),
        files=tuple(FileCopy(f["src"], f["dst"]) for f in raw.get("files", ())),
        labels=tuple((k, _scalar(v)) for k, v in raw.get("labels", {}).items()),
        build_args=tuple(raw.get("build_args", {}).items()),
        clusters=tuple(raw["clusters"]) if "clusters" in raw else None,
        description=raw.get("description", ""),
        extends_chain=chain[1:],
        line=eline,
    )


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _resolve_cluster(name: str, raw: dict, lines) -> Cluster:
    sch = raw["scheduler"]
    partition = sch["partition"]
    return Cluster(
        name=name,
        runtime=raw["runtime"],
        fabric=raw["fabric"],
        gpus_per_node=raw["gpus_per_node"],
        partition=partition,
        partitions=tuple(sch.get("partitions", [partition])),
        interactive_partition=sch.get("interactive_partition", partition),
        build_partition=sch.get("build_partition", partition),
        account=sch.get("account"),
        time=sch.get("time"),
        build_time=sch.get("build_time"),
        build_cpus=sch.get("build_cpus"),
        build_mem=sch.get("build_mem"),
        cpus_per_node=raw.get("cpus_per_node"),
        nodes=raw.get("nodes"),
        gpus=tuple(Gpu(g["model"], g["arch"]) for g in raw.get("gpus", ())),
        driver=raw.get("driver"),
        modules=tuple(raw.get("modules", ())),
        binds=tuple(raw.get("binds", ())),
        storage=raw.get("storage"),
        env=tuple((k, _scalar(v)) for k, v in raw.get("env", {}).items()),
        fabric_options=dict(raw.get("fabric_options", {})),
        instance_type=raw.get("instance_type"),
        login=raw.get("login"),
        host_requirements=tuple(raw.get("host_requirements", ())),
        description=raw.get("description", ""),
        line=_line(lines, ("clusters", name)),
    )


def load_text(text: str, fname: str = "registry.yaml", path: Path | None = None) -> Registry:
    """Parse, validate and resolve registry text. Every user error is a one-line ShipyardError."""
    data, lines = parse_yaml(text, fname)
    validate(data, lines, fname)
    envs_raw = data["environments"]
    envs = {n: _resolve_environment(n, envs_raw, lines, fname) for n in envs_raw}
    clusters = {n: _resolve_cluster(n, c, lines) for n, c in data["clusters"].items()}
    regs = {
        n: RegistryTarget(n, r["uri"], bool(r.get("insecure", False)), bool(r.get("require_signed", False)))
        for n, r in data.get("registries", {}).items()
    }
    defaults = data.get("defaults", {})
    for key, table in (("environment", envs), ("cluster", clusters), ("registry", regs)):
        val = defaults.get(key)
        if val is not None and val not in table:
            hint = did_you_mean(val, table)
            raise ShipyardError(f"{fname}:{_line(lines, ('defaults', key))}: defaults.{key}: unknown {key} "
                                f"'{val}' ({hint}known: {', '.join(table) or 'none'})")
    return Registry(
        path=path or Path(fname),
        environments=envs,
        clusters=clusters,
        registries=regs,
        default_environment=defaults.get("environment"),
        default_cluster=defaults.get("cluster"),
        default_registry=defaults.get("registry"),
    )


def load(path: str | os.PathLike | None = None) -> Registry:
    """Load the registry at ``path`` (or $SHIPYARD_REGISTRY, or ./registry.yaml)."""
    p = registry_path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ShipyardError(f"{p}: registry not found (set ${REGISTRY_ENV} or run from the project directory)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ShipyardError(f"{p}: cannot read registry: {exc}") from None
    return load_text(text, str(p), p)
