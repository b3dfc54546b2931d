"""registry.yaml's apt_snapshot: validated at load (the date a real UTC time, the url a plain http(s) URL that needs no
quoting, every environment's os with snapshot sources in shipyard/data/apt.yaml), and the recipe's sources step for
a site's own mirror (the golden files of the OS's public services: tests/golden/definitions/snapshot/)."""

from __future__ import annotations

import pytest
from helpers_registry import DATA

from shipyard import registry
from shipyard.definitions import render as definitions
from shipyard.errors import ShipyardError

TEXT = (DATA / "snapshot.yaml").read_text()
BLOCK = "apt_snapshot:\n  date: 20260101T000000Z\n"


def _load(text: str):
    return registry.load_text(text, "registry.yaml")


def test_a_sites_mirror_replaces_the_public_service_for_every_os():
    reg = _load(TEXT.replace(BLOCK, BLOCK + "  url: http://apt.example.org:8080/snapshots\n"))
    assert reg.apt_snapshot.url == "http://apt.example.org:8080/snapshots"
    deb = definitions.render_definition(reg.environment("debian12"), reg)
    assert ("'deb [check-valid-until=no] http://apt.example.org:8080/snapshots/debian-security/20260101T000000Z "
            "bookworm-security main'") in deb
    jammy = definitions.render_dockerfile(reg.environment("jammy"), reg)
    assert "'deb [check-valid-until=no] http://apt.example.org:8080/snapshots/ubuntu/20260101T000000Z jammy " in jammy
    # the sources are replaced before the first apt-get, in the .def and in both stages of the Dockerfile
    assert deb.index("> /etc/apt/sources.list") < deb.index("apt-get update")
    assert jammy.count("> /etc/apt/sources.list") == 2
    for stage in jammy.split("\nFROM ")[1:]:
        assert stage.index("> /etc/apt/sources.list") < stage.index("apt-get update"), stage[:200]


def test_without_apt_snapshot_apt_reads_the_os_sources():
    reg = _load(TEXT.replace(BLOCK, ""))
    assert reg.apt_snapshot is None
    assert "/etc/apt/sources.list" not in definitions.render_definition(reg.environment("debian12"), reg)


@pytest.mark.parametrize("block,message", [
    ("apt_snapshot:\n  date: 2026-01-01\n", "apt_snapshot.date"),
    ("apt_snapshot:\n  date: 20261301T000000Z\n", "apt_snapshot.date: 20261301T000000Z is not a real date"),
    ("apt_snapshot:\n  url: http://snapshot.debian.org/archive\n", "date"),
    (BLOCK + "  url: snapshot.debian.org/archive\n", "apt_snapshot.url"),
    (BLOCK + "  url: http://user:pw@snapshot.debian.org/archive\n", "apt_snapshot.url"),
    (BLOCK + "  url: \"http://snapshot.debian.org/archive' ; rm -rf /\"\n", "apt_snapshot.url"),
    (BLOCK + "  url: http://snapshot.debian.org/archive/\n", "apt_snapshot.url"),
    (BLOCK + "  mirror: x\n", "apt_snapshot"),
])
def test_bad_apt_snapshot_is_one_line_naming_the_key(block, message):
    with pytest.raises(ShipyardError, match=message) as e:
        _load(TEXT.replace(BLOCK, block))
    assert "\n" not in str(e.value) and str(e.value).startswith("registry.yaml")


def test_an_os_without_snapshot_sources_is_refused_at_load():
    text = TEXT.replace("    os: ubuntu22.04\n", "    os: ubuntu26.04\n    python: \"3.14\"\n", 1) \
        .replace("    python: \"3.11\"\n    os: ubuntu26.04", "    os: ubuntu26.04")
    with pytest.raises(ShipyardError, match=r"environments\.jammy\.os: ubuntu26\.04 has no snapshot sources in "
                                            r"shipyard/data/apt\.yaml \(known: debian12, ubuntu22\.04, ubuntu24\.04\)"):
        _load(text)

