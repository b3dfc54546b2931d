"""Each compatibility rule has a case that fails and a case that passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_registry import DATA, unrecorded_installer_warnings

from shipyard import registry
from shipyard.errors import ShipyardError
from shipyard.registry import compat, pcluster, report

BASE = (DATA / "minimal.yaml").read_text()
REPO = Path(__file__).resolve().parents[2]


def problems(env_extra: str = "", cluster: str = "", env_over: dict | None = None):
    """Check a one-environment registry; env_over replaces fields, cluster adds a cluster `x` it is used on."""
    fields = {"torch": '"2.3.1"', "cuda": '"12.1"', "python": '"3.11"', "os": "ubuntu22.04"}
    fields.update(env_over or {})
    env = "\n".join(f"    {k}: {v}" for k, v in fields.items())
    text = f"environments:\n  e:\n{env}\n{env_extra}clusters:\n" + (cluster or """  c:
    runtime: host
    fabric: socket
    gpus_per_node: 0
    scheduler: {partition: p}
""")
    return compat.check_all(registry.load_text(text, "t.yaml"))


def cluster(gpus: str = "[{model: H100, arch: sm_90}]", driver: str = "580.95.05", fabric: str = "ib",
            extra: str = "") -> str:
    return f"""  x:
    runtime: apptainer
    fabric: {fabric}
    gpus_per_node: 4
    gpus: {gpus}
    driver: "{driver}"
    scheduler: {{partition: p}}
{extra}"""


def errors(ps):
    return [p for p in ps if p.severity == compat.ERROR]


def test_valid_combination_passes():
    assert problems() == []


def test_cuda_variant_that_does_not_exist_names_the_real_ones():
    (p,) = errors(problems(env_over={"cuda": '"12.4"'}))
    assert p.key == "environments.e.cuda"
    assert "torch 2.3.1 has no CUDA 12.4 wheel" in p.message and "cu118, cu121" in p.message


def test_python_without_wheel_fails_and_supported_passes():
    assert "no wheel for Python 3.13" in errors(problems(env_over={"python": '"3.13"'}))[0].message
    assert problems(env_over={"python": '"3.12"'}) == []


def test_companion_mismatch_fails():
    ps = errors(problems(env_over={"torchvision": '"0.17.0"'}))
    assert "companion release is 0.18.1" in ps[0].message
    assert problems(env_over={"torchvision": '"0.18.1"'}) == []


def test_unpublished_torchaudio_fails():
    over = {"torch": '"2.14.1"', "cuda": '"13.0"', "os": "ubuntu24.04"}
    assert problems(env_over=over) == []
    ps = errors(problems(env_over={**over, "torchaudio": '"2.14.1"'}))
    assert "torchaudio was not published for torch 2.14.1" in ps[0].message


def test_nccl_override_warns_and_static_nccl_fails():
    ps = problems(env_over={"nccl": '"2.21.5"'})
    assert [p.severity for p in ps] == ["WARN"] and "pip check will report" in ps[0].message
    ps = errors(problems(env_over={"torch": '"1.13.1"', "cuda": '"11.7"', "python": '"3.10"', "nccl": '"2.15.5"'}))
    assert any("statically" in p.message for p in ps)


def test_unknown_variant_list_warns_not_guesses(monkeypatch):
    import copy

    data = copy.deepcopy(compat.facts())
    data["torch"]["2.15"]["cuda_variants"] = None  # a series whose variants no source lists
    monkeypatch.setattr(compat, "facts", lambda: data)
    ps = problems(env_over={"torch": '"2.15.0"', "cuda": '"13.0"', "python": '"3.12"', "os": "ubuntu24.04"})
    # the variant itself and the NCCL its wheel pins: both unknown, neither guessed from the cu130 wheel
    assert [(p.severity, p.key.rsplit(".", 1)[1]) for p in ps] == [("WARN", "cuda"), ("WARN", "nccl")]
    assert all("not verified" in p.message for p in ps)


@pytest.mark.parametrize("tag,ok,why", [
    ("nvidia/cuda:12.1.1-cudnn8-runtime-ubuntu22.04", True, ""),
    ("nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04", True, ""),
    ("nvidia/cuda:12.3.2-cudnn9-runtime-ubuntu22.04", True, ""),
    ("nvidia/cuda:12.4.1-cudnn8-runtime-ubuntu22.04", False, "cudnn-runtime, cudnn-devel; there is no cudnn8-runtime"),
    ("nvidia/cuda:12.1.1-cudnn-runtime-ubuntu22.04", False, "cudnn8-runtime, cudnn8-devel; there is no cudnn-runtime"),
    ("nvidia/cuda:12.1.1-runtime-ubuntu24.04", False, "published for ubuntu20.04, ubuntu22.04, not ubuntu24.04"),
    ("nvidia/cuda:12.1.0-runtime-ubuntu22.04", False, "knows nvidia/cuda 12.1.1"),
    ("nvidia/cuda:12.1.1-cudnn8-base-ubuntu22.04", False, "there is no cudnn8-base tag"),
    ("nvidia/cuda:12.1-runtime", False, "does not fit the nvidia/cuda scheme"),
])
def test_base_image_tag_scheme(tag, ok, why):
    msgs = compat.check_cuda_image(tag)
    assert (msgs == []) is ok, msgs
    if not ok:
        assert why in msgs[0]


def test_derived_base_for_os_without_image_fails():
    ps = errors(problems(env_over={"os": "ubuntu24.04"}))  # CUDA 12.1 images exist for 20.04/22.04 only
    assert ps and "not ubuntu24.04" in ps[0].message and ps[0].key == "environments.e.os"


def test_explicit_base_checked_and_non_cuda_base_warns():
    ps = errors(problems(env_over={"base": "nvidia/cuda:12.4.0-cudnn8-runtime-ubuntu22.04"}))
    assert ps and ps[0].key == "environments.e.base"
    ps = problems(env_over={"base": "nvcr.io/nvidia/pytorch:24.05-py3"})
    assert [p.severity for p in ps] == ["WARN"]


def test_driver_too_old_for_cuda12_fails_and_new_enough_passes():
    ps = errors(problems(cluster=cluster(driver="520.61.05"), env_over={}, env_extra=""))
    assert any("too old for CUDA 12.1 (CUDA 12.x needs >= 525.60.13)" in p.message for p in ps)
    assert errors(problems(cluster=cluster(driver="535.104.05"))) == []


def test_cuda13_needs_the_580_branch():
    over = {"torch": '"2.14.1"', "cuda": '"13.0"', "os": "ubuntu24.04"}
    ps = errors(problems(env_over=over, cluster=cluster(driver="575.57.08")))
    assert any("13.x needs >= 580" in p.message for p in ps)
    assert errors(problems(env_over=over, cluster=cluster(driver="580.95.05"))) == []


def test_minor_version_compat_driver_warns():
    ps = problems(cluster=cluster(driver="525.60.13"))
    assert [p.severity for p in ps] == ["WARN"] and "minor-version" in ps[0].message


def test_torch_211_on_v100_fails_and_210_passes():
    v100 = "[{model: V100, arch: sm_70}]"
    over = {"torch": '"2.11.0"', "cuda": '"13.0"', "os": "ubuntu24.04"}
    ps = errors(problems(env_over=over, cluster=cluster(gpus=v100)))
    assert any("V100 (sm_70) cannot run e" in p.message for p in ps)
    over = {"torch": '"2.10.0"', "cuda": '"12.8"', "os": "ubuntu24.04", "python": '"3.12"'}
    assert errors(problems(env_over=over, cluster=cluster(gpus=v100))) == []


def test_torch_20_on_h100_fails_and_23_passes():
    over = {"torch": '"2.0.1"', "cuda": '"11.7"', "python": '"3.10"'}
    ps = errors(problems(env_over=over, cluster=cluster()))
    assert any("H100 (sm_90) cannot run e" in p.message for p in ps)
    assert errors(problems(cluster=cluster())) == []


def efa_cluster(opts: str = 'efa_installer: "1.43.0"', itype: str = "") -> str:
    extra = f"    fabric_options: {{{opts}}}\n" + (f"    instance_type: {itype}\n" if itype else "")
    return cluster(fabric="efa", extra=extra)


def test_efa_nccl_floor_follows_the_plugin_not_a_cuda_floor():
    """aws-ofi-nccl >= 1.10 supports NCCL >= 2.17.1; 1.5-1.9 NCCL >= 2.4.8; no general CUDA floor exists."""
    # NCCL written out: the data knows no NCCL for the non-default cu118 wheels (facts are per wheel variant)
    old = {"torch": '"2.0.1"', "cuda": '"11.8"', "python": '"3.10"', "nccl": '"2.14.3"'}  # CUDA 11.8
    msgs = [p.message for p in errors(problems(env_over=old, cluster=efa_cluster()))]
    assert any("aws-ofi-nccl 1.16.1 supports NCCL >= 2.17.1; e has NCCL 2.14.3" in m for m in msgs)
    assert errors(problems(env_over=old, cluster=efa_cluster('efa_installer: "1.43.0", aws_ofi_nccl: "1.9.1"'))) == []
    cu118 = {"torch": '"2.1.2"', "cuda": '"11.8"', "python": '"3.10"', "nccl": '"2.18.1"'}  # on CUDA 11.8: fine on EFA
    assert errors(problems(env_over=cu118, cluster=efa_cluster())) == []


def test_broadcast_hang_is_keyed_on_the_plugin_version():
    direct = errors(problems(cluster=efa_cluster('efa_installer: "1.43.0", aws_ofi_nccl: "1.18.0"')))
    assert any("aws-ofi-nccl 1.18.0 hangs on NCCL broadcast; fixed in 1.20.0" in p.message for p in direct)
    bundled = errors(problems(cluster=efa_cluster('efa_installer: "1.47.0"')))
    assert any("(bundled in EFA installer 1.47.0) hangs on NCCL broadcast" in p.message for p in bundled)
    assert errors(problems(cluster=efa_cluster('efa_installer: "1.49.0"'))) == []  # aws-ofi-nccl 1.20.0


def test_p5_floors_apply_only_to_p5():
    over = {"torch": '"2.0.1"', "cuda": '"11.8"', "python": '"3.10"', "nccl": '"2.14.3"'}  # written: cu118 is unknown
    opts = 'efa_installer: "1.43.0", aws_ofi_nccl: "1.9.1"'
    p5 = [p.message for p in errors(problems(env_over=over, cluster=efa_cluster(opts, "p5.48xlarge")))]
    assert any("p5.48xlarge [P: aws-ofi-nccl doc/efa-env-var.md (p5.48xlarge)] needs NCCL >= 2.18.0" in m for m in p5)
    assert errors(problems(env_over=over, cluster=efa_cluster(opts, "p4d.24xlarge"))) == []
    # p5 with NCCL >= 2.19 needs installer >= 1.29.0 (NCCL 2.20.5 here)
    old_inst = errors(problems(cluster=efa_cluster('efa_installer: "1.28.0", aws_ofi_nccl: "1.7.3"', "p5.48xlarge")))
    assert any("needs EFA installer >= 1.29.0; the cluster has 1.28.0" in p.message for p in old_inst)
    assert errors(problems(cluster=efa_cluster(itype="p5.48xlarge"))) == []


def test_fast_fabric_without_userspace_or_injection_is_an_error():
    none = errors(problems(cluster=cluster(), env_extra="    fabrics: []\n"))
    assert any("has no rdma-core's libibverbs" in p.message and "fall back to TCP sockets" in p.message for p in none)
    injected = cluster(extra="    fabric_options: {host_injection: {binds: [/usr/lib/x86_64-linux-gnu/libibverbs]}}\n")
    assert errors(problems(cluster=injected, env_extra="    fabrics: []\n")) == []
    assert errors(problems(cluster=cluster())) == []  # derived: the image carries rdma-core
    # EFA without an installer version: nothing to install, and the preset's tuner path would not exist
    msgs = [p.message for p in errors(problems(cluster=cluster(fabric="efa")))]
    assert any("no libfabric and aws-ofi-nccl" in m and "efa_installer" in m for m in msgs)
    assert any("exports NCCL_TUNER_PLUGIN, a file the e image does not have" in m for m in msgs)


def test_environment_limited_to_its_clusters():
    v100 = cluster(gpus="[{model: V100, arch: sm_70}]")
    over = {"torch": '"2.11.0"', "cuda": '"13.0"', "os": "ubuntu24.04"}
    assert errors(problems(env_over=over, cluster=v100))
    assert errors(problems(env_over=over, cluster=v100, env_extra="    clusters: [c]\n".replace("[c]", "[]"))) == []


def test_shipped_registry_is_clean():
    from helpers_registry import ROOT

    assert errors(compat.check_all(registry.load(ROOT / "registry.yaml"))) == []


# ---------------------------------------------------------------------------------------------------------------
# Facts keyed by what they depend on (the 2026-11-30 audit against wheel metadata): each rule passes and fails.


def env_of(**over):
    fields = {"torch": '"2.3.1"', "cuda": '"12.1"', "python": '"3.11"', "os": "ubuntu22.04", **over}
    body = "\n".join(f"    {k}: {v}" for k, v in fields.items())
    text = f"environments:\n  e:\n{body}\nclusters:\n  c: {{runtime: host, fabric: socket, gpus_per_node: 0, " \
           "scheduler: {partition: p}}\n"
    return registry.load_text(text, "t.yaml").environments["e"]


def test_nccl_is_the_variants_own_pin_default_and_test_assertion():
    """torch 2.10.0 + CUDA 13.0 pins nvidia-nccl-cu13 2.28.9, not the cu128 wheel's 2.27.5."""
    from shipyard.definitions import recipe

    over = {"torch": '"2.10.0"', "cuda": '"13.0"', "python": '"3.12"', "os": "ubuntu24.04"}
    env = env_of(**over)
    assert (env.nccl.value, env.nccl_package, env.nccl_override) == ("2.28.9", "nvidia-nccl-cu13", False)
    assert any("expected 2.28.9" in c for c in recipe.build_recipe(env).test)
    assert env_of(**{**over, "cuda": '"12.8"'}).nccl.value == "2.27.5"


