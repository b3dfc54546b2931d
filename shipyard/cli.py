"""Helpers shared by every invoke task: the error boundary, and the parser hooks for optional positional arguments
and `invoke TASK --help`.

Kept here so that ``tasks.py`` stays a thin layer of flags -> package calls.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import io
import os
import re
import sys
from typing import Callable, Iterable, Sequence

from invoke.exceptions import Exit, ParseError
from invoke.parser import Parser, ParserContext
from invoke.parser.parser import ParseMachine
from invoke.program import Program

from shipyard.errors import ShipyardError


# The command the user runs shipyard's tasks with: "invoke" in the checkout (tasks.py), "shipyard" for the installed
# command and `python -m shipyard` (set by shipyard.tasks.main). Messages are written once, with `invoke TASK`;
# as_run() names the program actually running where they are printed, so that a user of the `shipyard` command is
# never told to type a command that does not exist outside the checkout.
_PROGRAM = {"name": "invoke", "pattern": None}


def set_program(name: str, tasks: Iterable[str]) -> None:
    """Name ``name`` instead of ``invoke`` in front of each of ``tasks`` (full dotted names) in printed messages."""
    names = sorted(set(tasks), key=len, reverse=True)  # longest first: `sandbox.up` before a `sandbox` collection
    alternatives = "|".join(re.escape(t) for t in names)
    _PROGRAM["name"] = name
    _PROGRAM["pattern"] = (re.compile(rf"(?<![\w./-])invoke(?= (?:{alternatives})(?![\w.-]))") if name != "invoke"
                           and names else None)


def program() -> str:
    """The command the user runs the tasks with (``invoke`` or ``shipyard``)."""
    return _PROGRAM["name"]


def as_run(text: str) -> str:
    """``text`` with every `invoke TASK` naming the program the user runs (`shipyard TASK` under the `shipyard`
    command); only a known task's name counts, so prose and other commands stay as written."""
    pattern = _PROGRAM["pattern"]
    return pattern.sub(_PROGRAM["name"], text) if pattern is not None else text


