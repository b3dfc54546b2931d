"""Hostile input reaching generated files: a value either is refused when registry.yaml is loaded (one line naming
file:line and key) or reaches the file harmlessly. "Harmless" is judged by the file's real reader, not by us:

* .def: :mod:`helpers_apptainer`, a model of Apptainer's own parser (build-argument substitution, stage split,
  section scanner) written from Apptainer's source and checked here against Apptainer's own test inputs; no value
  may add a stage or a section (``%setup`` runs on the build host, as root for a root build).
* Dockerfile: ``dockerfile-parse`` (a maintained parser of Docker's syntax, line continuations included); no value
  may add an instruction.
* launcher: ``bash -n`` and shellcheck must accept it, and every line keeps the first word of the benign launcher's
  line (a value can change a quoted word, never add a command line).

Each property counts what it tried and what was refused cleanly (printed with ``-s``; the README quotes no count,
since a count drifts whenever the strategies or the escaping rules change).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from fixtures_launch import FAKE_ROOT, LAUNCH_REGISTRY, build_launcher
from fuzz_budget import examples
from helpers_apptainer import GO_SPACE, labels, parse
from helpers_registry import shellcheck
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shipyard import registry
from shipyard.definitions import render
from shipyard.errors import ShipyardError
from shipyard.launch import launcher

DATA = Path(__file__).resolve().parent / "data" / "apptainer"
ROOT = Path("/nonexistent/shipyard-hostile")  # never touched: loading only resolves paths under it
COUNTS: Counter = Counter()

# Fragments that broke main before (section openers, quote breakers, line separators Python or Go split at).
ATTACKS = ["\n%setup\n    touch /pwned", "%setup", "  %post", "\u2028%setup", "\x85%setup", "\r\n%setup",
           "Bootstrap: docker", "\nbootstrap: docker\nFrom: x", "'\n%setup\n'", "x'; touch /pwned; '", '"; id; "',
           "$(id)", "`id`", "\\", "a\\\nRUN id", "{{ A }}", "{{ NOPE }}", "k\n", "a b", "#x", "../x", "/etc/passwd",
           "a;b", "a\tb", "%", "x\nLABEL evil=1", "\nRUN id", "${HOME}", "'", '"', "\x00", "ü", "\ufeff"]
hostile = st.one_of(
    st.sampled_from(ATTACKS),
    st.text(max_size=24),
    st.text(alphabet=st.sampled_from(list("%\n\r\t '\"\\${}#`;&|<>()*?!~:=@,./-aZ09\u2028\x85\xa0")), max_size=24),
    st.tuples(st.sampled_from(ATTACKS), st.text(max_size=8)).map("".join),
)

BASE_ENV = {"torch": "2.3.1", "cuda": "12.1", "python": "3.11", "os": "ubuntu22.04",
            "description": "benign", "labels": {"org.example.k": "v"}, "env": {"FOO": "bar"},
            "build_args": {"A": "1"}, "files": [{"src": "data/x.txt", "dst": "/opt/x.txt"}]}
CLUSTER = {"runtime": "apptainer", "fabric": "ib", "gpus_per_node": 4, "scheduler": {"partition": "gpu"}}


def env_registry(env: dict) -> str:
    return yaml.safe_dump({"environments": {"e": env}, "clusters": {"c": CLUSTER}}, allow_unicode=False)


def mutate(field: str, value: str) -> dict:
    env = json.loads(json.dumps(BASE_ENV))
    if field == "label_key":
        env["labels"] = {value: "v"}
    elif field == "label_value":
        env["labels"] = {"org.example.k": value}
    elif field == "env_name":
        env["env"] = {value: "x"}
    elif field == "env_value":
        env["env"] = {"FOO": value}
    elif field == "env_ref":  # a build-arg value pasted into a quoted %environment value by Apptainer
        env["env"] = {"FOO": "pre-{{ A }}-post"}
        env["build_args"] = {"A": value}
    elif field == "build_arg_name":
        env["build_args"] = {value: "1"}
    elif field == "build_arg_value":
        env["build_args"] = {"A": value}
    elif field in ("src", "dst"):
        env["files"] = [{**BASE_ENV["files"][0], field: value}]
    else:
        env[field] = value
    return env


FIELDS = ["label_key", "label_value", "env_name", "env_value", "env_ref", "build_arg_name", "build_arg_value",
          "src", "dst", "description", "base"]


def load(text: str):
    return registry.load_text(text, "registry.yaml", path=ROOT / "registry.yaml")


def one_line_refusal(exc: ShipyardError) -> None:
    msg = str(exc)
    assert "\n" not in msg and msg.startswith("registry.yaml:"), msg


BENIGN = load(env_registry(BASE_ENV))
BENIGN_DEF = render.render_definition(BENIGN.environment("e"))
BENIGN_SECTIONS = [[name for name, _, _ in s] for s in parse(BENIGN_DEF, dict(BASE_ENV["build_args"]))]


def docker_instructions(text: str, tmp: Path) -> list[str]:
    parser = DockerfileParser(path=str(tmp / "Dockerfile"))
    parser.content = text
    return [i["instruction"] for i in parser.structure]


# ----------------------------------------------------------------------------------------------- the scanner itself


@pytest.mark.parametrize("name", sorted(json.loads((DATA / "expected.json").read_text())))
def test_scanner_reads_apptainers_own_samples(name):
    """The section model agrees with the hand reading of Apptainer's own parser test inputs (tests/data/apptainer)."""
    want = json.loads((DATA / "expected.json").read_text())[name]
    got = [[[n, a] for n, a, _ in s] for s in parse((DATA / name).read_text())]
    assert got == want