def test_writing_the_variants_nccl_is_not_an_override_but_another_one_is():
    over = {"torch": '"2.10.0"', "cuda": '"13.0"', "python": '"3.12"', "os": "ubuntu24.04"}
    assert [p for p in problems(env_over={**over, "nccl": '"2.28.9"'}) if p.key.endswith(".nccl")] == []
    ps = [p for p in problems(env_over={**over, "nccl": '"2.27.5"'}) if p.key.endswith(".nccl")]
    assert [p.severity for p in ps] == ["WARN"] and "overrides the 2.28.9 that the cu130 wheel" in ps[0].message


def test_variant_without_recorded_nccl_warns_not_verified_and_asserts_nothing():
    """torch 2.3.1 cu118 pins an nvidia-nccl-cu11 the data does not know: no default from the cu121 wheel."""
    env = env_of(cuda='"11.8"')
    assert env.nccl.value is None and env.nccl_default is None
    ps = [p for p in problems(env_over={"cuda": '"11.8"'}) if p.key.endswith(".nccl")]
    assert [p.severity for p in ps] == ["WARN"] and "not verified" in ps[0].message


def test_cudnn_is_per_variant_too():
    assert env_of(torch='"2.10.0"', cuda='"12.8"', python='"3.12"').cudnn.value == "9.10.2.21"
    assert env_of(torch='"2.10.0"', cuda='"13.0"', python='"3.12"').cudnn.value is None  # not verified


