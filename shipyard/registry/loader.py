"""Load registry.yaml into the model: parse with line numbers, validate against the JSON Schema, resolve.

Why JSON Schema (the `jsonschema` library) rather than pydantic: the same schema file serves editors through the
``# yaml-language-server: $schema=`` line while the user types, and shipyard at load time: one source of truth.
Errors are turned into one line with ``file:line``, the key path and what would be valid.

``jsonschema`` alone validates, with one validator built per process. Its ``pattern`` keyword is given JSON Schema's
own (ECMA-262) meaning of ``$``, the end of the value: Python's ``re`` also lets ``$`` match before a final newline, which
would let "1.0\n" or "KEY\n" through to a generated file.

Importing jsonschema and validating cost about as much as the rest of a command's start, and a registry is read far
more often than it changes: the sha256 of a text that passed (with the schema, this module and jsonschema's validator
code in the hash) is kept beside the package's bytecode (:mod:`shipyard.pycache`), and a text with a kept hash is not
validated again. Any other text is validated as ever.
"""

from __future__ import annotations

import datetime
import difflib
import functools
import hashlib
import importlib.util
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from shipyard import facts, pycache
from shipyard.errors import ShipyardError, did_you_mean
from shipyard.files import copied_tree, read_capped_text
from shipyard.registry import compat
from shipyard.registry.model import (
    COMPAT,
    DEFAULT,
    EXPLICIT,
    AptSnapshot,
    BaseMirror,
    Cluster,
    Environment,
    FileCopy,
    NcclTests,
    Gpu,
    Partition,
    Pin,
    Registry,
    RegistryTarget,
    Remote,
)

if TYPE_CHECKING:
    import jsonschema  # lazy: annotations only; validating imports it (see _validator)

REGISTRY_ENV = "SHIPYARD_REGISTRY"
# libyaml's parser when PyYAML was built with it (it keeps marks, so file:line errors still work)
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def _core12_loader() -> type:
    """A loader of YAML 1.2 core schema scalars, as the YAML libraries of other programs read them (ParallelCluster's
    configs): no base-60 (``24:00:00`` stays a string), booleans only true/false, no timestamps. Built on first use:
    only other programs' files need it, and its patterns cost a registry load's time to compile."""

    class Core12Loader(_FAST_LOADER):
        yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in resolvers
                    if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                                   "tag:yaml.org,2002:timestamp")]
            for first, resolvers in _FAST_LOADER.yaml_implicit_resolvers.items()}

    Core12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                       list("tTfF"))
    Core12Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[1-9][0-9]*|0|0x[0-9a-fA-F]+)$"),
                                       list("-+0123456789"))
    Core12Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))
    return Core12Loader


_CUDA_IMAGE = re.compile(r"^(?:docker\.io/)?nvidia/cuda:")
FAST_FABRICS = ("ib", "efa")  # fabrics whose userspace an image must carry (socket needs none)


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
    digits = _limits()["max_int_digits"]
    if node.tag == "tag:yaml.org,2002:int" and len(node.value) > digits:
        raise ShipyardError(f"{fname}:{node.start_mark.line + 1}: {_dotted(path) or '<top>'}: an integer of "
                            f"{len(node.value)} characters; at most {digits} (shipyard/data/limits.yaml); "
                            "quote it if it is text")
    try:
        return scalars.construct_object(node, deep=True)
    except ValueError as exc:  # a number Python refuses to convert (e.g. digits past sys.get_int_max_str_digits)
        raise ShipyardError(f"{fname}:{node.start_mark.line + 1}: {_dotted(path) or '<top>'}: {exc}; "
                            "quote it if it is text") from None
    except yaml.YAMLError as exc:
        raise ShipyardError(f"{fname}:{node.start_mark.line + 1}: {_dotted(path)}: {exc}") from None


def _limits() -> dict:
    return facts.load("limits")["registry_yaml"]