def task_guard(fn: Callable) -> Callable:
    """Turn a :class:`ShipyardError` into one line on stderr and its exit code (2 by default), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # invoke turns bytecode writing off for its whole process, so that no __pycache__ appears beside a tasks.py;
        # the task's lazy imports are then the package's own modules, compiled from source on every run (~0.1 s of
        # each command's start). Python's own switch (-B, PYTHONDONTWRITEBYTECODE) decides for them, as for any import.
        sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)
        try:
            return fn(*args, **kwargs)
        except ShipyardError as exc:
            print(as_run(f"shipyard: error: {exc}"), file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        except KeyboardInterrupt:
            print("shipyard: interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except BrokenPipeError:
            # the reader went away (`invoke launch --dry-run | head`): stop quietly, as a shell tool does on SIGPIPE;
            # stdout goes to /dev/null so that the interpreter's own flush at exit cannot raise again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(141) from None

    return wrapper


OPTIONAL_POSITIONALS = {"env", "environment"}
# How a positional argument is written in usage lines, as the README writes it (`logs JOBID`, `check [ENV]`).
_METAVARS = {"env": "ENV", "environment": "ENV"}


def _help_flag(machine: ParseMachine, token: str):
    """The core ``--help``/``-h`` Argument when ``token`` names it, else None."""
    initial = machine.initial
    if initial is None or token not in initial.flags:
        return None
    flag = initial.flags[token]
    return flag if flag.name == "help" else None


def _help_asked_for(machine: ParseMachine) -> bool:
    """True when ``--help`` was given after the task now being parsed (its value is then that task's name)."""
    initial, context = machine.initial, machine.context
    if initial is None or context is None or context is initial or "help" not in initial.args:
        return False
    return initial.args["help"].value == context.name


def install_parser_hooks(names=OPTIONAL_POSITIONALS) -> None:
    """Make invoke's parser fit shipyard's tasks: optional positionals, and `invoke TASK --help` for every task.

    Optional positionals let `invoke build pytorch-2.3` and `invoke launch --nodes 2` share one task signature:
    invoke treats every positional argument as required, so a missing ``env``/``environment`` is filled with ""
    just before invoke checks for missing positionals; the task treats "" as "use defaults.environment".

    ``--help`` after the task name: invoke's ``ParseMachine.handle`` gives a token to a task's unfilled positional
    before it looks at core flags, so `invoke logs --help` ran `logs` with JOBID "--help" (and `invoke show -h`
    looked up an environment named "-h"). Here a core help flag in that spot does what invoke does for tasks without
    positionals: it sets ``--help``'s value to the task name, and the then missing positionals are not an error,
    because the program prints the task's help and exits before any task runs. A flag's value is still taken as given
    (`--name --help` names the launcher "--help"), as invoke does.

    The usage line of a task's help names its positionals (`logs [--options] JOBID`), which invoke leaves out.

    A task's arguments that do not parse (a missing JOBID, an unknown flag) are bad input: one line and exit 2, as
    for every other bad input (invoke itself exits 1 on a ParseError, which shipyard keeps for failed checks and jobs).
    The task parser holds only the tasks that a word of the command line (or ``--help``'s value) names: invoke
    deep-copies every task's flags for each parse, about as much time as shipyard's own start-up work, and a task no
    word names can never be switched to, so the parse is the same. Shell completion (``--complete``) sees every task.
    Called once from tasks.py, before the task arguments are parsed; a second call changes nothing.
    """
    if getattr(ParseMachine, "_shipyard_hooks", False):
        return
    handle, complete_context, print_task_help = (ParseMachine.handle, ParseMachine.complete_context,
                                                 Program.print_task_help)
    parse_tasks, make_parser = Program.parse_tasks, Program._make_parser

    def parse_tasks_bad_input_is_2(self):
        try:
            return parse_tasks(self)
        except ParseError as exc:
            raise Exit(f"shipyard: error: {' '.join(str(exc).split())}", code=2) from None

    def handle_help_first(self, token):
        context = self.context
        unknown = unknown_flag(self, token)
        if unknown:
            raise ParseError(unknown)
        flag = _help_flag(self, token)
        if (flag is not None and self.current_state != "unknown" and context is not None
                and context is not self.initial and token not in context.flags
                and not self.waiting_for_flag_value and context.missing_positional_args):
            flag.value = context.name
            return None
        try:
            return handle(self, token)
        except ValueError:  # invoke casts a flag's value to its default's type: `-n abc` for an int flag
            name = getattr(getattr(self, "flag", None), "name", None)
            shown = f"--{name.replace('_', '-')}" if name else "a flag"
            raise ParseError(f"{shown} {token!r}: expected a whole number") from None

    def complete_optional_context(self):
        context = self.context
        if context is not None and context is not self.initial:
            for arg in context.positional_args:
                if arg.value is None and arg.name in names:
                    arg.value = ""
            if _help_asked_for(self) and context.missing_positional_args:
                # invoke's own check would fail on the positionals that --help stood in for; no task runs
                if context not in self.result:
                    self.result.append(context)
                return None
        return complete_context(self)

    def print_task_help_with_positionals(self, name):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_task_help(self, name)
        _, _, body = out.getvalue().partition("\n")
        print(usage_line(self.binary, name, self.parser.contexts[name].positional_args, names) + "\n" + body, end="")

    def make_parser_of_named_tasks(self):
        if self.args.complete.value:  # shell completion offers every task
            return make_parser(self)
        named = set(self.core.unparsed) if self.core else set()
        if isinstance(self.args.help.value, str):
            named.add(self.args.help.value)
        ignore = self.config.tasks.ignore_unknown_help
        return Parser(initial=self.initial_context, contexts=[  # Collection.to_contexts, of the named tasks only
            ParserContext(name=primary, aliases=aliases,
                          args=self.collection[primary].get_arguments(ignore_unknown_help=ignore))
            for primary, aliases in self.collection.task_names.items()
            if primary in named or named.intersection(aliases)])

    ParseMachine.handle = handle_help_first
    ParseMachine.complete_context = complete_optional_context
    Program.print_task_help = print_task_help_with_positionals
    Program.parse_tasks = parse_tasks_bad_input_is_2
    Program._make_parser = make_parser_of_named_tasks
    ParseMachine._shipyard_hooks = True


def unknown_flag(machine, token: str) -> str | None:
    """One line for a long flag the task does not have, with the closest one it has; None for anything else.

    Why here and not in invoke's own "No idea what ... is!": a task with a positional takes a mistyped flag as that
    positional's value (`--imag x` became the environment "--imag"), and the error named the next word instead."""
    context = machine.context
    if (context is None or context is machine.initial or machine.waiting_for_flag_value
            or not token.startswith("--") or token == "--"):
        return None
    name = token.partition("=")[0]
    known = {*context.flags, *context.inverse_flags, *(machine.initial.flags if machine.initial else ())}
    if name in known:
        return None
    close = difflib.get_close_matches(name, sorted(k for k in known if k.startswith("--")), n=1, cutoff=0.8)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{context.name}: no flag {name}{hint} (--help lists its flags)"


def usage_line(binary: str, task: str, positionals: Sequence, optional=OPTIONAL_POSITIONALS) -> str:
    """invoke's per-task usage line with the positional arguments in it: ``logs [--options] JOBID``, ``show
    [--options] [ENV]`` (optional ones in brackets), as the README writes them."""
    words = []
    for arg in positionals:
        metavar = _METAVARS.get(arg.name, arg.name.upper().replace("-", "_"))
        words.append(f"[{metavar}]" if arg.name in optional else metavar)
    args = " ".join(["[--options]", *words]) + " "
    return f"Usage: {binary} [--core-opts] {task} {args}[other tasks here ...]"


def argv_after_dashdash(argv: Sequence[str]) -> tuple[str, ...]:
    """The words after the first standalone ``--`` in ``sys.argv``, exactly as the shell passed them.

    invoke hands a task its ``--`` remainder as one string joined with spaces, which loses quoting
    (``"a b"`` becomes two words); the training command must reach the script's argv unchanged, so it is read here.
    """
    argv = list(argv)
    return tuple(argv[argv.index("--") + 1:]) if "--" in argv else ()
