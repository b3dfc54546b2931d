"""Which network transport NCCL selected, read from its NCCL_DEBUG=INFO lines: the one set of rules.

Two readers need this answer: the launcher's end-of-job line (shell, running on the cluster, where shipyard is not
installed) and `invoke nccl-report` (Python, here). So the rules are data (shipyard/data/nccl.yaml) and this module
has two executions of them: :class:`Reader` in Python, and :func:`awk_program`, the same procedure rendered as a POSIX
awk program for the launcher. tests/test_nccl_transport.py runs both on every real log of the corpus and requires the
same line, so the two cannot drift apart.

Why the strongest evidence and not the first mention: ``NET/IB : No device found.`` comes before a socket fallback,
and NCCL <= 2.4.7 prints ``NET/Socket : Using`` at bootstrap before selecting IB; the first mention is wrong in both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from shipyard import facts

PREFIX = "shipyard: "


def rules() -> dict:
    """shipyard/data/nccl.yaml, parsed once."""
    return facts.load("nccl")


@dataclass(frozen=True)
class Transport:
    """What a log says NCCL selected: the names (as printed, in order of first appearance), their families
    (ofi, ib, socket, other), aws-ofi-nccl's libfabric providers, and which kind of evidence decided."""

    names: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    evidence: str | None = None  # network | channel | net_using | plugin; None when nothing was logged

    @property
    def logged(self) -> bool:
        return bool(self.names)


def family(name: str) -> str:
    """'IBext_v6' -> 'ib', 'AWS Libfabric' -> 'ofi', 'Socket' -> 'socket'; an unknown name -> 'other'."""
    for fam, spec in rules()["families"].items():
        if re.fullmatch(f"(?:{spec['pattern']})", name):
            return fam
    return "other"


class Reader:
    """Feeds lines one at a time (nccl-report reads a log once for rows and transport alike)."""

    def __init__(self) -> None:
        r = rules()
        self._evidence = [(e, re.compile(e["before"]), re.compile(e["after"]),
                           re.compile(f"(?:{e['only']})") if e.get("only") else None) for e in r["evidence"]]
        self._name = re.compile(f"(?:{r['name_pattern']})")
        self._prov_before = re.compile(r["provider"]["before"])
        self._prov = re.compile(f"(?:{r['provider']['pattern']})")
        self.best = 0
        self.kind: str | None = None
        self.names: list[str] = []
        self.providers: list[str] = []

    def feed(self, line: str) -> None:
        for e, before, after, only in self._evidence:
            if e["strength"] < self.best:
                continue
            m = before.search(line)
            if not m:
                continue
            rest = line[m.end():]
            a = after.search(rest)
            if not a:
                continue
            name = rest[:a.start()]
            if not self._name.fullmatch(name) or (only is not None and not only.fullmatch(name)):
                continue
            if e["strength"] > self.best:
                self.best, self.kind, self.names = e["strength"], e["kind"], []
            if name not in self.names:
                self.names.append(name)
        m = self._prov_before.search(line)
        if m:
            p = self._prov.match(line, m.end())
            if p and p.group() not in self.providers:
                self.providers.append(p.group())

    def result(self) -> Transport:
        names = list(self.names)
        weak = rules()["weak"]
        if self.best == weak["strength"] and len(names) > 1 and weak["name"] in names:
            names.remove(weak["name"])
        return Transport(tuple(names), tuple(family(n) for n in names), tuple(self.providers), self.kind)


def read(lines: Iterable[str]) -> Transport:
    reader = Reader()
    for line in lines:
        reader.feed(line)
    return reader.result()


def expectation(fabric: str) -> dict:
    """{'family': 'ofi', 'provider': 'efa', 'label': ...} for a cluster fabric."""
    exp = dict(rules()["expect"][fabric])
    exp["label"] = rules()["families"][exp["family"]]["label"]
    return exp


def verdict(t: Transport, fabric: str) -> tuple[str, str]:
    """(status, the launcher's end-of-job line) for a log on a cluster of this fabric.

    status: ok | none | mismatch | mixed | provider. The line is exactly what the launcher's awk prints.
    """
    exp = expectation(fabric)
    names = ", ".join(t.names)
    if not t.logged:
        return "none", (PREFIX + "NCCL transport: none logged (no NCCL communicator in this job, or NCCL_DEBUG / "
                        "NCCL_DEBUG_SUBSYS were overridden without INIT)")
    fams = set(t.families)
    if len(fams) > 1:
        return "mixed", (PREFIX + f"WARNING: NCCL transport differs between ranks: {names}; expected {exp['label']} "
                         f"on fabric {fabric}")
    if fams != {exp["family"]}:
        return "mismatch", PREFIX + f"WARNING: NCCL transport selected: {names}, expected {exp['label']} on fabric {fabric}"
    want = exp.get("provider")
    if want and any(p != want for p in t.providers):
        return "provider", (PREFIX + f"WARNING: NCCL transport selected: {names} over libfabric provider "
                            f"{', '.join(t.providers)}, expected provider {want} on fabric {fabric}")
    return "ok", PREFIX + f"NCCL transport selected: {names} (as expected on fabric {fabric})"


