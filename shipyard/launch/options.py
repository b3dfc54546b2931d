"""The flags of ``invoke launch`` and ``invoke nccl-test``, as one model: :class:`Options`.

Each field carries its flag, its help text, the kinds of launcher that take it, how a resolved value is checked, and
how it is repeated in a launcher's "regenerate with" line. tasks.py builds both tasks' help from here
(:func:`task_kwargs`) and turns the parsed flags into one ``Options(**params)``, which travels down unchanged:
:mod:`shipyard.commands.launch` and :func:`shipyard.launch.launcher.build` read the flags from it,
:func:`resolved` fills in what build decided (and checks every other given value by its field), and the header's
"regenerate with" line is :func:`invocation` of that resolved object. Why one model: the help, the checks, the
parameters of ``build`` and the header used to be lists that had to agree by hand; a new flag is now one field plus
its parameter in the task's signature (tests/launch/test_options.py shows it).

Defaults: a field's own default is only "not given" (None, False); the values a flag falls back to live in
shipyard/data/launch.yaml (``defaults``), and the help text reads them from there (``{name}`` placeholders), so the
help cannot state another default than the one that applies.

Kept free of the registry (and so of jsonschema): tasks.py imports it on every ``invoke`` call.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

from shipyard import facts, runtimes
from shipyard.errors import ShipyardError

TORCHRUN, NCCL_TEST = "torchrun", "nccl-test"
KINDS = (TORCHRUN, NCCL_TEST)
TASKS = {TORCHRUN: "launch", NCCL_TEST: "nccl-test"}  # the invoke task that writes each kind
COMMAND_KINDS = (TORCHRUN,)  # kinds that run the words after `--`
POSITIONAL = "environment"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TIME = re.compile(r"^([0-9]+-)?[0-9]+(:[0-9]{2}){0,2}$")
_MEM = re.compile(r"^[0-9]+[KMGT]?$")


def seconds(time: str) -> int:
    """Slurm's time syntax in seconds: ``[D-]HH[:MM[:SS]]`` with a day, else ``MM``, ``MM:SS`` or ``HH:MM:SS``."""
    days, _, rest = time.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    else:
        h, m, s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s


def at_least(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str, Any], int]:
    """A check: an integer >= ``minimum`` (and <= ``maximum``, the bound of what reads it: ``why``). Flags arrive as
    strings from invoke, as ints from Python callers."""

    def check(flag: str, value: Any) -> int:
        try:  # a number of more digits than any bound is refused before it is converted
            n = value if type(value) is int else int(str(value)) if len(str(value)) <= 24 else None
        except (TypeError, ValueError):
            n = None
        if n is None:
            raise ShipyardError(f"{flag} {str(value)[:24]!r}: expected an integer >= {minimum}") from None
        if n < minimum:
            raise ShipyardError(f"{flag} {value}: must be at least {minimum}")
        if maximum is not None and n > maximum:
            raise ShipyardError(f"{flag} {value}: out of range, valid is {minimum} to {maximum} ({why})")
        return n

    return check


def matching(pattern: re.Pattern, expected: str) -> Callable[[str, Any], str]:
    """A check: the whole value matches ``pattern``; ``expected`` says what would."""

    def check(flag: str, value: Any) -> str:
        if not pattern.match(value):
            raise ShipyardError(f"{flag} {value!r}: {expected}")
        return value

    return check


def defaults() -> dict:
    """What the flags fall back to: shipyard/data/launch.yaml's ``defaults`` (the one place they are written)."""
    return facts.load("launch")["defaults"]


def default_name(kind: str) -> str:
    """The launcher name's stem without ``--name`` (``train``, ``nccl-test``), from the data file."""
    return defaults()["name" if kind == TORCHRUN else "nccl_test_name"]


