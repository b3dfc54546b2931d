"""A faithful model of how Apptainer splits a definition file into build stages and sections (test helper).

Written from Apptainer's own source (github.com/apptainer/apptainer, commit 917d6657, read 2026):

* ``internal/pkg/build/args/reader.go`` ``NewReader``: before anything is parsed, every match of
  ``{{\\s*(\\w+)\\s*}}`` (Go regexp: ASCII ``\\s`` = ``[\\t\\n\\f\\r ]``, ``\\w`` = ``[0-9A-Za-z_]``) is replaced by the
  raw build-argument value (``--build-arg``, else the ``%arguments`` default), except where the text between the
  last newline and the match contains ``\\s*[#][^!]\\s*.*`` (an unanchored Match: the line is taken for a comment).
  A reference to an undefined argument is an error. Values that themselves hold ``{{ X }}`` get one more level.
* ``pkg/build/types/parser/deffile.go`` ``All``: the file is cut into stages before every match of
  ``(?mi)^bootstrap:``.
* ``deffile.go`` ``scanDefinitionFile``: each stage is read line by line with ``bufio.ScanLines`` (lines end at
  ``\\n``; one trailing ``\\r`` is dropped) and a section starts at every line whose first word (``bufio.ScanWords``,
  whose ``isSpace`` is the rune set :data:`GO_SPACE`) begins with ``%``: indentation, quotes, heredocs do not matter.
* ``getSectionName``: the section name is the header line without leading ``%``, lowercased, up to the first
  ``" "``; ``parseTokenSection`` keeps the rest as the section's arguments (``%files from stage``).
* ``GetLabels``: each trimmed ``%labels`` line that is not empty and not a ``#`` comment is ``KEY VALUE`` split at
  the first ``" "``.

Checked against Apptainer's own parser test inputs, kept under ``tests/data/apptainer/`` (see its README).
"""

from __future__ import annotations

import re

GO_SPACE = frozenset(" \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                     "\u2028\u2029\u202f\u205f\u3000")
_BUILD_ARG = re.compile(r"\{\{[\t\n\f\r ]*([0-9A-Za-z_]+)[\t\n\f\r ]*\}\}")
_COMMENT = re.compile(r"[\t\n\f\r ]*[#][^!][\t\n\f\r ]*.*")
_STAGE = re.compile(r"^bootstrap:", re.M | re.I)


class UndefinedBuildArg(ValueError):
    pass


def substitute_build_args(src: str, args: dict[str, str]) -> str:
    """``NewReader``: the text Apptainer parses once build arguments are pasted in."""
    out: list[str] = []
    i = 0
    for m in _BUILD_ARG.finditer(src):
        newline = i
        for start in range(m.start(), i - 1, -1):
            if src[start] == "\n":
                newline = start
                break
        if _COMMENT.search(src[newline:m.start()]):
            continue
        out.append(src[i:m.start()])
        name = m.group(1)
        if name not in args:
            raise UndefinedBuildArg(name)
        val = args[name]
        new = val
        for n in _BUILD_ARG.finditer(val):
            if n.group(1) in args:
                new = new.replace(n.group(0), args[n.group(1)])
        out.append(new)
        i = m.end()
    out.append(src[i:])
    return "".join(out)


def stages(text: str) -> list[str]:
    """``All``: the text cut before every line starting with ``bootstrap:`` (any case); empty pieces dropped."""
    cuts = [m.start() for m in _STAGE.finditer(text)]
    pieces, prev = [], 0
    for c in cuts:
        pieces.append(text[prev:c])
        prev = c
    pieces.append(text[prev:])
    return [p for p in pieces if p]


def scan_lines(text: str) -> list[str]:
    """``bufio.ScanLines``: split at ``\\n``, drop one trailing ``\\r`` per line, no empty last token."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def first_word(line: str) -> str:
    """``bufio.ScanWords``' first token."""
    i = 0
    while i < len(line) and line[i] in GO_SPACE:
        i += 1
    j = i
    while j < len(line) and line[j] not in GO_SPACE:
        j += 1
    return line[i:j]


def sections(stage: str) -> list[tuple[str, str, list[str]]]:
    """(name, args, body lines) of every section of one stage, in order (the header is not a section)."""
    out: list[tuple[str, str, list[str]]] = []
    for line in scan_lines(stage):
        if first_word(line).startswith("%"):
            # Apptainer ends the previous section at this line in every case; an indented header then gets a name
            # Go reads as "" (invalid section: the build fails) unless it is the first section (TrimSpace'd). The
            # boundary is what matters here, so the name is read without the indentation.
            head = "".join(line).lstrip("".join(GO_SPACE)).lstrip("%")
            name, _, args = head.partition(" ")
            out.append((name.lower(), args, []))
        elif out:
            out[-1][2].append(line)
    return out


def parse(text: str, build_args: dict[str, str] | None = None) -> list[list[tuple[str, str, list[str]]]]:
    """Every stage's sections after build-argument substitution, as Apptainer would see them."""
    return [sections(s) for s in stages(substitute_build_args(text, build_args or {}))]


def labels(body: list[str]) -> dict[str, str]:
    """``GetLabels`` of a %labels body."""
    out = {}
    space = "".join(GO_SPACE)  # strings.TrimSpace trims Unicode white space
    for line in "\n".join(body).strip(space).split("\n"):
        line = line.strip(space)
        if not line or line.startswith("#"):
            continue
        key, _, val = line.partition(" ")
        out[key.strip(space)] = val.strip(space)
    return out