# ------------------------------------------------------------------------------------------------ the awk rendering


def awk_str(s: str) -> str:
    """A Python string as an awk string literal (the data's patterns have no quotes or backslashes of their own)."""
    if any(c in s for c in "\"\\'\n"):
        raise ValueError(f"pattern {s!r} cannot be rendered into the launcher's awk program")
    return '"' + s.replace("\t", "\\t").replace("\r", "\\r") + '"'


def awk_program(fabric: str) -> str:
    """The end-of-job rule as a POSIX awk program (mawk, gawk, busybox awk): reads a job log on stdin, prints the
    same line as :func:`verdict`. It is embedded in single quotes in the launcher, so it contains none."""
    r = rules()
    exp = expectation(fabric)
    fam_lines = "\n".join(f"  if (n ~ {awk_str('^(' + spec['pattern'] + ')$')}) return {awk_str(f)}"
                          for f, spec in r["families"].items())
    grabs = "\n".join(
        f"  grab({e['strength']}, {awk_str(e['kind'])}, {awk_str(e['before'])}, {awk_str(e['after'])}, "
        f"{awk_str('^(' + e['only'] + ')$') if e.get('only') else awk_str('')})"
        for e in r["evidence"])
    label, want = exp["label"], exp.get("provider") or ""
    p = PREFIX
    return f"""function fam(n) {{
{fam_lines}
  return "other"
}}
function grab(s, kind, before, after, only,   rest, n) {{
  if (s < best || !match($0, before)) return
  rest = substr($0, RSTART + RLENGTH)
  if (!match(rest, after)) return
  n = substr(rest, 1, RSTART - 1)
  if (n !~ {awk_str('^(' + r['name_pattern'] + ')$')}) return
  if (only != "" && n !~ only) return
  if (s > best) {{ best = s; cnt = 0; split("", seen) }}
  if (!(n in seen)) {{ seen[n] = 1; names[++cnt] = n }}
}}
BEGIN {{ best = 0; cnt = 0; pc = 0 }}
{{
{grabs}
  if (match($0, {awk_str(r['provider']['before'])})) {{
    rest = substr($0, RSTART + RLENGTH)
    if (match(rest, {awk_str('^(' + r['provider']['pattern'] + ')')})) {{
      pv = substr(rest, 1, RLENGTH)
      if (!(pv in pseen)) {{ pseen[pv] = 1; provs[++pc] = pv }}
    }}
  }}
}}
END {{
  list = ""; k = 0; fams = ""; nf = 0
  for (i = 1; i <= cnt; i++) {{
    if (best == {r['weak']['strength']} && cnt > 1 && names[i] == {awk_str(r['weak']['name'])}) continue
    list = list (k++ ? ", " : "") names[i]
    f = fam(names[i])
    if (!(f in fseen)) {{ fseen[f] = 1; nf++; fams = f }}
  }}
  if (k == 0) {{
    print "{p}NCCL transport: none logged (no NCCL communicator in this job, or NCCL_DEBUG / NCCL_DEBUG_SUBSYS were overridden without INIT)"
  }} else if (nf > 1) {{
    print "{p}WARNING: NCCL transport differs between ranks: " list "; expected {label} on fabric {fabric}"
  }} else if (fams != "{exp['family']}") {{
    print "{p}WARNING: NCCL transport selected: " list ", expected {label} on fabric {fabric}"
  }} else {{
    bad = 0; pl = ""
    for (i = 1; i <= pc; i++) {{ pl = pl (i > 1 ? ", " : "") provs[i]; if ("{want}" != "" && provs[i] != "{want}") bad = 1 }}
    if (bad) print "{p}WARNING: NCCL transport selected: " list " over libfabric provider " pl ", expected provider {want} on fabric {fabric}"
    else print "{p}NCCL transport selected: " list " (as expected on fabric {fabric})"
  }}
}}
"""