def opt(default: bool | None = None, help: str = "", *, kinds: tuple[str, ...] = KINDS,
        check: Callable | None = None, regenerate: bool = True, only_with: str | None = None, implied: bool = False,
        repeat: bool = False):
    """A field of :class:`Options`. ``default`` is "not given" (None, or False for a switch), never a value: values
    come from data (:func:`defaults`), and ``{key}`` in ``help`` is replaced by that default. ``regenerate``:
    repeated in the header line, unless ``implied`` and the value is its default (it needs no flag) or the field
    ``only_with`` names is unset there; ``repeat``: the flag may be given many times."""
    return field(default=default, metadata={
        "help": help, "kinds": kinds, "check": check, "regenerate": regenerate, "only_with": only_with,
        "implied": implied, "repeat": repeat,
    })


_POSITIVE = at_least(1)
# Slurm's own bounds of what it reads from these flags (slurm.h: a node count is uint32_t with NO_VAL 0xfffffffe
# reserved; --signal's time is a uint16_t number of seconds)
_NODES = at_least(1, 4294967293, "Slurm's node count")
_SIGNAL_TIME = at_least(1, 65535, "Slurm's --signal time in seconds")
_SIZES = re.compile(r"^[0-9]+[KMG]?:[0-9]+[KMG]?$")


def _binary(flag: str, value: Any) -> str:
    """One of the binaries nccl-tests' pinned releases build (shipyard/data/nccl_tests.yaml)."""
    known = sorted({b for r in facts.load("nccl_tests")["releases"].values() for b in r["binaries"]})
    if value not in known:
        raise ShipyardError(f"{flag} {value!r}: not an nccl-tests binary (valid: {', '.join(known)})")
    return value


def _zero_one(flag: str, value: Any) -> int:
    if str(value) not in ("0", "1"):
        raise ShipyardError(f"{flag} {value!r}: expected 1 (validate the results) or 0")
    return int(value)


