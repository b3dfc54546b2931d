"""The escaping rule for each kind of generated file, in one place: shell (launchers, wrappers, %post), Dockerfile
values, Apptainer %environment values, Lua strings (modulefiles).

Every value from registry.yaml or a flag that reaches a generated file goes through the rule for that file's syntax;
templates see these functions as Jinja filters (see :mod:`shipyard.templating`), never raw string concatenation.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

# Apptainer >= 1.2 build-argument references; the Dockerfile renderer maps them to ${NAME}.
BUILD_ARG_REF = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# bash's reserved words: harmless as a quoted value, but shellcheck (and a reader) takes `export A=then` for syntax
_RESERVED = frozenset("if then else elif fi case esac for select while until do done in function time coproc "
                      "{ } ! [[ ]]".split())


def shell_quote(word: object) -> str:
    """Quote one word for bash so that it reaches the program unchanged.

    ``shlex.quote`` for printable text (non-ASCII letters included); bash's reserved words are quoted too. Text with control characters (a newline, a tab)
    gets bash's ``$'...'`` form instead: a newline inside plain single quotes would be correct in the script body but
    would end a ``#`` comment line (the regenerate header) and let the rest run as code.
    """
    word = str(word)
    if word in _RESERVED:
        return f"'{word}'"
    if word.isprintable():
        return shlex.quote(word)
    out = []
    for ch in word:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif not ch.isprintable():
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def shell_join(words: Sequence[object]) -> str:
    """Words quoted with :func:`shell_quote`, joined by spaces: one command line."""
    return " ".join(shell_quote(w) for w in words)


def env_value(value: str, expand: bool = False) -> str:
    """A value in an Apptainer ``%environment`` export: single-quoted, or double-quoted where it may expand."""
    if expand:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return shlex.quote(value)


def docker_quote(value: object) -> str:
    """Double-quoted Dockerfile value with Docker's own $-substitution disabled."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def docker_env(value: str, expand: bool = False) -> str:
    """A Dockerfile ENV value; Apptainer's ``{{ NAME }}`` build arguments become ``${NAME}``."""
    if expand:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return BUILD_ARG_REF.sub(lambda m: "${" + m.group(1) + "}", docker_quote(value))


def lua_string(value: object) -> str:
    """A double-quoted Lua string literal for any text (backslash, quote and control characters escaped)."""
    out = []
    for ch in str(value):
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append("\\%03d" % ord(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