@pytest.mark.parametrize("code,sm,runs", [
    ([86], 89, True), ([100], 103, True), ([120], 121, True), ([50], 52, True),
    ([90], 89, False), ([86], 90, False), ([120], 100, False), ([89], 86, False),
])
def test_arch_family_rule(code, sm, runs):
    """Same major, code minor <= device minor."""
    assert (compat.arch_family_match(code, sm) is not None) is runs


@pytest.mark.parametrize("torch,cuda,gpu,ok", [
    ("2.3.1", "12.1", "{model: L4, arch: sm_89}", True),         # sm_86 SASS
    ("2.10.0", "12.8", "{model: B300, arch: sm_103}", True),     # sm_100 SASS
    ("2.10.0", "12.8", "{model: GB10, arch: sm_121}", True),     # sm_120 SASS
    ("2.0.1", "11.7", "{model: M60, arch: sm_52}", True),        # sm_50 SASS
    ("2.3.1", "12.1", "{model: RTX 5090, arch: sm_120}", False),  # no 12.x code
    ("2.11.0", "13.0", "{model: M60, arch: sm_52}", False),       # CUDA 13 dropped Maxwell
])
def test_gpu_judged_by_arch_family(torch, cuda, gpu, ok):
    over = {"torch": f'"{torch}"', "cuda": f'"{cuda}"', "python": '"3.10"',
            "os": "ubuntu24.04" if cuda.startswith("13") else "ubuntu22.04"}
    errs = [p for p in errors(problems(env_over=over, cluster=cluster(gpus=f"[{gpu}]"))) if p.key.endswith(".gpus")]
    assert (errs == []) is ok, errs


def test_tesla_m60_is_sm52_in_the_data():
    assert "M60" in compat.facts()["arches"][52]["gpus"] and "M60" not in compat.facts()["arches"][50]["gpus"]