@dataclass(frozen=True)
class Options:
    """Every flag of both tasks, in the order the "regenerate with" line repeats them. ``None``/``False``: not given
    (the registry's default applies)."""

    environment: str | None = opt(help="environment to run (default: defaults.environment)")
    cluster: str | None = opt(help="cluster profile (default: defaults.cluster)")
    nodes: int | str | None = opt(help="number of nodes (default: {nodes})", check=_NODES)
    gpus_per_node: int | str | None = opt(help="GPUs per node (default: the cluster's gpus_per_node)",
                                          check=at_least(0))
    runtime: str | None = opt(help=f"{' | '.join(runtimes.NAMES)} (default: the cluster's runtime)")
    partition: str | None = opt(help="Slurm partition (default: the cluster's scheduler.partition)")
    cpus_per_task: int | str | None = opt(help="CPUs for each node's torchrun (default: the partition's CPUs in "
                                               "proportion to the GPUs asked for; all of them for a whole node)",
                                          kinds=(TORCHRUN,), check=at_least(1))
    mem: str | None = opt(help="memory per node, Slurm syntax, e.g. 64G; 0 = all (default: the partition's memory in "
                               "proportion to the GPUs asked for; Slurm's default for a whole node)",
                          check=matching(_MEM, "expected a Slurm memory size like 64G or 65536M (0: all)"))
    exclusive: bool = opt(False, "whole nodes only (default: the partition's exclusive setting)")
    name: str | None = opt(help="launcher name: writes launch/<name>.sbatch (default: {name}-<cluster>, "
                                "{nccl_test_name}-<cluster>)",
                           check=matching(_NAME, "use letters, digits, '.', '_' and '-' (it names "
                                                 "launch/<name>.sbatch and the job)"))
    registry: str | None = opt(help="registry file (default: $SHIPYARD_REGISTRY or ./registry.yaml)")
    account: str | None = opt(help="Slurm account (default: the cluster's scheduler.account)",
                              check=matching(_NAME, "use letters, digits, '.', '_' and '-' (it goes into an "
                                                    "#SBATCH line)"))
    time: str | None = opt(help="time limit [D-]HH[:MM[:SS]] (default: the cluster's scheduler.time)",
                           check=matching(_TIME, "expected Slurm time [D-]HH[:MM[:SS]], e.g. 02:00:00"))
    image: str | None = opt(help="container image instead of <cluster.storage>/<env>.sqsh|.sif (pyxis: also "
                                 "REGISTRY#IMAGE:TAG)")
    binary: str | None = opt(help="nccl-tests binary: all_reduce_perf, all_gather_perf, alltoall_perf, ... (default "
                                  "{binary})", kinds=(NCCL_TEST,), check=lambda f, v: _binary(f, v))
    sizes: str | None = opt(help="message sizes MIN:MAX, e.g. 128M:4G, doubling (nccl-tests' -b/-e/-f 2; default "
                                 "{sizes})", kinds=(NCCL_TEST,),
                            check=matching(_SIZES, "expected MIN:MAX sizes like 128M:4G (digits, then K, M or G)"))
    iters: int | str | None = opt(help="iterations per size (nccl-tests' -n; default {iters})", kinds=(NCCL_TEST,),
                                  check=_POSITIVE)
    check: int | str | None = opt(help="validate the results: 1 or 0 (nccl-tests' -c; default {check})",
                                  kinds=(NCCL_TEST,), check=lambda f, v: _zero_one(f, v))
    image_has_nccl_tests: bool = opt(False, "with --image: you vouch that the image carries nccl-tests on its PATH "
                                            "(e.g. NGC's PyTorch images); shipyard cannot check an external image",
                                     kinds=(NCCL_TEST,))
    mounts: str | None = opt(help="extra mounts SRC:DST[:ro],... (added to the cluster's binds and the project "
                                  "directory)")
    env: tuple[str, ...] | None = opt(help="NAME=VALUE exported to the job and overriding the image's value "
                                           "(repeatable)", repeat=True)
    nccl_debug: bool = opt(False, "NCCL_DEBUG=INFO for every subsystem (by default only INIT and NET, for the transport "
                                  "line)")
    allow_transport_fallback: bool = opt(False, "do not pin NCCL's network to the fabric's (NCCL_NET): a missing "
                                                "fabric library then falls back to sockets silently instead of "
                                                "stopping the job (also: the cluster's "
                                                "fabric_options.allow_transport_fallback)")
    monitor: bool = opt(False, "sample CPU/RAM/GPU usage on every node into "
                               "launch/logs/<name>-<jobid>.usage.<node>.csv", kinds=(TORCHRUN,))
    monitor_interval: int | str | None = opt(help="seconds between usage samples (default {monitor_interval})", kinds=(TORCHRUN,),
                                             check=_POSITIVE, only_with="monitor")
    chain: int | str | None = opt(help="submit K jobs, each starting after the previous one ends (afterany), "
                                       "resuming from its checkpoint", kinds=(TORCHRUN,), check=_POSITIVE, implied=True)
    requeue: bool = opt(False, "requeue the job after a checkpoint signal, while SLURM_RESTART_COUNT < "
                               "--max-restarts", kinds=(TORCHRUN,))
    max_restarts: int | str | None = opt(help="requeues allowed with --requeue (default {max_restarts})", kinds=(TORCHRUN,),
                                         check=at_least(0), only_with="requeue")
    signal_before: int | str | None = opt(help="send {signal} this many seconds before the time limit (default "
                                               "{signal_before} with --requeue/--chain)", kinds=(TORCHRUN,),
                                         check=_SIGNAL_TIME)
    preflight: str | None = opt(help="on | off: before torchrun, each node checks its driver against the image's "
                                     "CUDA, its GPUs' compute capability against the torch wheel's arches and the GPUs "
                                     "it sees against --gpus-per-node, and a mismatch stops the job (default: on when "
                                     "the job asks for GPUs)", kinds=(TORCHRUN,),
                                check=matching(re.compile(r"^(on|off)$"), "expected on or off"))
    force: bool = opt(False, "write the launcher even when `invoke check` finds an ERROR for ENV on the cluster (warned, "
                             "and named in the launcher's header)")
    # extra #SBATCH options and validation (shipyard/launch/passthrough.py)
    sbatch: tuple[str, ...] | None = opt(help="extra Slurm option KEY=VALUE, written as an #SBATCH line "
                                              "(repeatable; keys: sbatch_passthrough in shipyard/data/launch.yaml, "
                                              "e.g. mail-type=END, constraint=a100, gres=gpu:1g.10gb:1, qos=high)",
                                         repeat=True)
    validate: bool = opt(False, "ask Slurm whether it would accept the launcher (sbatch --test-only): its verdict and "
                                "estimated start; queues nothing", regenerate=False)
    sweep: str | None = opt(help="a sweep as one job array: 'NAME=V1,V2 NAME2=...' (every combination; each task gets "
                                 "--NAME VALUE after the command and its own run directory)", kinds=(TORCHRUN,))
    sweep_file: str | None = opt(help="a sweep from a tab-separated table: a header of names, one combination per "
                                      "row (values may hold spaces and quotes)", kinds=(TORCHRUN,))
    max_concurrent: int | str | None = opt(help="with a sweep: at most P tasks of the array at once (--array=...%%P)",
                                           kinds=(TORCHRUN,), check=_POSITIVE)
    submit: bool = opt(False, "submit with sbatch --parsable and print the job id(s)", regenerate=False)
    dry_run: bool = opt(False, "print the launcher instead of writing it", regenerate=False)


