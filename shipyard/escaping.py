"""The escaping rule for each kind of generated file, in one place: shell (launchers, wrappers, %post), Dockerfile
values, Apptainer %environment values, Lua strings (modulefiles).

Every value from registry.yaml or a flag that reaches a generated file goes through the rule for that file's syntax;
templates see these functions as Jinja filters (see :mod:`shipyard.jinja_environment`), never raw string concatenation.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from shipyard.errors import ShipyardError

# Apptainer >= 1.2 build-argument references; the Dockerfile renderer maps them to ${NAME}.
BUILD_ARG_REF = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# bash's reserved words: harmless as a quoted value, but shellcheck (and a reader) takes `export A=then` for syntax
_RESERVED = frozenset("if then else elif fi case esac for select while until do done in function time coproc "
                      "{ } ! [[ ]]".split())


def shell_quote(word: object) -> str:
    """Quote one word for bash so that it reaches the program unchanged.

    ``shlex.quote`` for printable text (non-ASCII letters included); bash's reserved words, and words that start with
    ``=``, are quoted too. Text with control characters (a newline, a tab)
    gets bash's ``$'...'`` form instead: a newline inside plain single quotes would be correct in the script body but
    would end a ``#`` comment line (the regenerate header) and let the rest run as code.
    """
    word = str(word)
    if word.isprintable():
        quoted = shlex.quote(word)
        # `export A==` is valid bash, but reads as a typo for `==`; shlex leaves such words bare only when they hold
        # no quote or other special character, so plain single quotes are then safe
        if (word in _RESERVED or word.startswith("=")) and not quoted.startswith("'"):
            return f"'{word}'"
        return quoted
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


def lua_comment(value: object) -> str:
    """Text in a ``--`` Lua comment: a line break would end the comment and make the rest code, so one line only."""
    if not one_line(value):
        raise UnsafeValue(f"{value!r}: a line break or control character in a modulefile comment")
    return str(value)


def comment_line(value: object) -> str:
    """Text in a ``#`` comment of a shell script or Dockerfile: a line break would end the comment and run the rest,
    so one line only."""
    if not one_line(value):
        raise UnsafeValue(f"{value!r}: a line break or control character in a comment line")
    return str(value)


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


# ----------------------------------------------------------------------------------------------- one-line values
# A line break for *any* reader of a generated file: C0/C1 control characters (\n, \r, \v, \f, NEL ...) and Unicode's
# line and paragraph separators (Python's str.splitlines breaks at those; Go's bufio.ScanLines at \n only).
LINE_BREAK = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(value: object) -> bool:
    """True when ``value`` cannot start a new line in any generated file (no control character, no separator)."""
    return not LINE_BREAK.search(str(value))


class UnsafeValue(ShipyardError, ValueError):
    """A value reached a renderer that has no escaping for it: one line, exit 2 (the loader refuses such values
    first, naming file:line; this is the renderer's own guard, for values that come from flags)."""


# ----------------------------------------------------------------------------------------------- Apptainer definitions
# Apptainer's definition parser (pkg/build/types/parser/deffile.go, scanDefinitionFile) splits the file into lines
# with bufio.ScanLines (at "\n") and starts a section at every line whose first word (bufio.ScanWords, these
# whitespace runes) begins with '%', wherever it stands: indented, inside quotes, inside a heredoc. Nothing escapes a
# '%'. All() also starts a new build stage at any line that begins with "bootstrap:" (case-insensitive). Before
# either, internal/pkg/build/args/reader.go replaces every {{ NAME }} with the raw build-argument value.
GO_SPACE = " \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
           "\u2028\u2029\u202f\u205f\u3000"
# What a build-argument value may hold: it is pasted unquoted into %arguments, and into the quotes of %environment
# and %labels, before Apptainer parses the file; nothing here can end a quote, a line or a word.
BUILD_ARG_VALUE = re.compile(r"\A[A-Za-z0-9._:/@+=,~-]*\Z")
# What a %files source or destination may hold: Apptainer expands %files sources through /bin/sh, so no shell
# metacharacter, no whitespace, no '%' (a first word), no braces (build arguments) and no backslash (a Dockerfile
# line continuation).
FILE_PATH = re.compile(r"\A[A-Za-z0-9._+@/=:,-]+\Z")


def def_line(value: object, first: bool = True) -> str:
    """A value placed on one line of a ``.def`` where Apptainer has no quoting (%labels, %arguments, %files, %help,
    the header): returned unchanged when it stays on its line and, where it starts the line (``first``), cannot open
    a section or a stage; otherwise :class:`UnsafeValue` (registry.yaml's schema refuses such values first, with
    file:line)."""
    text = str(value)
    if not one_line(text):
        raise UnsafeValue(f"{text!r}: a line break or control character in a definition line")
    if not first:
        return text
    first = text.lstrip(GO_SPACE)
    if first.startswith("%"):
        raise UnsafeValue(f"{text!r}: a word starting with '%' would open an Apptainer section")
    if first.lower().startswith("bootstrap:"):
        raise UnsafeValue(f"{text!r}: a line starting with 'bootstrap:' would start another Apptainer build stage")
    return text


def def_word(value: object) -> str:
    """One word of a .def line (a label key, a build-argument name): :func:`def_line` and no whitespace."""
    text = def_line(value)
    if not text or any(c in GO_SPACE for c in text):
        raise UnsafeValue(f"{text!r}: not one word")
    return text


def def_path(value: object) -> str:
    """A %files / COPY path: the charset of :data:`FILE_PATH` only."""
    text = str(value)
    if not FILE_PATH.match(text):
        raise UnsafeValue(f"{text!r}: a file path may hold only letters, digits and ._+@/=:,-")
    return text


def build_arg_value(value: object) -> str:
    """A build-argument value, pasted raw by Apptainer wherever ``{{ NAME }}`` appears: the safe charset only."""
    text = str(value)
    if not BUILD_ARG_VALUE.match(text):
        raise UnsafeValue(f"{text!r}: a build-argument value may hold only letters, digits and ._:/@+=,~-")
    return text


def env_line(value: str, expand: bool = False) -> str:
    """An ``export`` value in %environment: :func:`env_value` of a one-line value (a quoted newline would still end
    Apptainer's line and could open a section)."""
    if not one_line(value):
        raise UnsafeValue(f"{value!r}: a line break or control character in an %environment value")
    return env_value(value, expand)


# ----------------------------------------------------------------------------------------------- Dockerfiles
# Docker reads a Dockerfile line by line: a new line is a new instruction unless the previous one ends with the
# escape character ('\\'), which continues it. Keys are bare words before '='.
DOCKER_KEY = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._/-]*\Z")