@pytest.mark.parametrize("torch,cuda,py,bad", [
    ("2.5.1", "12.4", "3.13", "torchvision 0.20.1 has no wheel for Python 3.13"),
    ("1.13.1", "11.7", "3.11", "torchvision 0.14.1 has no wheel for Python 3.11"),
])
def test_companions_carry_their_own_pythons(torch, cuda, py, bad):
    """torch has the wheel; its default companions do not: refused before `invoke lock`."""
    over = {"torch": f'"{torch}"', "cuda": f'"{cuda}"', "python": f'"{py}"'}
    assert any(bad in p.message for p in errors(problems(env_over=over)))
    left_out = {**over, "torchvision": "false", "torchaudio": "false"}
    assert [p for p in errors(problems(env_over=left_out)) if "torchrun" not in p.message] == []
    assert errors(problems(env_over={**over, "python": '"3.10"'})) == []


def test_a_torchrun_that_stops_at_start_is_refused():
    """torch 1.13.1 has a cp311 wheel, and its torchrun stops at start on 3.11 (seen in the real image): ERROR,
    naming the Pythons that work; 3.10 and torch 2.0.1 on 3.11 pass."""
    over = {"torch": '"1.13.1"', "cuda": '"11.7"', "python": '"3.11"', "torchvision": "false", "torchaudio": "false"}
    (p,) = errors(problems(env_over=over))
    assert p.key.endswith(".python") and "its torchrun stops at start there" in p.message
    assert "use torch >= 2.0 or Python 3.7, 3.8, 3.9, 3.10" in p.message
    assert errors(problems(env_over={**over, "python": '"3.10"'})) == []
    assert errors(problems(env_over={**over, "torch": '"2.0.1"'})) == []


def test_unknown_companion_pythons_warn_not_verified(monkeypatch):
    import copy

    data = copy.deepcopy(compat.facts())
    del data["companions"]["torchvision"]["0.18.1"]
    monkeypatch.setattr(compat, "facts", lambda: data)
    ps = [p for p in problems() if p.key.endswith(".torchvision")]
    assert [p.severity for p in ps] == ["WARN"] and "not verified" in ps[0].message


def test_torch_215_gets_cuda_132_image_and_its_companions():
    over = {"torch": '"2.15.0"', "cuda": '"13.2"', "python": '"3.12"', "os": "ubuntu24.04"}
    env = env_of(**over)
    assert env.base.value == "nvidia/cuda:13.2.2-runtime-ubuntu24.04"  # 13.2 Update 2, as in the wheel
    assert (env.torchvision.value, env.torchaudio.value) == ("0.29.2", "2.11.1")
    assert errors(problems(env_over=over)) == []
    assert errors(problems(env_over={**over, "python": '"3.10"'}))  # 2.15 starts at 3.11


@pytest.mark.parametrize("tag,ok,why", [
    ("nvidia/cuda:12.8.2-runtime-ubuntu24.04", True, ""),
    ("nvidia/cuda:12.9.2-cudnn-devel-ubuntu24.04", True, ""),
    ("nvidia/cuda:13.0.3-runtime-ubuntu22.04", True, ""),
    ("nvidia/cuda:13.2.1-cudnn-runtime-ubuntu24.04", True, ""),
    ("nvidia/cuda:12.5.1-runtime-ubuntu24.04", True, ""),
    ("nvidia/cuda:12.5.1-cudnn-runtime-ubuntu24.04", False, "published as base, runtime, devel; there is no cudnn-"),
    ("nvidia/cuda:11.6.2-cudnn8-devel-ubuntu20.04", True, ""),
    ("nvidia/cuda:11.6.2-runtime-ubuntu22.04", False, "published for ubuntu20.04, not ubuntu22.04"),
    ("nvidia/cuda:12.8.0-runtime-ubuntu24.04", False, "knows nvidia/cuda 12.8.2"),
])
def test_current_nvidia_cuda_images(tag, ok, why):
    msgs = compat.check_cuda_image(tag)
    assert (msgs == []) is ok, msgs
    if not ok:
        assert why in msgs[0]


def test_end_of_life_tag_warns_and_names_the_current_one():
    over = {"torch": '"2.10.0"', "cuda": '"12.8"', "python": '"3.12"', "os": "ubuntu24.04"}
    ps = problems(env_over={**over, "base": "nvidia/cuda:12.8.1-runtime-ubuntu24.04"})
    assert [p.severity for p in ps] == ["WARN"]
    assert "end-of-life" in ps[0].message and "use nvidia/cuda:12.8.2-runtime-ubuntu24.04" in ps[0].message
    assert problems(env_over=over) == []  # the derived tag is the current point release
    assert env_of(**over).base.value == "nvidia/cuda:12.8.2-runtime-ubuntu24.04"


# ------------------------------------------------------------------------ facts: newer releases, GPUs and instances

def test_cuda_128_has_no_cudnn_flavour_and_check_refuses_the_derived_tag():
    over = {"torch": '"2.10.0"', "cuda": '"12.8"', "python": '"3.12"', "os": "ubuntu24.04",
            "cuda_image": "{cudnn: true}"}
    (p,) = errors(problems(env_over=over))
    assert p.key == "environments.e.cuda_image"
    assert "12.8.2-cudnn-runtime-ubuntu24.04" in p.message and "there is no cudnn-runtime tag" in p.message
    for os_name in ("ubuntu20.04", "ubuntu22.04", "ubuntu24.04"):
        for flavour in ("cudnn-runtime", "cudnn-devel"):
            assert compat.check_cuda_image(f"nvidia/cuda:12.8.2-{flavour}-{os_name}"), (os_name, flavour)
        assert compat.check_cuda_image(f"nvidia/cuda:12.8.2-devel-{os_name}") == []


