"""The NVFP4 MoE sieve launches every --moe-runner-backend value the installed SGLang lists, not a
list of ours (autotune/families/moe_backends/sglang_listed.py): values no module declares are
launched through SGLang's block with no prediction, in their own trials only, and what SGLang
answers for them is its own."""
import pytest

from autotune.contract import capabilities
from autotune.measure import records
from autotune.gpus.device import DeviceInfo, SMEM_OPTIN
from autotune.adapters import sglang_layer as L
from autotune.families.moe_backends import MoeFp4, MoeLayerInputs
from autotune.families.moe_backends import sglang_listed
from autotune.adapters.moe_checkpoint import make_shards
from autotune.measure.measurer import classify
from autotune.problems.models import Problem

NVFP4 = Problem(E=4, N=128, K=256, top_k=2, dtype="nvfp4")


def dev(sm):
    return DeviceInfo(f"sm{sm}", sm, SMEM_OPTIN.get(sm, 101376), versions={"cuda": "13.0"})


def test_every_value_sglang_lists_is_launched_for_nvfp4_experts():
    from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES

    values = {r.sglang_value for r in capabilities.runners("moe_fp4") if r.sglang_value}
    assert values == set(MOE_RUNNER_BACKEND_CHOICES) - {"auto"}
    for sm in (90, 100, 120):
        plan = capabilities.plan("moe_fp4", dev(sm), check_imports=False)
        assert all(a.ok for a in plan if a.backend.sglang_value), [a.reason for a in plan if not a.ok]
    names = [r.name for r in capabilities.runners("moe_fp4")]
    assert len(names) == len(set(names))            # a declared value is not launched twice


def test_a_value_a_new_sglang_lists_is_launched_without_a_module(monkeypatch):
    from sglang.srt.arg_groups import choices

    monkeypatch.setattr(choices, "MOE_RUNNER_BACKEND_CHOICES",
                        [*choices.MOE_RUNNER_BACKEND_CHOICES, "flashinfer_nvfp4_next"])
    listed = {r.name: r for r in sglang_listed.listed_runners()}
    assert "flashinfer_nvfp4_next" in listed and listed["flashinfer_nvfp4_next"].sglang_value == "flashinfer_nvfp4_next"
    assert not listed["flashinfer_nvfp4_next"].declared
    # the declared ones keep their own module (predictions, tactics): not doubled here
    assert not {"flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cutedsl", "marlin", "triton"} & set(listed)


def test_undeclared_values_stay_out_of_the_warm_up():
    """The warm-up runs in the run's first worker: a process death there would take the pool, so
    only what is declared and expected to work is launched there (SM120: cutlass, not trtllm)."""
    fam = MoeFp4()
    device = dev(120)
    warm = set(fam.warmup_backends(device))
    undeclared = {a.backend.name for a in fam.availability(device) if a.ok and not a.backend.declared}
    assert undeclared and not warm & undeclared
    assert "flashinfer_cutlass" in warm and "flashinfer_trtllm" not in warm and "flashinfer_cutedsl" not in warm


@pytest.fixture(scope="module")
def shards():
    return make_shards(NVFP4, seed=5, device="cpu")


@pytest.mark.parametrize("value, said", [
    ("cutlass", "moe_runner_backend=cutlass is not supported for NVFP4 MoE"),
    ("lora_triton", "NVFP4 MoE LoRA requires --moe-runner-backend lora_marlin"),
    ("hpc_ops", "hpc_ops only supports Fp8MoEMethod"),
    ("megamoe", "'megamoe' is not a valid MoeRunnerBackend"),   # SGLang lists a value its own enum lacks
])
def test_sglangs_answer_for_an_undeclared_value_on_sm120_is_its_own(shards, value, said):
    runner = capabilities.get("moe_fp4", value)
    inputs = MoeLayerInputs(NVFP4, 1, [], [], [], [], shards, {})
    with L.platform_view(120), pytest.raises(L.Refused, match=f"SGLang's {value} MoE runner refused") as e:
        runner.block(inputs)
    assert said in str(e.value) and classify(e.value) == (records.REFUSED, False)


def test_an_undeclared_value_sglang_builds_is_kept_for_its_launch(shards):
    """flashinfer_mxfp4 builds under SGLang's NVFP4 method on SM120: the run launches it and the
    reference decides (no refusal invented for it)."""
    inputs = MoeLayerInputs(NVFP4, 1, [], [], [], [], shards, {})
    with L.platform_view(120):
        block = capabilities.get("moe_fp4", "flashinfer_mxfp4").block(inputs)
    assert block.runner_backend == "flashinfer_mxfp4" and inputs.blocks["flashinfer_mxfp4"] is block


def test_on_sm90_sglang_refuses_every_undeclared_value_but_its_marlin_ones(shards):
    """The H200's expected outcome for the sweep: SGLang's NVFP4 method serves only its Marlin
    (W4A16) paths below Blackwell, so every other listed value is refused at construction, in
    SGLang's words, before any kernel runs (the marlin ones need CUDA: their JIT build)."""
    refused, built = {}, []
    for r in capabilities.runners("moe_fp4"):
        if r.declared or "marlin" in r.name:
            continue
        inputs = MoeLayerInputs(NVFP4, 1, [], [], [], [], shards, {})
        try:
            with L.platform_view(90):
                r.block(inputs)
            built.append(r.name)
        except L.Refused as e:
            refused[r.name] = str(e)
    assert not built and len(refused) >= 10
    platform = [n for n, why in refused.items() if "Current platform does not support NVFP4" in why]
    assert set(refused) - set(platform) <= {"lora_cutedsl", "lora_triton", "megamoe"}