def docker_key(value: object) -> str:
    """A LABEL key or ENV/ARG name: a bare word Docker cannot read as more than one key."""
    text = str(value)
    if not DOCKER_KEY.match(text):
        raise UnsafeValue(f"{text!r}: not usable as a Dockerfile key (letters, digits and ._/-)")
    return text


def docker_line(value: object) -> str:
    """:func:`docker_quote` of a one-line value: a newline inside quotes still ends a Dockerfile instruction."""
    if not one_line(value):
        raise UnsafeValue(f"{value!r}: a line break or control character in a Dockerfile value")
    return docker_quote(value)


def docker_env_line(value: str, expand: bool = False) -> str:
    if not one_line(value):
        raise UnsafeValue(f"{value!r}: a line break or control character in a Dockerfile value")
    return docker_env(value, expand)


# ----------------------------------------------------------------------------------------------- #SBATCH lines
# sbatch reads "#SBATCH" lines with its own tokenizer (not a shell): quotes and backslashes mean something else
# there, so no quoting can protect a value. Only words of this charset go into such a line.
SBATCH_WORD = re.compile(r"\A[A-Za-z0-9._:%/+=@,-]+\Z")


def sbatch_value(value: object, what: str = "value", also: str = "") -> str:
    """A value of an ``#SBATCH`` option: returned when it is one plain word; otherwise :class:`UnsafeValue`.
    ``also``: further characters of no meaning to sbatch's tokenizer that this option's syntax needs (``&|`` of
    ``--constraint``; never whitespace, a quote or a backslash)."""
    text = str(value)
    assert not set(also) & set(" \t\"'\\#"), also
    if not SBATCH_WORD.match(text.translate({ord(c): "_" for c in also})):
        raise UnsafeValue(f"{what} {text!r}: not usable in an #SBATCH line (letters, digits and ._:%/+=@,-{also} "
                          "only)")
    return text