def test_image_table_decides_every_version_os_and_flavour():
    """The (version, OS, flavour) table is the only judge: what it lists passes, anything else is an ERROR."""
    f = compat.facts()
    spelled = {fl for fs in f["cuda_image_flavours"].values() for fl in fs["exist"] + fs.get("unverified", [])}
    for ver, row in f["cuda_images"].items():
        for os_name in ("ubuntu18.04", "ubuntu20.04", "ubuntu22.04", "ubuntu24.04"):
            fs = f["cuda_image_flavours"][row[os_name]] if os_name in row else {"exist": []}
            for flavour in sorted(spelled):
                tag = f"nvidia/cuda:{ver}-{flavour}-{os_name}"
                assert (compat.check_cuda_image(tag) == []) is (flavour in fs["exist"] + fs.get("unverified", [])), tag
    # every image and end-of-life release the cuda: section names has its row in the table
    for minor, cf in f["cuda"].items():
        for ver in [cf["image"]] * bool(cf.get("image")) + cf.get("eol", []):
            assert ver in f["cuda_images"], (minor, ver)


def test_unverified_cudnn_flavour_warns_not_guesses():
    assert compat.check_cuda_image("nvidia/cuda:13.2.2-cudnn-runtime-ubuntu24.04") == []
    (w,) = compat.cuda_image_unverified("nvidia/cuda:13.2.2-cudnn-runtime-ubuntu24.04")
    assert "not verified" in w


def test_p5_preset_needs_cuda_12_on_the_shipped_p5_cluster():
    text = (REPO / "registry.yaml").read_text().replace("environments:\n", (
        'environments:\n  old:\n    torch: "2.7.1"\n    cuda: "11.8"\n    python: "3.12"\n    os: ubuntu22.04\n'
        "    clusters: [aws-pcluster]\n"), 1)
    ps = [p for p in errors(compat.check_all(registry.load_text(text, "registry.yaml"))) if p.environment == "old"]
    assert any(p.key == "clusters.aws-pcluster.instance_type" and "needs CUDA >= 12.0; old has CUDA 11.8"
               in p.message for p in ps), ps
    over = {"torch": '"2.7.1"', "cuda": '"12.6"', "python": '"3.12"', "os": "ubuntu24.04"}
    assert errors(problems(env_over=over, cluster=efa_cluster('efa_installer: "1.51.0"', "p5.48xlarge"))) == []
    cu118 = {**over, "cuda": '"11.8"', "os": "ubuntu22.04"}
    assert errors(problems(env_over=cu118, cluster=efa_cluster('efa_installer: "1.51.0"', "p4d.24xlarge"))) == []


@pytest.mark.parametrize("torch,cuda,ok", [
    ("2.12.1", "12.8", False), ("2.13.0", "12.8", False), ("2.14.1", "12.9", False),
    ("2.12.1", "13.2", True), ("2.13.0", "12.6", True), ("2.14.1", "13.4", True), ("2.15.0", "12.6", False),
])
def test_torch_212_to_214_variants_exist_or_are_refused(torch, cuda, ok):
    ps = problems(env_over={"torch": f'"{torch}"', "cuda": f'"{cuda}"', "python": '"3.12"', "os": "ubuntu24.04"})
    bad = [p for p in errors(ps) if p.key == "environments.e.cuda" and "has no CUDA" in p.message]
    assert (bad == []) is ok, ps
    if not ok:
        have = "cu130, cu132" if torch == "2.15.0" else "cu126, cu130, cu132"
        assert f"variants that exist: {have}" in bad[0].message


def test_cuda_132_update_2_image_and_driver_floor_in_show():
    over = {"torch": '"2.15.0"', "cuda": '"13.2"', "python": '"3.12"', "os": "ubuntu24.04"}
    out = report.show(env_of(**over))
    assert "nvidia/cuda:13.2.2-runtime-ubuntu24.04" in out
    ps = problems(env_over=over, cluster=cluster(gpus="[{model: B200, arch: sm_100}]", driver="595.58.03"))
    assert [p.severity for p in ps] == ["WARN"] and "full compatibility needs >= 595.71.05" in ps[0].message
    assert problems(env_over=over, cluster=cluster(gpus="[{model: B200, arch: sm_100}]", driver="595.71.05")) == []
    (w,) = problems(env_over={**over, "base": "nvidia/cuda:13.2.1-runtime-ubuntu24.04"})
    assert "end-of-life" in w.message and "use nvidia/cuda:13.2.2-runtime-ubuntu24.04" in w.message


@pytest.mark.parametrize("torch,cuda,nccl", [
    ("2.11.0", "12.6", "2.28.9"), ("2.11.0", "12.8", "2.28.9"),
    ("2.12.1", "13.2", "2.29.7"), ("2.13.0", "13.2", "2.29.7"), ("2.14.1", "13.2", "2.30.7"),
])
def test_variant_nccl_pins_of_recent_releases_in_show(torch, cuda, nccl):
    over = {"torch": f'"{torch}"', "cuda": f'"{cuda}"', "python": '"3.12"', "os": "ubuntu24.04"}
    env = env_of(**over)
    assert env.nccl.value == nccl and "pinned by the cu" in env.nccl.source
    assert nccl in report.show(env)
    assert not [p for p in problems(env_over=over) if p.key.endswith(".nccl")]


def test_cuda_11_images_are_end_of_life():
    over = {"torch": '"2.1.2"', "cuda": '"11.8"', "python": '"3.10"', "nccl": '"2.18.1"'}  # cu118's NCCL: unknown
    ps = [p for p in problems(env_over=over) if not p.key.endswith(".nccl")]
    assert [p.severity for p in ps] == ["WARN"] and ps[0].key == "environments.e.cuda"
    assert "end-of-life" in ps[0].message and "CUDA 12 and 13 only" in ps[0].message
    assert problems() == []  # CUDA 12.1 is still a supported major


