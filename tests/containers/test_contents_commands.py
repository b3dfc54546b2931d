"""`invoke show ENV --contents`, `invoke diff ENV` and `invoke build ENV --verify-rebuild` on a project whose build
manifest holds contents records (the engine's probe is replaced by a stand-in that returns given records: what the
probe reads from a real image is tested in test_contents.py)."""

from __future__ import annotations

import io

import pytest
from helpers_registry import GOLDEN, golden
from test_contents import sample

from shipyard import project as paths
from shipyard.commands import containers as commands
from shipyard.commands.context import Context
from shipyard.containers import engine, manifest
from shipyard.errors import ShipyardError


def ctx_of(reg) -> Context:
    return Context(reg, out=io.StringIO(), err=io.StringIO())


def recorded(reg, env="tiny", **fields):
    manifest.update_manifest(paths.manifest_path(reg, env), environment=env, status="ok",
                             finished="2026-12-07T05:00:00Z", input_hash="ab" * 32, **fields)


def test_show_contents_golden(project):
    recorded(project, contents=sample().to_dict())
    ctx = ctx_of(project)
    assert commands.show_contents(ctx, "tiny") == 0
    golden(GOLDEN / "contents" / "show-command.txt", ctx.out.getvalue())


def test_show_and_diff_without_records_are_one_line(project):
    ctx = ctx_of(project)
    with pytest.raises(ShipyardError, match="no contents recorded for tiny; build it"):
        commands.show_contents(ctx, "tiny")
    recorded(project, contents=sample().to_dict())
    with pytest.raises(ShipyardError, match="no earlier build of tiny recorded its contents"):
        commands.diff(ctx, "tiny")
    with pytest.raises(ShipyardError, match="--against nope.json: no such build manifest"):
        commands.diff(ctx, "tiny", "nope.json")
    with pytest.raises(ShipyardError, match="--against and --staged: give one of them"):
        commands.diff(ctx, "tiny", "x.json", staged=["current"])
    with pytest.raises(ShipyardError, match="--staged given 3 times"):
        commands.diff(ctx, "tiny", staged=["a", "b", "c"])


def test_diff_the_build_before(project):
    recorded(project, contents=sample(python={"torch": "2.3.1", "numpy": "2.0.0"}).to_dict(),
             previous_contents=sample().to_dict())
    ctx = ctx_of(project)
    assert commands.diff(ctx, "tiny") == 0
    golden(GOLDEN / "contents" / "diff-command.txt", ctx.out.getvalue())


def test_diff_against_another_manifest(project, tmp_path):
    recorded(project, contents=sample(apt={"curl": "8.0"}).to_dict())
    other = tmp_path / "staged-v1.json"
    manifest.update_manifest(other, status="ok", finished="2026-11-01T00:00:00Z", input_hash="cd" * 32,
                             contents=sample().to_dict())
    ctx = ctx_of(project)
    assert commands.diff(ctx, "tiny", str(other)) == 0
    text = ctx.out.getvalue()
    assert f"from {other} (built 2026-11-01T00:00:00Z, input hash cdcdcdcdcdcd)" in text
    assert ("apt packages: 1 changed, 0 added, 1 removed\n  ~ curl         7.81.0-1ubuntu1.16 -> 8.0\n"
            "  - libc6:amd64  2.35-0ubuntu3.8\n") in text
    assert "Python packages: no change" in text


@pytest.mark.parametrize("second, code, says", [
    (sample(), 0, "Python packages: identical in both builds"),
    (sample(apt={"libc6:amd64": "2.35-0ubuntu3.9", "curl": "7.81.0-1ubuntu1.16"}), 0,
     "apt drift: 1 apt package(s) differ between two builds of the same lock"),
    (sample(python={"torch": "2.3.1", "numpy": "1.26.5", "filelock": "3.13.1"}), 1,
     "ERROR: 1 Python package(s) differ between two builds of the same lock (numpy)"),
])
def test_rebuild_verdict(second, code, says):
    text, rc = commands.rebuild_verdict("tiny", sample(), second)
    assert rc == code and says in text
    if code == 0 and "apt drift" in says:
        assert "~ libc6:amd64  2.35-0ubuntu3.8 -> 2.35-0ubuntu3.9" in text


def test_verify_rebuild_builds_twice_and_exits_1_on_a_python_difference(project, monkeypatch):
    """Two builds in a row (the second forced), their records compared; the gate and the backend stand in."""
    records = iter([sample(), sample(python={"torch": "2.3.1"})])
    forces = []

    def fake_build(reg, env, *, force, **kw):
        forces.append(force)
        old = manifest.read_manifest(paths.manifest_path(reg, env.name))
        recorded(reg, env.name, contents=next(records).to_dict(), previous_contents=old.contents)
        return manifest.read_manifest(paths.manifest_path(reg, env.name))

    monkeypatch.setattr(engine, "build", fake_build)
    monkeypatch.setattr(Context, "gate", lambda self, env, cluster=None, **kw: [])
    ctx = ctx_of(project)
    assert commands.build(ctx, "tiny", verify_rebuild=True) == 1
    assert forces == [False, True]
    assert "ERROR: 2 Python package(s) differ" in ctx.out.getvalue()
    assert "- filelock" in ctx.out.getvalue() and "- numpy" in ctx.out.getvalue()
    with pytest.raises(ShipyardError, match="--verify-rebuild builds here"):
        commands.build(ctx, "tiny", verify_rebuild=True, slurm=True)


class ProbeBackend:
    """The probe half of a backend: returns the given record, or raises."""

    def __init__(self, result):
        self.result = result

    def probe(self, reg, env, extra):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class Log:
    def __init__(self):
        self.lines = []

    def write(self, line):
        self.lines.append(line)


def test_a_failed_probe_costs_the_record_not_the_build():
    log = Log()
    assert engine.probe_contents(ProbeBackend(ShipyardError("contents probe: exited 64")), None, None, {}, log) is None
    assert log.lines == ["contents not recorded: contents probe: exited 64"]
    log = Log()
    assert engine.probe_contents(ProbeBackend(sample()), None, None, {}, log) == sample()
    assert log.lines == ["contents recorded: 3 Python packages, 2 apt packages, 2 libraries, 2 labels"]
