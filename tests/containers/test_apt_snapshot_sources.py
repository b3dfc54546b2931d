"""The apt sources registry.yaml's apt_snapshot renders, read by real apt: this Debian 12 machine's own (the apt of
the debian12 images) from a stand-in of a snapshot mirror in front of the Debian mirror the tests use
(fixtures_debian.debian_mirror). The load checks and golden files: tests/registry/test_apt_snapshot.py."""

from __future__ import annotations

import pytest
from helpers_registry import DATA

from shipyard import registry

TEXT = (DATA / "snapshot.yaml").read_text()
BLOCK = "apt_snapshot:\n  date: 20260101T000000Z\n"


def _load(text: str):
    return registry.load_text(text, "registry.yaml")



class _SnapshotStandIn:
    """A snapshot mirror in the test process: ``/debian/DATE/...`` and ``/debian-security/DATE/...`` served from the
    Debian mirror this machine's apt uses (fixtures_debian.debian_mirror) and its security archive beside it, so
    apt reads the snapshot layout shipyard writes. Every path asked for is kept."""

    def __init__(self, date: str):
        import threading
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from fixtures_debian import debian_mirror

        main = debian_mirror().rstrip("/")
        upstream = {"debian": main, "debian-security": main.rsplit("/", 1)[0] + "/debian-security"}
        self.paths: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stand_in.paths.append(self.path)
                archive, _, rest = self.path.lstrip("/").partition("/")
                when, _, rest = rest.partition("/")
                if archive not in upstream or when != date:
                    self.send_error(404)
                    return
                try:
                    with urllib.request.urlopen(f"{upstream[archive]}/{rest}", timeout=60) as r:
                        body = r.read()
                except OSError as exc:
                    self.send_error(getattr(exc, "code", 502) or 502)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.slow  # reads Debian's archive indexes (about 10 MB) through the machine's Debian mirror
def test_apt_reads_the_rendered_snapshot_sources_from_a_stand_in_of_the_local_debian_mirror(tmp_path):
    """The sources lines the recipe writes for debian12, given to this Debian 12 machine's own apt (the apt of the
    debian12 images): `apt-get update` reads every suite from URL/ARCHIVE/DATE and checks its signature against
    Debian's keyring; the stand-in serves nothing for another date, so a line without the date would fail."""
    import os
    import shlex
    import subprocess

    from shipyard.definitions.recipe import apt_snapshot_sources

    date = "20260101T000000Z"
    stand_in = _SnapshotStandIn(date)
    try:
        reg = _load(TEXT.replace(BLOCK, BLOCK + f"  url: {stand_in.url}\n"))
        step = apt_snapshot_sources(reg.environment("debian12"), reg.apt_snapshot)
        printf = next(c for c in step.commands if c.startswith("printf "))
        lines = shlex.split(printf.rsplit(" > ", 1)[0])[2:]
        (tmp_path / "sources.list").write_text("\n".join(lines) + "\n")
        (tmp_path / "lists" / "partial").mkdir(parents=True)
        argv = ["apt-get", "update", "-o", f"Dir::Etc::SourceList={tmp_path / 'sources.list'}",
                "-o", "Dir::Etc::SourceParts=-", "-o", f"Dir::State::Lists={tmp_path / 'lists'}",
                "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root", "-o", "Acquire::Languages=none"]
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "all_proxy")}
        res = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    finally:
        stand_in.stop()
    assert res.returncode == 0 and "W:" not in res.stdout + res.stderr, res.stdout[-2000:] + res.stderr[-2000:]
    for archive, suite in (("debian", "bookworm"), ("debian", "bookworm-updates"),
                           ("debian-security", "bookworm-security")):
        assert f"/{archive}/{date}/dists/{suite}/InRelease" in stand_in.paths, stand_in.paths
    assert any(p.startswith(f"/debian/{date}/dists/bookworm/main/binary-") for p in stand_in.paths), stand_in.paths