def test_scanner_sees_the_attacks_that_broke_main():
    """The model can fail: the injections the issue reported (an indented %setup, a Unicode line separator that
    Python's splitlines honours, a build-arg value breaking out of %environment quotes) each add a section to a
    hand-written vulnerable .def."""
    base = "Bootstrap: docker\nFrom: x\n%labels\n    k v\n%environment\n    export A='{{ X }}'\n"
    assert [n for n, _, _ in parse(base, {"X": "1"})[0]] == ["labels", "environment"]
    assert [n for n, _, _ in parse(base.replace("k v", "k v\n    %setup"), {"X": "1"})[0]][1] == "setup"
    assert len(parse(base, {"X": "'\n%setup\ntouch /pwned\n'"})[0]) == 3
    assert len(parse(base.replace("k v", "k x\nBootstrap: docker"), {"X": "1"})) == 2
    help_lines = "\n".join("    " + ln for ln in "about\u2028%setup".splitlines())
    assert len(parse(base + "%help\n" + help_lines + "\n", {"X": "1"})[0]) == 4
    assert labels(["    org.a  spaced value ", "# c"]) == {"org.a": "spaced value"}


# ----------------------------------------------------------------------------------------------- (a) + (b) properties


@settings(max_examples=examples(160), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=hostile)
def test_no_value_adds_a_section_or_an_instruction(field, value, tmp_path_factory):
    """Arbitrary text in every user-controlled field of an environment: refused in one line at load, or the .def
    keeps exactly the benign sections (after Apptainer's build-argument substitution) and the Dockerfile exactly
    the benign instruction sequence."""
    COUNTS["definition tried"] += 1
    env = mutate(field, value)
    try:
        reg = load(env_registry(env))
    except ShipyardError as exc:
        one_line_refusal(exc)
        COUNTS["definition refused"] += 1
        return
    e = reg.environment("e")
    text = render.render_definition(e)  # must not raise: whatever loads, renders
    got = [[name for name, _, _ in s] for s in parse(text, dict(e.build_args))]
    assert got == BENIGN_SECTIONS, (field, value)
    if field == "label_value":
        body = next(b for n, _, b in parse(text, dict(e.build_args))[-1] if n == "labels")
        assert labels(body)["org.example.k"] == value.strip("".join(GO_SPACE))
    tmp = tmp_path_factory.mktemp("df")
    assert docker_instructions(render.render_dockerfile(e), tmp) == \
        docker_instructions(render.render_dockerfile(BENIGN.environment("e")), tmp), (field, value)


# ----------------------------------------------------------------------------------------------- (c) launchers

CLUSTER_FIELDS = ["partition", "account", "modules", "env_value", "description", "storage", "ib_hca",
                  "instance_type", "flag_env", "command"]


def launch_case(field: str, value: str) -> tuple[str, dict]:
    data = yaml.safe_load(LAUNCH_REGISTRY)
    cl = data["clusters"]["lab-ib"]
    kw: dict = {"cluster": "lab-ib", "command": ["train.py"]}
    if field == "partition":
        cl["scheduler"]["partition"] = value
        cl["scheduler"]["partitions"] = [value]
    elif field == "account":
        cl["scheduler"]["account"] = value
    elif field == "modules":
        cl["modules"] = [value]
    elif field == "env_value":
        cl["env"] = {"NCCL_SOCKET_IFNAME": value}
    elif field in ("description", "storage", "instance_type"):
        cl[field] = value
    elif field == "ib_hca":
        cl["fabric_options"]["ib_hca"] = value
    elif field == "flag_env":
        kw["env"] = [f"FOO={value}"]
    elif field == "command":
        kw["command"] = ["train.py", value]
    return yaml.safe_dump(data, allow_unicode=False), kw


