"""shipyard.facts: a data file parsed once is kept beside the package's bytecode, and what comes back from there is
what parsing the text gives."""

from __future__ import annotations

import yaml

from shipyard import facts


def test_a_kept_file_gives_what_the_text_parses_to(bytecode_folder):
    facts.load.cache_clear()
    try:
        parsed = facts.load("compat")
        kept = [p for p in bytecode_folder.iterdir() if p.name.startswith("compat.")]
        assert len(kept) == 1
        facts.load.cache_clear()
        assert facts.load("compat") == parsed == yaml.safe_load(facts.text("compat.yaml"))
        assert isinstance(next(iter(parsed["arches"])), int)  # keys keep their YAML type (an arch is a number)
    finally:
        facts.load.cache_clear()


def test_a_damaged_kept_file_is_parsed_again(bytecode_folder):
    facts.load.cache_clear()
    try:
        parsed = facts.load("stage")
        (kept,) = [p for p in bytecode_folder.iterdir() if p.name.startswith("stage.")]
        kept.write_bytes(kept.read_bytes()[:5])
        facts.load.cache_clear()
        assert facts.load("stage") == parsed
    finally:
        facts.load.cache_clear()


def test_a_kept_file_of_another_text_is_not_used(bytecode_folder, monkeypatch):
    facts.load.cache_clear()
    try:
        facts.load("stage")
        monkeypatch.setattr(facts, "text", lambda name: "changed: 1\n")
        facts.load.cache_clear()
        assert facts.load("stage") == {"changed": 1}
    finally:
        facts.load.cache_clear()