def test_smaller_facts_of_the_audit():
    f = compat.facts()
    assert (f["arches"][89]["cuda_min"], f["arches"][103]["cuda_min"], f["arches"][121]["cuda_min"]) == \
        ("11.8", "12.9", "12.9")
    assert f["cuda"]["11.7"]["driver_full"] == "515.48.07"
    assert {"13.1", "13.4"} <= set(f["cuda"])
    for s in ("2.10", "2.11", "2.12", "2.13", "2.14", "2.15"):
        assert not {89, 103, 121} & set(f["torch"][s]["arches"]), s
    # the family rule still runs those GPUs on the 86/100/120 code
    over = {"torch": '"2.14.1"', "cuda": '"13.0"', "python": '"3.12"', "os": "ubuntu24.04"}
    gpus = "[{model: L4, arch: sm_89}, {model: B300, arch: sm_103}, {model: GB10, arch: sm_121}]"
    assert problems(env_over=over, cluster=cluster(gpus=gpus)) == []


def test_current_efa_installers_bundle_known_plugins():
    installers = compat.facts()["efa"]["installers"]
    assert max(installers, key=compat.vtuple) == "1.51.0"
    assert installers["1.51.0"]["aws_ofi_nccl"] == "1.22.0" and installers["1.51.0"]["libfabric"] == "2.7.0"
    assert all(e.get("aws_ofi_nccl") and e.get("source") for e in installers.values())
    over = {"torch": '"2.14.1"', "cuda": '"13.0"', "python": '"3.12"', "os": "ubuntu24.04"}
    found = problems(env_over=over, cluster=efa_cluster('efa_installer: "1.51.0"', "p6-b200.48xlarge"))
    assert [p for p in found if p not in unrecorded_installer_warnings(found)] == []


def test_blackwell_gpus_in_the_arch_map():
    ec2 = pcluster.ec2()
    assert (ec2["gpus"]["B200"], ec2["gpus"]["B300"], ec2["gpus"]["RTX PRO 6000"]) == ("sm_100", "sm_103", "sm_120")
    arches = compat.facts()["arches"]
    for model, arch in ec2["gpus"].items():
        assert model in arches[int(arch.removeprefix("sm_"))]["gpus"], model


def test_efa_installer_versions_compare_as_versions():
    """'1.29' is the same version as '1.29.0' (PEP 440, packaging), not older; '1.43' is the known '1.43.0'."""
    short = problems(cluster=efa_cluster('efa_installer: "1.29", aws_ofi_nccl: "1.7.3"', "p5.48xlarge"))
    assert not [p.message for p in short if "needs EFA installer" in p.message]
    old = problems(cluster=efa_cluster('efa_installer: "1.28", aws_ofi_nccl: "1.7.3"', "p5.48xlarge"))
    assert any("needs EFA installer >= 1.29.0; the cluster has 1.28" in p.message for p in old)
    known = problems(cluster=efa_cluster('efa_installer: "1.43"'))
    assert not [p.message for p in known if "not in the compatibility data" in p.message]
    assert errors(known) == []  # its bundled aws-ofi-nccl 1.16.1 is known, as for "1.43.0"
    assert compat.vtuple("1.29") == compat.vtuple("1.29.0") < compat.vtuple("1.29.1")
    assert compat.vtuple("2.3.0rc1") < compat.vtuple("2.3.0") and compat.vtuple("470.57.02") > compat.vtuple("470.57")


# ------------------------------------------------------------------------------ facts v4: each case names its source


def test_cuda_131_image_exists_with_update_1_driver_floor():
    """13.1.2 tags are published (13.1 Update 1; driver >= 590.48.01 for full compatibility, CUDA 13.1 Update 1
    release notes); a torch wheel for 13.1 is a different question (none is built)."""
    assert compat.check_cuda_image("nvidia/cuda:13.1.2-cudnn-runtime-ubuntu24.04") == []
    cf = compat.cuda_facts("13.1")
    assert (cf["image"], cf["driver_full"], cf["driver_full_for"]) == ("13.1.2", "590.48.01", "13.1.2")
    assert "use nvidia/cuda:13.1.2-runtime-ubuntu24.04" in compat.cuda_image_eol("nvidia/cuda:13.1.1-runtime-ubuntu24.04")


def test_cuda_117_floor_is_labelled_update_1():
    """515.48.07 is 11.7 Update 1's floor (11.7 GA's is 515.43.04): NVIDIA's CUDA release notes driver table."""
    cf = compat.cuda_facts("11.7")
    assert (cf["image"], cf["driver_full"], cf["driver_full_for"]) == ("11.7.1", "515.48.07", "11.7.1")


def test_cuda_134_on_a_580_driver_warns_r615_or_later():
    """CUDA 13.4 "requires an R615 or later driver" for its new features (13.4 Update 1 release notes, driver table);
    a 580-branch driver runs it in minor-version compatibility only."""
    over = {"torch": '"2.14.1"', "cuda": '"13.4"', "python": '"3.12"', "os": "ubuntu24.04"}
    ps = [p for p in problems(env_over=over, cluster=cluster(driver="580.95.05")) if p.cluster]
    assert [(p.severity, p.key, p.message) for p in ps] == [(
        "WARN", "clusters.x.driver", "driver 580.95.05 (branch R580) runs CUDA 13.4 only in minor-version "
        "compatibility: its new features and newly enabled platforms need an R615 or later driver")]
    assert [p for p in problems(env_over=over, cluster=cluster(driver="615.20.01")) if p.cluster] == []
    assert errors(problems(env_over=over, cluster=cluster(driver="575.57.08")))  # below 580: no 13.x at all


def test_cuda_133_needs_the_r610_branch_and_135_refuses_what_is_not_known():
    """13.3 -> R610 (the same driver table); 13.5's branch and tags are not in any source read: null, named."""
    assert compat.cuda_facts("13.3")["driver_branch"] == 610
    ps = [p for p in problems(env_over={"torch": '"2.14.1"', "cuda": '"13.3"', "python": '"3.12"',
                                        "os": "ubuntu24.04", "base": "nvidia/cuda:13.3.1-cudnn-runtime-ubuntu24.04"},
                              cluster=cluster(driver="595.71.05")) if p.key == "clusters.x.driver"]
    assert "need an R610 or later driver" in ps[0].message
    cf = compat.cuda_facts("13.5")
    assert cf["image"] is None and cf["driver_branch"] is None


