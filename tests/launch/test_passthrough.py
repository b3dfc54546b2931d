"""`--sbatch KEY=VALUE`: allowed keys and their value patterns from data, owned and unknown keys refused in
one line, the #SBATCH escaping, the golden launcher, `invoke shell`'s srun words. The sandbox tests (--validate) are in
test_passthrough_sandbox.py."""

from __future__ import annotations

import pytest
from fixtures_launch import build_launcher
from helpers_registry import GOLDEN, golden

from shipyard.errors import ShipyardError
from shipyard.launch import launcher as launch, passthrough, shell as shells

CMD = ("examples/train.py", "--epochs", "3")
GOOD = ["mail-type=END,FAIL", "mail-user=a.b@example.org", "constraint=a100|h100", "gres=gpu:nvidia_a100_3g.20gb:2",
        "qos=high", "reservation=course", "begin=now+1hours", "comment=sweep-1"]


def test_golden_launcher_with_passthrough_options(launch_registry):
    l = build_launcher(launch_registry, cluster="lab-ib", nodes=2, sbatch=GOOD, command=CMD)
    text = launch.render(l)
    golden(GOLDEN / "launch" / "sbatch-passthrough.sbatch", text)
    for item in GOOD:
        assert f"#SBATCH --{item}\n" in text
    assert "--sbatch mail-type=END,FAIL" in text.splitlines()[2]  # the regenerate line repeats them


def test_a_later_key_wins_and_the_order_is_kept():
    assert passthrough.parse(["qos=a", "comment=x", "qos=b"]) == (("qos", "b"), ("comment", "x"))


@pytest.mark.parametrize(("item", "msg"), [
    ("nodes=4", "shipyard sets --nodes itself; use --nodes"),
    ("gpus=a100:2", "shipyard sets --gpus itself; use --gpus-per-node"),
    ("output=/tmp/x", "shipyard sets --output itself; it cannot be overridden"),
    ("signal=USR1@60", "use --signal-before"),
    ("array=0-3", "use --sweep"),
    ("--partition=x", "use --partition"),
    ("frobnicate=1", "not an option shipyard passes through .allowed: begin,"),
    ("mail-type", "expected KEY=VALUE"),
    ("mail-type=SOMETIMES", "not a valid --mail-type value"),
    ("mail-user=nobody", "not a valid --mail-user value"),
    ("comment=two words", "not a valid --comment value"),
    ("qos=a\n#SBATCH --nodes=99", "not a valid --qos value"),
    ("constraint=a100&$(id)", "not a valid --constraint value"),
    ("gres=gpu:a100:x", "not a valid --gres value"),
])
def test_refused_in_one_line(item, msg):
    with pytest.raises(ShipyardError, match=msg) as exc:
        passthrough.parse([item])
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2


def test_every_allowed_pattern_only_admits_sbatch_words():
    """A pattern in the data file that let a space, quote or '#' through would still be stopped by the escaping."""
    with pytest.raises(ShipyardError, match="not usable in an #SBATCH line"):
        passthrough.line_value("comment", "a b")
    assert passthrough.line_value("constraint", "a&b|c") == "a&b|c"
    assert not set(passthrough.allowed()) & set(passthrough.owned())


def test_shell_passes_them_to_srun(launch_registry):
    reg = launch_registry
    plan = shells.build(reg, reg.environment(None), reg.cluster("lab-ib"), sbatch=["qos=high", "gres=gpu:1g.10gb:1"],
                        command="nvidia-smi -L", user="u")
    assert "--qos=high" in plan.argv and "--gres=gpu:1g.10gb:1" in plan.argv
    assert plan.argv.index("--qos=high") < plan.argv.index("--pty" if "--pty" in plan.argv else "nvidia-smi -L")
    with pytest.raises(ShipyardError, match="use --partition"):
        shells.build(reg, reg.environment(None), reg.cluster("lab-ib"), sbatch=["partition=x"], user="u")


@pytest.mark.parametrize(("flags", "stderr"), [
    (("--sbatch", "nodes=4"), "shipyard: error: --sbatch nodes=...: shipyard sets --nodes itself; use --nodes"),
    (("--sbatch", "mail-user=not an address"),
     "shipyard: error: --sbatch mail-user='not an address': not a valid --mail-user value (must match "),
])
def test_cli_refuses_in_one_line_with_exit_2(launch_project, invoke, flags, stderr):
    from pathlib import Path

    (launch_project / "t.py").write_text("")
    res = invoke("launch", *flags, "--validate", "--", "t.py", cwd=Path.cwd())
    assert res.returncode == 2 and res.stderr.startswith(stderr) and res.stderr.count("\n") == 1, res.stderr