def _check_shape(text: str, fname: str) -> None:
    """Refuse, before building any tree, a file that is too big, nested too deep or refers to too many aliases.

    Why events: PyYAML's composer (and libyaml's, in C) recurses once per nesting level, so a deep enough file ends in
    a RecursionError or a segfault; its event stream is produced iteratively and can be counted safely."""
    lim = _limits()
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > lim["max_bytes"]:
        raise ShipyardError(f"{fname}:1: the file is {size} bytes; a registry may have at most {lim['max_bytes']} "
                            "(shipyard/data/limits.yaml)")
    depth = aliases = 0
    try:
        for ev in yaml.parse(text, Loader=_FAST_LOADER):
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > lim["max_depth"]:
                    raise ShipyardError(f"{fname}:{ev.start_mark.line + 1}: nested more than {lim['max_depth']} "
                                        "levels deep (shipyard/data/limits.yaml)")
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(ev, yaml.AliasEvent):
                aliases += 1
                if aliases > lim["max_aliases"]:
                    raise ShipyardError(f"{fname}:{ev.start_mark.line + 1}: more than {lim['max_aliases']} YAML "
                                        "aliases (*name) (shipyard/data/limits.yaml)")
    except yaml.YAMLError:
        return  # malformed: compose() below reports it with its line


def _expanded_size(node: yaml.Node, fname: str, limit: int, memo: dict, depth: int = 0,
                   max_depth: int | None = None) -> int:
    """Nodes in the tree once every alias is expanded, counted per distinct node (linear time), capped at limit; and
    the nesting once aliases are expanded (a chain ``&b [*a]``, ``&c [*b]``, ... nests without a bracket in the
    text, so the event check of :func:`_check_shape` cannot see it), capped at ``max_depth``."""
    if max_depth is None:
        max_depth = _limits()["max_depth"]
    if depth > max_depth:
        raise ShipyardError(f"{fname}:{node.start_mark.line + 1}: nested more than {max_depth} levels deep once "
                            "YAML aliases are expanded (an alias chain?) (shipyard/data/limits.yaml)")
    key = id(node)
    if key in memo and memo[key][1] + depth <= max_depth:
        return memo[key][0]
    n, below = 1, 0
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        kids = [x for kv in node.value for x in kv] if isinstance(node, yaml.MappingNode) else node.value
        for v in kids:
            n += _expanded_size(v, fname, limit, memo, depth + 1, max_depth)
            below = max(below, 1 + memo[id(v)][1])
    if n > limit:
        raise ShipyardError(f"{fname}:{node.start_mark.line + 1}: YAML aliases expand to more than {limit} nodes "
                            "(an alias bomb?) (shipyard/data/limits.yaml)")
    memo[key] = (n, below)
    return n


def parse_yaml(text: str, fname: str, core12: bool = False) -> tuple[Any, _Lines]:
    """Parse YAML into plain data plus a map of key paths to lines; malformed YAML, or YAML over the limits of
    ``shipyard/data/limits.yaml`` (size, depth, aliases, expanded nodes) -> one-line ShipyardError. ``core12``: the
    YAML 1.2 core schema's scalars (for other programs' files: ParallelCluster configs)."""
    _check_shape(text, fname)
    try:
        node = yaml.compose(text, Loader=_core12_loader() if core12 else _FAST_LOADER)
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
    _expanded_size(node, fname, _limits()["max_nodes"], {})
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
        if "oneOf" in cur:  # the form that can hold this step: a list for an index, a mapping for a key
            want = "items" if isinstance(p, int) else "additionalProperties"
            cur = next((deref(f) for f in cur["oneOf"] if want in deref(f)), cur)
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
    if v in ("minimum", "maximum"):
        lo, hi = sub.get("minimum"), sub.get("maximum")
        valid = f"{lo} to {hi}" if lo is not None and hi is not None else \
            f"at least {lo}" if lo is not None else f"at most {hi}"
        shown = str(inst) if len(str(inst)) <= 24 else f"a number of {len(str(inst))} digits"
        why = f" ({sub['description']})" if sub.get("description") else ""
        return f"{shown} is out of range: valid is {valid}{why}"
    if v == "enum":
        return f"{inst!r} is not one of: {', '.join(map(str, sub['enum']))}"
    if v == "required":
        return err.message.replace("is a required property", "is required")
    if v == "pattern":
        if re.search(sub["pattern"], inst):  # only ECMA-262's '$' refuses it: the value ends in a line break
            return f"{inst!r} does not match the expected form (a line break at its end?)"
        desc = sub.get("description") or ""
        path = list(err.absolute_path)
        if len(path) >= 2 and path[-2] == "pip":
            return f"{inst!r} is not pinned: extra pip packages must be exact, NAME==VERSION"
        if len(path) >= 2 and path[-2] == "apt":
            return f"{inst!r} is not an apt package name (NAME or NAME=VERSION)"
        extra = f" ({desc})" if desc else ""
        return f"{inst!r} does not match the expected form {sub['pattern']}{extra}"
    if v == "oneOf" and list(err.absolute_path)[-1:] == ["partitions"]:
        return "expected a list of partition names or a mapping of name -> the partition's resources"
    if v == "oneOf":
        return f"{inst!r} is not valid: expected a version string like \"0.18.1\" or false"
    return err.message