def test_rubin_needs_cuda_134_and_the_r615_branch():
    """Rubin is compute capability 10.7, first compiled for by CUDA 13.4; a newly enabled platform needs R615."""
    assert compat.facts()["arches"][107]["cuda_min"] == "13.4"
    rubin = "[{model: Rubin, arch: sm_107}]"
    over = {"torch": '"2.14.1"', "cuda": '"13.0"', "python": '"3.12"', "os": "ubuntu24.04"}
    (p,) = errors(problems(env_over=over, cluster=cluster(gpus=rubin, driver="610.43.02")))
    assert (p.key, p.message) == ("clusters.x.driver", "Rubin (sm_107) is a newly enabled platform that needs an "
                                  "R615 or later driver; the cluster has 610.43.02 (branch R610)")
    assert errors(problems(env_over=over, cluster=cluster(gpus=rubin, driver="615.20.01"))) == []


def test_torch_211_cu128_on_v100_is_an_error_from_the_variants_own_arch_list():
    """torch 2.11's CUDA 12.8 build dropped Volta (pytorch/pytorch #175253, RELEASE.md): an ERROR, not "not
    verified"; its cu126 build keeps sm_70."""
    v100 = "[{model: V100, arch: sm_70}]"
    over = {"torch": '"2.11.0"', "cuda": '"12.8"', "python": '"3.12"', "os": "ubuntu24.04"}
    (p,) = errors(problems(env_over=over, cluster=cluster(gpus=v100, driver="575.57.08")))
    assert (p.key, p.message) == ("clusters.x.gpus", "V100 (sm_70) cannot run e: the torch 2.11.0+cu128 wheel is "
                                  "built for sm_75, sm_80, sm_86, sm_90, sm_100, sm_120, none of which runs on sm_70 "
                                  "(needs the same major and a minor <= 0); PTX in the wheel not verified")
    cu126 = {**over, "cuda": '"12.6"'}
    assert [p for p in problems(env_over=cu126, cluster=cluster(gpus=v100, driver="575.57.08"))
            if p.key.endswith(".gpus")] == []


def test_variant_without_an_arch_list_still_warns_not_verified():
    over = {"torch": '"2.8.0"', "cuda": '"12.6"', "python": '"3.12"', "os": "ubuntu24.04"}
    ps = [p for p in problems(env_over=over, cluster=cluster(gpus="[{model: P100, arch: sm_60}]",
                                                               driver="575.57.08")) if p.key.endswith(".gpus")]
    assert [(p.severity, p.message) for p in ps] == [
        ("WARN", "P100 (sm_60): the arch list of the cu126 wheel is not verified")]


def test_torch_215_has_no_cuda_126_and_names_the_last_release():
    """PyTorch removed the 12.6 builds for 2.15 (pytorch/test-infra #8739, pytorch/pytorch #196249, RFC #190385)."""
    over = {"torch": '"2.15.0"', "cuda": '"12.6"', "python": '"3.12"', "os": "ubuntu24.04"}
    msgs = [p.message for p in errors(problems(env_over=over)) if p.key == "environments.e.cuda"]
    assert msgs == ["torch 2.15.0 has no CUDA 12.6 wheel (cu126); variants that exist: cu130, cu132; the last torch "
                    "with a cu126 wheel is 2.14.1 (the last release for sm_50, sm_60, sm_70)"]
    assert compat.torch_series("2.15.0")["cuda_variants"] == ["13.0", "13.2"]


def test_cuda_126_on_torch_214_warns_that_it_is_the_last():
    over = {"torch": '"2.14.1"', "cuda": '"12.6"', "python": '"3.12"', "os": "ubuntu24.04"}
    ps = [p for p in problems(env_over=over) if p.key == "environments.e.cuda"]
    assert [(p.severity, p.message) for p in ps] == [(
        "WARN", "CUDA 12.6 wheels end with torch 2.14: 2.14.1 is the last release with a cu126 wheel (the last for "
        "sm_50, sm_60, sm_70); a later torch needs another variant, which does not run on those GPUs [P]")]
    assert [p for p in problems(env_over={**over, "torch": '"2.13.0"'}) if p.key == "environments.e.cuda"] == []


def test_torch_214_cu134_is_marked_unadvertised_not_vouched_for():
    """The 2.14 cu134 wheels are absent from 2.14's RELEASE.md row: WARN "not verified", neither ERROR nor silence."""
    over = {"torch": '"2.14.1"', "cuda": '"13.4"', "python": '"3.12"', "os": "ubuntu24.04"}
    ps = [p for p in problems(env_over=over) if p.key == "environments.e.cuda"]
    assert [(p.severity, p.message) for p in ps] == [(
        "WARN", "torch 2.14.1's cu134 wheels were built in PyTorch's test channel but are not in its release matrix "
        "(RELEASE.md); not verified (advertised: cu126, cu130, cu132)")]


def test_cu126_nccl_pins_are_primary():
    """Stated by PyTorch's own release-matrix PRs (pytorch/pytorch #190386, #187075, #194367)."""
    wheels = compat.facts()["wheels"]
    assert {wheels[f"{s}+cu126"]["source"] for s in ("2.10", "2.12", "2.13", "2.14")} == {"P"}


def test_torchvision_0292_excludes_python_3141():
    """torchvision 0.29.2's Requires-Python excludes 3.14.1 (PyPI metadata, as copied): a WARN on Python 3.14."""
    over = {"torch": '"2.15.0"', "cuda": '"13.2"', "python": '"3.14"', "os": "ubuntu24.04"}
    ps = [p for p in problems(env_over=over) if p.key == "environments.e.torchvision"]
    assert [(p.severity, p.message) for p in ps] == [(
        "WARN", "torchvision 0.29.2 excludes Python 3.14.1 (its Requires-Python): the image's Python 3.14 must not "
        "be that patch release")]
    assert [p for p in problems(env_over={**over, "python": '"3.13"'}) if p.key == "environments.e.torchvision"] == []


