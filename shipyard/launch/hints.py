"""Hints for failures whose error names the wrong thing (shipyard/data/launch.yaml ``failure_hints``).

A torchrun that lost its c10d store says so ("The connection to the C10d store has failed") while the cause is
elsewhere: the rendezvous host's torchrun ended first, often because a rank on the failing node never exited
(docs/launcher-rules.md rule 12). The launcher reads its own log after a failed step and adds one line per known
signature, so the user reads the cause next to the error rather than in a torch issue tracker."""

from __future__ import annotations

from shipyard.launch.fabric import launch_data
from shipyard.nccl_transport import PREFIX, awk_str


def failure_hints() -> list[dict]:
    """The data's signatures, each ``{"match": fixed string, "hint": text}``."""
    return list(launch_data().get("failure_hints") or [])


def awk_program(hints: list[dict]) -> str:
    """A POSIX awk program (mawk, gawk, busybox awk) that reads a job log on stdin and prints ``shipyard: hint: TEXT``
    once for each hint whose fixed string occurs in it, in the data's order. Embedded in single quotes in the
    launcher: :func:`~shipyard.nccl_transport.awk_str` refuses quotes and backslashes in the data."""
    tests = "\n".join(f"index($0, {awk_str(h['match'])}) {{ seen[{i}] = 1 }}" for i, h in enumerate(hints))
    prints = "\n".join(f"  if ({i} in seen) print {awk_str(PREFIX + 'hint: ' + ' '.join(h['hint'].split()))}"
                       for i, h in enumerate(hints))
    return f"{tests}\nEND {{\n{prints}\n}}"