@functools.lru_cache(maxsize=None)
def _fields(model: type) -> dict[str, Any]:
    """The fields of ``model`` (:class:`Options` or a class derived from it) by name, in order."""
    return {f.name: f for f in fields(model)}


FIELDS = _fields(Options)


def flag(name: str) -> str:
    """``gpus_per_node`` -> ``--gpus-per-node`` (invoke's own spelling of a parameter)."""
    return "--" + name.replace("_", "-")


def names(kind: str, model: type = Options) -> tuple[str, ...]:
    """The options a kind of launcher takes, in model order."""
    return tuple(n for n, f in _fields(model).items() if kind in f.metadata["kinds"])


def help_for(kind: str, model: type = Options) -> dict[str, str]:
    """``help=`` of the task that writes ``kind``, with the data file's defaults filled in."""
    found = _fields(model)
    return {n: found[n].metadata["help"].format(**defaults()) for n in names(kind, model)}


def task_kwargs(kind: str, model: type = Options) -> dict[str, Any]:
    """Everything ``@task(...)`` needs besides the name: help, the repeatable flags, the optional positional."""
    found = _fields(model)
    return {
        "positional": [POSITIONAL],
        "iterable": [n for n in names(kind, model) if found[n].metadata["repeat"]],
        "auto_shortflags": False,
        "help": help_for(kind, model),
    }


def check(name: str, value: Any, model: type = Options) -> Any:
    """A resolved value of option ``name``, checked (and converted) by its field; one error line naming the flag."""
    fn = _fields(model)[name].metadata["check"]
    return fn(flag(name), value) if fn else value


def resolved(given: Options, values: dict[str, Any]) -> Options:
    """``given`` with the ``values`` the launcher's build resolved; every other given value is checked by its field,
    so a flag that build does not look at (a new one) is still refused when bad, and repeated as checked."""
    model = type(given)
    rest = {n: check(n, getattr(given, n), model) for n, f in _fields(model).items()
            if n not in values and f.metadata["check"] and getattr(given, n) is not None}
    return replace(given, **values, **rest)


def invocation(kind: str, given: Options, command: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The ``invoke`` command line that sets ``given`` (the values the header makes explicit) for ``kind``."""
    argv = ["invoke", TASKS[kind]]
    found = _fields(type(given))
    for n in names(kind, type(given)):
        md = found[n].metadata
        value = getattr(given, n)
        if (not md["regenerate"] or value is None or value is False or value == ()
                or (md["implied"] and value == defaults()[n])
                or (md["only_with"] and not getattr(given, md["only_with"]))):
            continue
        if value is True:
            argv.append(flag(n))
        elif md["repeat"]:
            for item in value:
                argv += [flag(n), str(item)]
        else:
            argv += [flag(n), str(value)]
    if kind in COMMAND_KINDS:
        argv += ["--", *command]
    return tuple(argv)
