"""What the real Apptainer 1.4.5's `apptainer build` does with a definition's sections, which shipyard's rendered
definitions rely on (read in its internal/pkg/build; checked here on the tiny base that base_registry serves, see
fixtures_oci.py): %files before %post; %post writable, under `/bin/sh -ex`, without the host's environment, with the
build's --bind (a destination the base lacks is an error); %environment and %labels written after %post (which adds
labels through $APPTAINER_LABELS); %test in the finished root filesystem with the image's environment, unless
--notest; a failing %post or %test: Apptainer's FATAL line, exit 255 and no TARGET. shipyard's own builds of rendered
definitions are tests/containers/test_build_apptainer.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real_apptainer, pytest.mark.slow]

NET = "shipyard-build.env.sh"

DEF = """Bootstrap: docker
From: {base}

%files
    data/greeting.txt /opt/in/

%environment
    export FROM_ENVIRONMENT=env-value

%labels
    org.example.kind real-test

%post
    . /mnt/shipyard-build.env.sh
    echo "post: https_proxy=$https_proxy FROM_ENVIRONMENT=${{FROM_ENVIRONMENT:-unset}}" \\
        "HOST_ONLY=${{HOST_ONLY:-unset}}" > /opt/post.txt
    cat /opt/in/greeting.txt >> /opt/post.txt
    echo "org.example.from-post yes" >> "$APPTAINER_LABELS"

%test
    test "$FROM_ENVIRONMENT" = env-value && grep -q "^hello from the host" /opt/post.txt
    echo "test: HOST_ONLY=${{HOST_ONLY:-unset}}"
"""


@pytest.fixture
def ctx(tmp_path, base_registry, apptainer_on_path, apptainer_cache, monkeypatch):
    """A build directory with a %files source and a build-network directory; a host variable %post must not see."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "greeting.txt").write_text("hello from the host\n")
    net = tmp_path / "net"
    net.mkdir()
    (net / NET).write_text("export https_proxy=http://proxy.example:3128\n")
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path))
    monkeypatch.setenv("APPTAINER_CACHEDIR", str(apptainer_cache))
    monkeypatch.setenv("HOST_ONLY", "from-host")
    return tmp_path


@pytest.fixture
def base(base_registry) -> str:
    return f"{base_registry.address}/shipyard-test/base:1"


def build(ctx: Path, deftext: str, *opts: str, bind: str | None = "/mnt") -> subprocess.CompletedProcess:
    (ctx / "image.def").write_text(deftext)
    argv = ["apptainer", "build", "--no-https", *opts, *(["--bind", f"{ctx / 'net'}:{bind}"] if bind else []),
            "image.sif", "image.def"]
    return subprocess.run(argv, cwd=ctx, capture_output=True, text=True, timeout=600)


def test_files_post_environment_labels_and_test(ctx, base):
    res = build(ctx, DEF.format(base=base))
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "INFO:    Running post scriptlet" in out and "INFO:    Running testscript" in out
    assert "+ cat /opt/in/greeting.txt" in out  # %post runs under /bin/sh -ex
    # %test sees the image's environment; the host's variables reach it as they reach `apptainer test`
    assert "test: HOST_ONLY=from-host" in out
    run = subprocess.run(["apptainer", "exec", str(ctx / "image.sif"), "/bin/sh", "-c",
                          'cat /opt/post.txt; echo "env: $FROM_ENVIRONMENT"; ls -A /mnt'],
                         capture_output=True, text=True, cwd=ctx, timeout=120)
    assert run.returncode == 0, run.stderr
    # %post: the build-network file's variable, no %environment yet (written after %post), no host variable
    assert run.stdout.splitlines() == [
        "post: https_proxy=http://proxy.example:3128 FROM_ENVIRONMENT=unset HOST_ONLY=unset",
        "hello from the host", "env: env-value"]  # and /mnt is empty: the bind is not packed into the image
    inspect = subprocess.run(["apptainer", "inspect", "--json", "--labels", str(ctx / "image.sif")],
                             capture_output=True, text=True, timeout=60)
    labels = json.loads(inspect.stdout)["data"]["attributes"]["labels"]
    assert labels["org.example.kind"] == "real-test" and labels["org.example.from-post"] == "yes"
    assert labels["org.label-schema.usage.singularity.deffile.from"] == base


def test_failing_post_or_missing_bind_destination_fails_with_no_target(ctx, base):
    res = build(ctx, f"Bootstrap: docker\nFrom: {base}\n\n%post\n    echo before\n    false\n    echo after\n",
                bind=None)
    assert res.returncode == 255 and not (ctx / "image.sif").exists()
    assert res.stderr.splitlines()[-1] == \
        "FATAL:   While performing build: while running engine: while running %post section: exit status 1"
    assert "before" in res.stdout and "after" not in res.stdout
    # --bind DIR:DEST where the base has no DEST: a writable build has no underlay to make it
    res = build(ctx, f"Bootstrap: docker\nFrom: {base}\n\n%post\n    true\n", bind="/shipyard-none")
    assert res.returncode == 255 and not (ctx / "image.sif").exists()
    assert "destination /shipyard-none doesn't exist in container" in res.stderr


def test_failing_test_fails_the_build_and_notest_skips_it(ctx, base):
    deftext = f"Bootstrap: docker\nFrom: {base}\n\n%post\n    touch /opt-made\n\n%test\n    exit 3\n"
    res = build(ctx, deftext, bind=None)
    assert res.returncode == 255 and not (ctx / "image.sif").exists()
    assert res.stderr.splitlines()[-1] == "FATAL:   While performing build: failed to execute %test script: exit status 3"
    res = build(ctx, deftext, "--notest", bind=None)
    assert res.returncode == 0, res.stderr
    assert (ctx / "image.sif").is_file() and "Running testscript" not in res.stdout + res.stderr
