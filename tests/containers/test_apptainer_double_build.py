"""The apptainer double's definition build on a local base (tests/doubles/apptainer, issue 18 point 5): where the
base is in the private dockerd (`Bootstrap: docker` whose From: the daemon holds), %files, %post and %test run for
real, as Apptainer's build stage runs them (read in its internal/pkg/build): %post writable as `/bin/sh -ex` with a
clean environment and the build's --bind, %environment and %labels written after it, %test in the finished root
filesystem with the image's environment, unless --notest. A failing %post or %test fails the build with Apptainer's
FATAL line, exit 255 and no TARGET. Then shipyard's own build of a *rendered* definition (environment `tiny` on the
fixture base): its %post and %test run, and a %test that finds the wrong torch fails the build."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import fixtures_build as fb
import pytest
from fixtures_build import read_calls
from fixtures_invoke import invoke_cli

from shipyard.containers import engine as b
from shipyard.containers import manifest as mf

pytestmark = [pytest.mark.docker, pytest.mark.double]

DOUBLE = fb.APPTAINER_DOUBLE / "apptainer"
NET = "shipyard-build.env.sh"
# CI's cost: the fixture base is ~40 MB, whose gzip on 2 cores is most of a build; what is packed is not under test here
FAST_SQUASH = "-noI -noD -noF -noX -no-duplicates"

DEF = """Bootstrap: docker
From: {base}

%files
    data/greeting.txt /opt/in/
    data/net-mountpoint /mnt/keep

%environment
    export FROM_ENVIRONMENT=env-value

%labels
    org.example.kind double-test

%post
    . /mnt/shipyard-build.env.sh
    echo "post: https_proxy=$https_proxy FROM_ENVIRONMENT=${{FROM_ENVIRONMENT:-unset}}" \\
        "HOST_ONLY=${{HOST_ONLY:-unset}}" > /opt/post.txt
    cat /opt/in/greeting.txt >> /opt/post.txt
    echo "org.example.from-post yes" >> "$APPTAINER_LABELS"

%test
    false
    test "$FROM_ENVIRONMENT" = env-value && grep -q "^hello from the host" /opt/post.txt