def _within_one_of(err: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For a ``oneOf`` of differently typed forms (``scheduler.partitions``: a list or a mapping), the error inside
    the form the value has, so the line names the bad key rather than "not valid"."""
    if err.validator != "oneOf" or not err.context:
        return err
    same_type = [c for c in err.context if c.validator != "type" or c.relative_path]
    if not same_type:
        return err
    return _within_one_of(min(same_type, key=lambda c: len(c.absolute_path) * -1))


def _ecma_dollar(pattern: str) -> str:
    """``pattern`` with each ``$`` outside a character class as ``\\Z``: the end of the value, as in ECMA-262."""
    out, escaped, in_class = [], False, False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "[":
            in_class = True
        elif ch == "]":
            in_class = False
        elif ch == "$" and not in_class:
            ch = r"\Z"
        out.append(ch)
    return "".join(out)


@functools.lru_cache(maxsize=None)
def _validator():
    """The registry's validator, built once per process."""
    import jsonschema  # lazy: only a registry text not validated before needs it (see the module's docstring)

    def pattern(validator, patrn, instance, schema):
        if validator.is_type(instance, "string") and not re.search(_ecma_dollar(patrn), instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")

    return jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": pattern})(schema())


_VALIDATED = "validated-registries"  # the kept hashes, one a line, newest last
_VALIDATED_KEPT = 64


@functools.lru_cache(maxsize=None)
def _validation_inputs() -> bytes:
    """What a text's validity depends on besides the text: the schema, this module, jsonschema's validator code."""
    h = hashlib.sha256(facts.text("registry.schema.json").encode())
    h.update(Path(__file__).read_bytes())
    spec = importlib.util.find_spec("jsonschema")
    if spec is not None and spec.origin:
        for name in ("validators.py", "_keywords.py", "_format.py", "_types.py"):
            try:
                h.update(Path(spec.origin).with_name(name).read_bytes())
            except OSError:
                h.update(b"-")
    return h.digest()


def _validation_key(text: str) -> str:
    return hashlib.sha256(_validation_inputs() + text.encode("utf-8", "surrogatepass")).hexdigest()


def _validated() -> list[str]:
    kept = pycache.read("shipyard.registry", _VALIDATED)
    return kept.decode("ascii", "replace").split() if kept else []


def validate_text(data: Any, lines: Mapping, fname: str, text: str) -> None:
    """:func:`validate` ``data``, parsed from ``text``, unless that very text (and schema) passed before."""
    key = _validation_key(text)
    kept = _validated()
    if key in kept:
        return
    validate(data, lines, fname)
    pycache.write("shipyard.registry", _VALIDATED, "\n".join([*kept, key][-_VALIDATED_KEPT:]).encode() + b"\n")


def validate(data: Any, lines: Mapping, fname: str) -> None:
    """Raise one ShipyardError for the first schema violation in file order, counting the rest."""
    if not isinstance(data, dict):
        raise ShipyardError(f"{fname}:1: the registry must be a mapping with 'environments' and 'clusters'")
    errors = list(_validator().iter_errors(data))
    if not errors:
        return
    errors.sort(key=lambda e: (_line(lines, e.absolute_path) or 0, _dotted(e.absolute_path)))
    e = _within_one_of(errors[0])
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
        what = compat.newer_than_facts("torch", torch) or f"torch {torch} does not exist"
        raise ShipyardError(f"{at('torch')}: environments.{name}.torch: {what} (known: {', '.join(near)})")
    cuda = str(raw["cuda"])
    if compat.cuda_facts(cuda) is None:
        known = ", ".join(sorted(compat.facts()["cuda"], key=compat.vtuple))
        what = compat.newer_than_facts("CUDA", cuda) or f"CUDA {cuda} is not a known CUDA release"
        raise ShipyardError(f"{at('cuda')}: environments.{name}.cuda: {what} (known: {known})")

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
    elif compat.os_base(os_name):  # a plain OS base: CUDA comes from the torch wheel's pip packages
        base = Pin(compat.os_base(os_name), compat.COMPAT_OS_BASE)
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
        fabrics=tuple(raw["fabrics"]) if "fabrics" in raw else (),
        fabrics_source=src.get("fabrics", EXPLICIT) if "fabrics" in raw else "",
        description=raw.get("description", ""),
        extends_chain=chain[1:],
        line=eline,
        nccl_tests=_nccl_tests(name, raw, src, at, base, flavor, cuda, ts),
    )


def _nccl_tests(name: str, raw: Mapping, src: Mapping, at, base: Pin, flavor: str, cuda: str,
                ts: Mapping) -> NcclTests | None:
    """``nccl_tests:`` resolved against shipyard/data/nccl_tests.yaml: the release, its sha256, the MPI flavour and
    where the compiler comes from; refused in one line where the image has no compiler or no NCCL to build against."""
    val = raw.get("nccl_tests", False)
    if val is False:
        return None
    data = facts.load("nccl_tests")
    key = f"environments.{name}.nccl_tests"
    opts = val if isinstance(val, dict) else {} if val is True else {"version": str(val)}
    version = str(opts.get("version", data["default"]))
    rel = data["releases"].get(version)
    if rel is None:
        raise ShipyardError(f"{at('nccl_tests')}: {key}: nccl-tests {version} has no pinned release in "
                            f"shipyard/data/nccl_tests.yaml (known: {', '.join(data['releases'])})")
    if raw.get("stack", "shipyard") != "shipyard" or ts.get("nccl_static"):
        raise ShipyardError(f"{at('nccl_tests')}: {key}: needs the NCCL wheel shipyard installs with torch "
                            f"(stack: shipyard, a torch with a pip NCCL); a base image brings its own nccl-tests")
    if flavor == "devel" and base.value and _CUDA_IMAGE.match(base.value):
        compiler = "cuda-image"
    elif cuda in data["pip_compiler"]:
        compiler = "pip"
    else:
        raise ShipyardError(f"{at('nccl_tests')}: {key}: no CUDA {cuda} compiler in this image: set "
                            f"cuda_image: {{flavor: devel}} on an nvidia/cuda base (PyPI has a complete nvcc only "
                            f"for CUDA {', '.join(data['pip_compiler'])})")
    return NcclTests(version=version, url=str(opts.get("url", rel["url"])), sha256=rel["sha256"],
                     commit=rel["commit"], mpi=str(opts.get("mpi", data["default_mpi"])), compiler=compiler,
                     source=src.get("nccl_tests", EXPLICIT))


# Apptainer's build-argument reference (internal/pkg/build/args/reader.go: `{{\s*(\w+)\s*}}`, Go's ASCII \s and \w)
_APPTAINER_ARG_REF = re.compile(r"\{\{[\t\n\f\r ]*([0-9A-Za-z_]+)[\t\n\f\r ]*\}\}")


def _check_definition_values(env: Environment, envs_raw: Mapping, lines, fname: str, root: Path) -> None:
    """What the schema cannot say: ``files.src`` stays inside the project, and every ``{{ NAME }}`` names a build
    argument (Apptainer pastes its value before it parses the .def; an unknown one fails the build late)."""
    def at(*key) -> str:
        for owner in (env.name, *env.extends_chain):
            if key[0] in envs_raw.get(owner, {}):
                return f"{fname}:{_line(lines, ('environments', owner, *key)) or env.line}"
        return f"{fname}:{env.line}"

    real_root = root.resolve()
    for i, f in enumerate(env.files):
        where = f"{at('files', i, 'src')}: environments.{env.name}.files[{i}].src"
        src = Path(f.src)
        if src.is_absolute():
            raise ShipyardError(f"{where}: {f.src!r} is absolute; give a path relative to the project ({root})")
        try:
            (real_root / src).resolve().relative_to(real_root)
        except ValueError:
            raise ShipyardError(f"{where}: {f.src!r} leads outside the project ({root}) once '..' and symlinks are "
                                "resolved; copy the file into the project") from None
        if (root / src).exists():
            try:  # for a directory, every symlink in it (shipyard/files.py copied_tree)
                copied_tree(root, f.src)
            except ValueError as exc:
                raise ShipyardError(f"{where}: {exc}") from None
    names = {k for k, _ in env.build_args}
    fields = [("env", k, v) for k, v in env.env] + [("labels", k, v) for k, v in env.labels]
    fields.append(("description", None, env.description))
    for field, key, value in fields:
        for m in _APPTAINER_ARG_REF.finditer(value):
            if m.group(1) not in names:
                path = (field, key) if key is not None else (field,)
                raise ShipyardError(f"{at(*path)}: environments.{env.name}.{_dotted(path)}: {m.group(0)!r} names no "
                                    f"build argument (build_args: {', '.join(sorted(names)) or 'none'})")


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


_MEM_UNITS = {"": 1, "M": 1, "K": 1 / 1024, "G": 1024, "T": 1024 * 1024}
_MEM_MAX_MB = 2 ** 63 - 1  # Slurm parses a memory size into a signed 64-bit number of MB (strtoll)


def mem_mb(text: str | None) -> int | None:
    """Slurm memory syntax (``182G``, ``191000M``, ``191000``: MB) -> MB."""
    if text is None:
        return None
    m = re.match(r"^([0-9]+)([KMGT]?)$", str(text))
    if not m:
        raise ShipyardError(f"{text!r}: expected a Slurm memory size like 64G or 65536M")
    if len(m.group(1)) > 20:
        raise ShipyardError(f"{str(text)[:24]}...: a memory size of {len(m.group(1))} digits; Slurm reads at most "
                            f"{_MEM_MAX_MB} MB (a 63-bit number)")
    mb = int(int(m.group(1)) * _MEM_UNITS[m.group(2)])
    if mb > _MEM_MAX_MB:
        raise ShipyardError(f"{text!r}: more than {_MEM_MAX_MB} MB, the most Slurm reads (a 63-bit number)")
    if mb < 1:  # Slurm reads --mem=0 as "all the memory of the node"
        raise ShipyardError(f"{text!r}: less than 1M; Slurm reads a zero memory size as all of a node's memory")
    return mb


def _mem(text, key: str) -> int | None:
    try:
        return mem_mb(text)
    except ShipyardError as exc:
        raise ShipyardError(f"{key}: {exc}") from None


def _max_time(text, key: str) -> str | None:
    """A partition's time limit; all zeros is refused (Slurm reads a zero limit as none at all)."""
    if text is not None and not re.sub(r"[-:0]", "", str(text)):
        raise ShipyardError(f"{key}: {text!r} is no time limit to Slurm; give the partition's real MaxTime "
                            "(e.g. 2-00:00:00) or leave max_time out")
    return text


def _resolve_partitions(name: str, raw: dict, cluster_wide: Partition) -> dict[str, Partition]:
    """``scheduler.partitions`` in either form -> name -> resolved facts (cluster-wide values fill the gaps)."""
    sch = raw["scheduler"]
    given = sch.get("partitions", [sch["partition"]])
    entries = {p: {} for p in given} if isinstance(given, list) else {p: (v or {}) for p, v in given.items()}
    out = {}
    for pname, e in entries.items():
        out[pname] = Partition(
            name=pname,
            gpus_per_node=e.get("gpus_per_node", cluster_wide.gpus_per_node),
            gpus=tuple(Gpu(g["model"], g["arch"]) for g in e["gpus"]) if "gpus" in e else cluster_wide.gpus,
            cpus_per_node=e.get("cpus_per_node", cluster_wide.cpus_per_node),
            mem_per_node_mb=(_mem(e["mem_per_node"], f"clusters.{name}.scheduler.partitions.{pname}.mem_per_node")
                             if "mem_per_node" in e else cluster_wide.mem_per_node_mb),
            fabric=e.get("fabric", cluster_wide.fabric),
            max_time=_max_time(e.get("max_time"), f"clusters.{name}.scheduler.partitions.{pname}.max_time"),
            instance_type=e.get("instance_type", cluster_wide.instance_type),
            exclusive=bool(e.get("exclusive", cluster_wide.exclusive)),
            line_rate_gbps=float(e["line_rate_gbps"]) if "line_rate_gbps" in e else cluster_wide.line_rate_gbps,
            mig=e.get("mig"),
            own=frozenset(k for k in e if k != "description"),
        )
    return out


def _resolve_cluster(name: str, raw: dict, lines) -> Cluster:
    sch = raw["scheduler"]
    partition = sch["partition"]
    rate = raw.get("fabric_options", {}).get("line_rate_gbps")
    cluster_wide = Partition(
        name=partition, gpus_per_node=raw["gpus_per_node"],
        gpus=tuple(Gpu(g["model"], g["arch"]) for g in raw.get("gpus", ())),
        cpus_per_node=raw.get("cpus_per_node"), mem_per_node_mb=_mem(raw.get("mem_per_node"),
                                                                      f"clusters.{name}.mem_per_node"),
        fabric=raw["fabric"], instance_type=raw.get("instance_type"), exclusive=bool(sch.get("exclusive", False)),
        line_rate_gbps=float(rate) if rate is not None else None)
    parts = _resolve_partitions(name, raw, cluster_wide)
    return Cluster(
        name=name,
        runtime=raw["runtime"],
        fabric=raw["fabric"],
        gpus_per_node=raw["gpus_per_node"],
        partition=partition,
        partitions=tuple(parts),
        partition_facts=parts,
        mem_per_node_mb=cluster_wide.mem_per_node_mb,
        exclusive=cluster_wide.exclusive,
        interactive_partition=sch.get("interactive_partition", partition),
        build_partition=sch.get("build_partition", partition),
        account=sch.get("account"),
        max_array_size=sch.get("max_array_size"),
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
        remote=Remote(**raw["remote"]) if raw.get("remote") else None,
        host_requirements=tuple(raw.get("host_requirements", ())),
        mpi=raw.get("mpi"),
        local_sandbox=bool(raw.get("local_sandbox", False)),
        gpu_injection=raw.get("gpu_injection"),
        description=raw.get("description", ""),
        line=_line(lines, ("clusters", name)),
    )


def _with_fabrics(env: Environment, clusters: Mapping[str, Cluster]) -> Environment:
    """The fast-fabric userspace the image carries: as written, or the fabrics (ib, efa) of the clusters it targets
    that do not inject the host's libraries; and the EFA installer version of its EFA clusters (the newest when they
    differ; `invoke check` warns then)."""
    targets = [clusters[c] for c in (env.clusters if env.clusters is not None else clusters) if c in clusters]
    efa = sorted({str(c.fabric_options["efa_installer"]) for c in targets
                  if c.fabric == "efa" and c.fabric_options.get("efa_installer")}, key=compat.vtuple)
    installer = efa[-1] if efa else None
    # a checksum a cluster gives for that very installer (for one shipyard's data does not know)
    sha = next((str(c.fabric_options["efa_installer_sha256"]) for c in targets
                if c.fabric_options.get("efa_installer_sha256") and installer
                and compat.vtuple(str(c.fabric_options.get("efa_installer", ""))) == compat.vtuple(installer)), None)
    if env.fabrics_source:
        return replace(env, efa_installer=installer if "efa" in env.fabrics else None,
                       efa_installer_sha256=sha if "efa" in env.fabrics else None)
    need = [c for c in targets if c.fabric in FAST_FABRICS and c.host_injection is None]
    fabrics = tuple(f for f in FAST_FABRICS if any(c.fabric == f for c in need))
    if not fabrics:
        return env
    names = ", ".join(c.name for c in need)
    return replace(env, fabrics=fabrics, fabrics_source=f"derived from clusters {names}",
                   efa_installer=installer if "efa" in fabrics else None,
                   efa_installer_sha256=sha if "efa" in fabrics else None)


def _check_mirrored_bases(envs: Mapping[str, Environment], mirror: Mapping, lines, fname: str) -> None:
    """A base that names its registry with a port (``host:5000/img``) has no name under a mirror: the port would
    become part of a path component, which no reference allows."""
    for env in envs.values():
        first, slash, _ = (env.base.value or "").partition("/")
        if slash and ":" in first:
            at = _line(lines, ("environments", env.name, "base")) or _line(lines, ("base_mirror", "url"))
            raise ShipyardError(f"{fname}:{at}: environments.{env.name}.base: {env.base.value} names a registry with "
                                f"a port, which base_mirror ({mirror['url']}) cannot serve under its name; push the "
                                "image to the mirror and name it there, or remove base_mirror")


def _check_apt_snapshot(envs: Mapping[str, Environment], snap: Mapping, lines, fname: str) -> AptSnapshot:
    """apt_snapshot's date is a real UTC time, and every environment's ``os`` has snapshot sources in
    shipyard/data/apt.yaml (the schema checked the form of url and date: nothing in them needs quoting)."""
    try:
        datetime.datetime.strptime(snap["date"], "%Y%m%dT%H%M%SZ")
    except ValueError:
        raise ShipyardError(f"{fname}:{_line(lines, ('apt_snapshot', 'date'))}: apt_snapshot.date: "
                            f"{snap['date']} is not a real date and time (YYYYMMDDTHHMMSSZ, UTC)") from None
    known = facts.load("apt")["snapshot"]["sources"]
    for env in envs.values():
        if env.os.value not in known:
            at = _line(lines, ("environments", env.name, "os")) or _line(lines, ("apt_snapshot", "date"))
            raise ShipyardError(f"{fname}:{at}: environments.{env.name}.os: {env.os.value} has no snapshot sources "
                                f"in shipyard/data/apt.yaml (known: {', '.join(known)}); remove apt_snapshot or "
                                "add them there")
    return AptSnapshot(snap["date"], snap.get("url"))


def load_text(text: str, fname: str = "registry.yaml", path: Path | None = None) -> Registry:
    """Parse, validate and resolve registry text. Every user error is a one-line ShipyardError."""
    data, lines = parse_yaml(text, fname)
    validate_text(data, lines, fname, text)
    envs_raw = data["environments"]
    envs = {n: _resolve_environment(n, envs_raw, lines, fname) for n in envs_raw}
    root = (path or Path(fname)).parent
    for env in envs.values():
        _check_definition_values(env, envs_raw, lines, fname, root)
    clusters = {n: _resolve_cluster(n, c, lines) for n, c in data["clusters"].items()}
    sandboxes = [n for n, c in clusters.items() if c.local_sandbox]
    if len(sandboxes) > 1:
        raise ShipyardError(f"{fname}:{_line(lines, ('clusters', sandboxes[1], 'local_sandbox'))}: "
                            f"clusters.{sandboxes[1]}.local_sandbox: only one cluster can be this machine's sandbox "
                            f"(clusters.{sandboxes[0]} is)")
    regs = {
        n: RegistryTarget(n, r["uri"], bool(r.get("insecure", False)), bool(r.get("require_signed", False)))
        for n, r in data.get("registries", {}).items()
    }
    envs = {n: _with_fabrics(e, clusters) for n, e in envs.items()}
    mirror = data.get("base_mirror")
    if mirror:
        _check_mirrored_bases(envs, mirror, lines, fname)
    snap = data.get("apt_snapshot")
    apt_snapshot = _check_apt_snapshot(envs, snap, lines, fname) if snap else None
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
        base_mirror=BaseMirror(mirror["url"], bool(mirror.get("insecure_http", False))) if mirror else None,
        apt_snapshot=apt_snapshot,
    )


def load(path: str | os.PathLike | None = None) -> Registry:
    """Load the registry at ``path`` (or $SHIPYARD_REGISTRY, or ./registry.yaml)."""
    p = registry_path(path)
    try:
        text = read_capped_text(p, "registry", "a registry")
    except FileNotFoundError:
        raise ShipyardError(f"{p}: registry not found (set ${REGISTRY_ENV} or run from the project directory)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ShipyardError(f"{p}: cannot read registry: {exc}") from None
    return load_text(text, str(p), p)