def same_skeleton(script: str, benign: str) -> bool:
    """Same number of lines, and every line keeps the benign launcher's first word (where that word is not the
    value itself, e.g. a command word on a continuation line): a value may change a quoted word, never add or remove
    a line or a command."""
    a, b = script.split("\n"), benign.split("\n")
    if len(a) != len(b):
        return False
    first = [((x.split() or [""])[0], (y.split() or [""])[0]) for x, y in zip(a, b)]
    return all(x == y for x, y in first if "benign" not in y)


def benign_launcher(field: str) -> str:
    text, kw = launch_case(field, "benign")
    return launcher.render(build_launcher(load_launch(text), **kw))


def load_launch(text: str):
    return registry.load_text(text, "registry.yaml", path=FAKE_ROOT / "registry.yaml")


@settings(max_examples=examples(40), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(CLUSTER_FIELDS), value=hostile)
def test_no_value_adds_a_command_line_to_a_launcher(field, value):
    """Arbitrary text in a cluster's scheduler values, modules, env, storage and in --env/command words: refused in
    one line, or the launcher passes ``bash -n`` and shellcheck and keeps the benign launcher's line skeleton."""
    COUNTS["launcher tried"] += 1
    text, kw = launch_case(field, value)
    try:
        script = launcher.render(build_launcher(load_launch(text), **kw))
    except ShipyardError as exc:
        assert "\n" not in str(exc)
        COUNTS["launcher refused"] += 1
        return
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0, value
    res = shellcheck(script, "bash")
    assert res.returncode == 0, res.stdout
    assert same_skeleton(script, benign_launcher(field)), (field, value)


def test_counts_report():
    """Runs last in this file: prints the counts (with ``-s``), and asserts that both properties ran."""
    print(f"\nhostile-input counts: {dict(COUNTS)}")
    assert COUNTS["definition tried"] and COUNTS["launcher tried"]


# ----------------------------------------------------------------------------------------------- fixed cases per class


@pytest.mark.parametrize("field,value,needle", [
    ("label_key", "k\n%setup", "labels"),
    ("label_value", "v\n%setup\n    touch /pwned", "labels"),
    ("env_value", "x\n%setup", "env"),
    ("description", "about\u2028%setup", "description"),
    ("build_arg_value", "'\n%setup\n'", "build_args"),
    ("env_name", "FOO\n", "env"),
    ("label_key", "evil=1\nRUN id #", "labels"),
])
def test_definition_and_dockerfile_injections_are_refused_at_load(field, value, needle):
    """Each injection the issue reported is one line naming registry.yaml:line and the key."""
    with pytest.raises(ShipyardError) as ei:
        load(env_registry(mutate(field, value)))
    one_line_refusal(ei.value)
    assert needle in str(ei.value)


@pytest.mark.parametrize("value", ["gpu\necho pwned", "gpu --wrap=id", "gpu;id", "$(id)"])
def test_scheduler_values_that_would_add_commands_are_refused(value):
    text, kw = launch_case("partition", value)
    with pytest.raises(ShipyardError) as ei:
        load_launch(text)
    assert "partition" in str(ei.value) and "\n" not in str(ei.value)


def test_files_src_must_stay_inside_the_project(tmp_path):
    """../ paths, absolute paths, symlinks leading out and names with shell syntax: one line each."""
    (tmp_path / "inside.txt").write_text("ok")
    (tmp_path / "link").symlink_to("/etc")
    cases = {"../secret": "outside", "/etc/passwd": "absolute", "link/passwd": "outside",
             "a;touch${IFS}x": "does not match", "$(id)": "does not match", "a/../../b": "outside"}
    for src, why in cases.items():
        env = json.loads(json.dumps(BASE_ENV))
        env["files"] = [{"src": src, "dst": "/opt/x"}]
        with pytest.raises(ShipyardError) as ei:
            registry.load_text(env_registry(env), "registry.yaml", path=tmp_path / "registry.yaml")
        assert why in str(ei.value) and "files[0].src" in str(ei.value) and "\n" not in str(ei.value), src
    env = json.loads(json.dumps(BASE_ENV))
    env["files"] = [{"src": "inside.txt", "dst": "/opt/x"}]
    registry.load_text(env_registry(env), "registry.yaml", path=tmp_path / "registry.yaml")


@pytest.mark.parametrize("text,needle", [
    ("a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9)
                                             + "]\n" for i in range(8)), "expand"),
    ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
    ("x:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 300)), "nested"),
    ("x: '" + "a" * (2 << 20) + "'\n", "bytes"),
])
def test_yaml_limits_are_one_line_errors(text, needle):
    """An alias bomb, deep flow and block nesting and a huge file: one line each, fast (no RecursionError, no
    segfault, no minutes at several GB)."""
    with pytest.raises(ShipyardError) as ei:
        load(text)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_shellcheck_is_present():
    """The launcher property relies on shellcheck; say so plainly instead of skipping."""
    assert shutil.which("shellcheck") and shutil.which("bash")