"""


@pytest.fixture
def ctx(tmp_path, docker_env, tiny_base, monkeypatch):
    """A build directory with %files sources and a build-network directory, the calls log, the host variable %post
    must not see (--cleanenv) but %test does."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "greeting.txt").write_text("hello from the host\n")
    (tmp_path / "data" / "net-mountpoint").write_text("")
    net = tmp_path / "net"
    net.mkdir()
    (net / NET).write_text("export https_proxy=http://proxy.example:3128\n")
    monkeypatch.setenv("SHIPYARD_DOUBLE_CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("HOST_ONLY", "from-host")
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_SQUASH_OPTIONS", FAST_SQUASH)
    for var in ("SHIPYARD_DOUBLE_APPTAINER_ROOTFS", "SHIPYARD_DOUBLE_APPTAINER_CACHE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def build(ctx: Path, deftext: str, *opts: str, bind: bool = True) -> subprocess.CompletedProcess:
    (ctx / "image.def").write_text(deftext)
    argv = [str(DOUBLE), "build", *opts, *(["--bind", f"{ctx / 'net'}:/mnt"] if bind else []), "image.sif",
            "image.def"]
    return subprocess.run(argv, cwd=ctx, capture_output=True, text=True, timeout=120)


def builds(ctx: Path) -> list[dict]:
    return [c for c in read_calls(ctx / "calls.jsonl") if c["argv"][0] == "build"]


def test_local_base_runs_files_post_and_test_and_exec_sees_them(ctx, tiny_base):
    res = build(ctx, DEF.format(base=tiny_base))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "INFO:    Running post scriptlet" in res.stdout and "INFO:    Running testscript" in res.stdout
    assert "+ cat /opt/in/greeting.txt" in res.stderr  # %post runs under /bin/sh -ex
    [call] = builds(ctx)
    assert call["bootstrap"] == "local base" and call["ran"] == ["files", "post", "test"] and call["rootfs"] is True
    out = subprocess.run([str(DOUBLE), "exec", "--nv", str(ctx / "image.sif"), "/bin/sh", "-c",
                          'cat /opt/post.txt; echo "env: $FROM_ENVIRONMENT"; cat /.singularity.d/labels.json; echo; '
                          "ls /mnt"], capture_output=True, text=True, cwd=ctx, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # %post: the build-network file's variable, no %environment yet (written after %post), no host variable
    assert lines[:3] == ["post: https_proxy=http://proxy.example:3128 FROM_ENVIRONMENT=unset HOST_ONLY=unset",
                         "hello from the host", "env: env-value"]
    labels = json.loads("\n".join(lines[3:-1]))
    assert labels["org.example.kind"] == "double-test" and labels["org.example.from-post"] == "yes"
    assert labels["org.label-schema.usage.singularity.deffile.from"] == tiny_base
    assert lines[-1] == "keep"  # the bound build-network directory is not packed into the image


def test_failing_post_or_missing_bind_destination_fails_with_no_target(ctx, tiny_base):
    res = build(ctx, f"Bootstrap: docker\nFrom: {tiny_base}\n\n%post\n    echo before\n    false\n    echo after\n",
                bind=False)
    assert res.returncode == 255 and not (ctx / "image.sif").exists()
    assert res.stderr.splitlines()[-1] == \
        "FATAL:   While performing build: while running engine: while running %post section: exit status 1"
    assert "before" in res.stdout and "after" not in res.stdout
    assert builds(ctx)[-1]["ran"] == ["post"]
    # --bind DIR:/mnt on a base without /mnt: a writable build has no underlay to make it (Apptainer's error)
    res = build(ctx, f"Bootstrap: docker\nFrom: {tiny_base}\n\n%post\n    . /mnt/{NET}\n")
    assert res.returncode == 255 and not (ctx / "image.sif").exists()
    assert "destination /mnt doesn't exist in container" in res.stderr.splitlines()[-1]


def test_failing_test_fails_the_build_and_notest_skips_it(ctx, tiny_base):
    deftext = f"Bootstrap: docker\nFrom: {tiny_base}\n\n%post\n    touch /opt-made\n\n%test\n    exit 3\n"
    res = build(ctx, deftext, bind=False)
    assert res.returncode == 255 and not (ctx / "image.sif").exists()
    assert res.stderr.splitlines()[-1] == \
        "FATAL:   While performing build: failed to execute %test script: exit status 3"
    assert builds(ctx)[-1]["ran"] == ["post", "test"] and "%test" in builds(ctx)[-1]["failed"]
    res = build(ctx, deftext, "--notest", bind=False)
    assert res.returncode == 0, res.stderr
    assert builds(ctx)[-1]["ran"] == ["post"] and (ctx / "image.sif").is_file()


def test_shipyard_build_runs_the_rendered_post_and_test(project, apptainer_double, docker_env, tiny_base,
                                                         monkeypatch):
    """`tiny` (stack: base on the fixture base): its rendered %post (pip check) and %test (the pins) run in the
    base's filesystem; `tiny-mismatch` pins a torch the base does not carry, so its %test fails the build."""
    monkeypatch.setenv("SHIPYARD_DOUBLE_APPTAINER_SQUASH_OPTIONS", FAST_SQUASH)
    m = b.build(project, project.environment("tiny"))
    [call] = [c for c in read_calls(apptainer_double) if c["argv"][0] == "build"]
    assert call["bootstrap"] == "local base" and call["ran"] == ["post", "test"]
    assert "shipyard: %test passed for tiny" in (project.root / m.log).read_text()
    res = invoke_cli("build", "tiny-mismatch", cwd=project.root, timeout=None)
    assert res.returncode == 2 and "`apptainer build` exited with 255" in res.stderr, res.stderr
    log = (project.root / mf.read_manifest(project.root / "containers" / "tiny-mismatch.json").log).read_text()
    assert "torch is 2.3.1, expected 2.3.0" in log
    assert "FATAL:   While performing build: failed to execute %test script: exit status 1" in log
    assert not (project.root / "containers" / "tiny-mismatch.sif").exists()