def test_newer_than_the_facts_says_so_with_the_review_date():
    date = compat.review()["date"]
    assert compat.newer_than_facts("torch", "2.16.0") == (
        f"torch 2.16.0 is newer than the facts (reviewed {date}; refresh: docs/facts.md)")
    assert compat.newer_than_facts("torch", "2.15.0") is None and compat.newer_than_facts("CUDA", "13.2") is None
    assert compat.newer_than_facts("CUDA", "14.0").startswith("CUDA 14.0 is newer than the facts")
    with pytest.raises(ShipyardError, match=r"torch 2\.16\.0 is newer than the facts \(reviewed"):
        problems(env_over={"torch": '"2.16.0"'})
    with pytest.raises(ShipyardError, match=r"torch 2\.3\.9 does not exist"):
        problems(env_over={"torch": '"2.3.9"'})


def test_facts_line_names_the_review_date_the_newest_facts_and_the_refresh_command():
    line = report.facts_line()
    newest = compat.newest_known()
    # NCCL: the newest nvidia-nccl-cu13 on PyPI at the review, newer than any torch wheel's pin
    assert newest == {"torch": "2.15.0", "CUDA": "13.5", "NCCL": "2.32.6"}
    assert line == (f"facts: compat.yaml reviewed {compat.review()['date']}; newest known: torch 2.15.0, CUDA 13.5, "
                    "NCCL 2.32.6; refresh the PyPI-derived facts with: invoke compat.refresh (the others by hand: "
                    "docs/facts.md)")


def test_an_nccl_override_newer_than_the_facts_says_so():
    over = {"torch": '"2.14.1"', "cuda": '"13.0"', "python": '"3.12"', "os": "ubuntu24.04"}
    msgs = [p.message for p in problems(env_over={**over, "nccl": '"2.40.1"'}) if p.key == "environments.e.nccl"]
    assert msgs[1] == (f"NCCL 2.40.1 is newer than the facts (reviewed {compat.review()['date']}; refresh: "
                       "docs/facts.md): no NCCL release that new is in the compatibility data; not verified")
    msgs = [p.message for p in problems(env_over={**over, "nccl": '"2.32.6"'}) if p.key == "environments.e.nccl"]
    assert len(msgs) == 1 and "overrides" in msgs[0]


def test_ubuntu_2604_images_exist_from_cuda_134():
    """NVIDIA publishes nvidia/cuda tags for Ubuntu 26.04 from 13.4 (tags as published, secondary); its Python is 3.14
    and its glibc 2.43 (secondary). A CUDA with no 26.04 tag is refused by name."""
    over = {"torch": '"2.14.1"', "cuda": '"13.4"', "python": '"3.14"', "os": "ubuntu26.04"}
    env = env_of(**over)
    assert env.base.value == "nvidia/cuda:13.4.2-runtime-ubuntu26.04"
    assert errors(problems(env_over=over)) == []
    (p,) = errors(problems(env_over={**over, "cuda": '"13.0"'}))
    assert p.key == "environments.e.os" and "published for ubuntu22.04, ubuntu24.04, not ubuntu26.04" in p.message


@pytest.mark.parametrize("torch,cuda,gpu,ok", [
    ("2.12.1", "12.6", "{model: P100, arch: sm_60}", True), ("2.14.1", "12.6", "{model: V100, arch: sm_70}", True),
    ("2.12.1", "13.2", "{model: V100, arch: sm_70}", False), ("2.14.1", "13.2", "{model: GB10, arch: sm_121}", True),
    ("2.10.0", "13.0", "{model: P100, arch: sm_60}", False), ("2.9.1", "12.6", "{model: P100, arch: sm_60}", True),
])
def test_variant_arch_lists_of_the_release_matrix(torch, cuda, gpu, ok):
    """RELEASE.md's CUDA support matrix (pytorch/pytorch #164471 for 2.9, #175253 for 2.10/2.11, #182849 and
    #197555 for 2.12-2.14): 12.6.3 builds sm_50/60/70 and Turing to Hopper; 13.0/13.2 build Turing to Blackwell."""
    over = {"torch": f'"{torch}"', "cuda": f'"{cuda}"', "python": '"3.12"', "os": "ubuntu24.04"}
    ps = [p for p in problems(env_over=over, cluster=cluster(gpus=f"[{gpu}]", driver="615.20.01"))
          if p.key == "clusters.x.gpus"]
    assert [p.severity for p in ps] == ([] if ok else ["ERROR"]), ps


@pytest.mark.parametrize("over", [{"os": "debian12", "stack": "base"},
                                  {"os": "debian12", "stack": "base", "base": '"debian:12-slim"'}])
def test_stack_base_on_the_plain_os_image_is_an_error(over):
    """The OS's own base image (debian:12-slim) carries no Python or torch: `stack: base` there cannot work."""
    fields = {"torch": '"2.14.1"', "cuda": '"13.0"', "python": '"3.11"', **over}
    ps = errors(problems(env_over=fields))
    assert len(ps) == 1 and ps[0].key == "environments.e.stack" and "no torch" in ps[0].message, ps
    assert "\n" not in ps[0].message
    assert errors(problems(env_over={**fields, "stack": "shipyard"})) == []


def test_a_clusters_own_problems_are_those_check_all_reports_for_it_and_the_gate_shows_them():
    from shipyard.commands import gate

    text = f"""environments:
  e:
    torch: "2.3.1"
    cuda: "12.1"
    python: "3.11"
    os: ubuntu22.04
clusters:
{cluster(gpus="[]", extra="")}
"""
    reg = registry.load_text(text, "t.yaml")
    x = reg.clusters["x"]
    own = compat.check_cluster(x)
    assert own and own == [p for p in compat.check_all(reg) if p.environment == "" and p.cluster == "x"]
    assert "no GPU models listed" in own[0].message
    shown = gate.problems(reg, reg.environments["e"], x)
    assert [p for p in own if p in shown] == own
