"""The capability table: what may run where, with the reason for what may not."""
import pytest

from autotune import backends
from autotune.device import DeviceInfo, SMEM_OPTIN


def dev(sm, cuda="13.0"):
    return DeviceInfo(f"sm{sm}", sm, SMEM_OPTIN.get(sm, 101376), versions={"cuda": cuda})


def allowed(family, sm, cuda="13.0"):
    return {a.backend.name: a.ok for a in backends.plan(family, dev(sm, cuda), check_imports=False)}


def test_h200_runs_no_fp4_backend_and_says_why():
    for family in ("fp4_gemm", "moe_fp4"):
        plan = backends.plan(family, dev(90), check_imports=False)
        assert plan and not any(a.ok for a in plan)
        assert all("SM90" in a.reason for a in plan)


def test_sm120_skips_trtllm_and_cutedsl_moe_and_allows_cutlass_cudnn_b12x():
    moe = allowed("moe_fp4", 120)
    assert moe == {"flashinfer_cutlass": True, "flashinfer_trtllm": False, "flashinfer_cutedsl": False, "b12x": True}
    gemm = allowed("fp4_gemm", 120)
    assert gemm["cudnn"] and gemm["cutlass"] and gemm["b12x"] and not gemm["trtllm"]
    reasons = {a.backend.name: a.reason for a in backends.plan("moe_fp4", dev(120), check_imports=False)}
    assert "SM100 cubins" in reasons["flashinfer_trtllm"] and "NaN" in reasons["flashinfer_cutedsl"]


def test_sm100_allows_trtllm():
    assert allowed("moe_fp4", 100)["flashinfer_trtllm"]
    assert allowed("fp4_gemm", 100)["trtllm"]
    assert not allowed("moe_fp4", 100)["b12x"]


def test_b12x_needs_cuda_13():
    assert not allowed("moe_fp4", 120, cuda="12.9")["b12x"]
    assert not allowed("fp4_gemm", 120, cuda="12.8")["b12x"]


def test_sm90_backends_for_the_h200_families():
    assert allowed("moe_bf16", 90) == {"triton": True, "flashinfer_cutlass": True}
    fp8 = allowed("fp8_gemm", 90)
    assert fp8["triton"] and fp8["torch_scaled_mm"] and fp8["flashinfer_cublas"] and fp8["flashinfer_cudnn"]


def test_table_agrees_with_flashinfers_own_declarations_for_mm_fp4():
    """Where we defer to FlashInfer, our answer is FlashInfer's answer (no stale copy)."""
    import flashinfer

    ours, theirs = {}, {}
    for sm in (90, 100, 120):
        for b in backends.backends("fp4_gemm"):
            fn, arg = b.flashinfer
            if arg is None:
                continue
            ours[sm, b.name] = backends.availability(b, dev(sm), check_imports=False).ok
            theirs[sm, b.name] = flashinfer.mm_fp4.is_backend_supported(arg, sm)
    assert ours == theirs
    # every mm_fp4 backend FlashInfer has was compared, at each SM, and both answers occur
    names = {name for _, name in ours}
    assert names == {"b12x", "cudnn", "cute-dsl", "cutlass", "trtllm"} and len(ours) == 3 * len(names)
    assert not any(ours[90, n] for n in names) and ours[100, "trtllm"] and not ours[120, "trtllm"]


def test_every_selectable_value_is_one_sglang_accepts():
    from sglang.srt.arg_groups import choices

    accepted = {"fp4-gemm-backend": choices.FP4_GEMM_RUNNER_BACKEND_CHOICES,
                "fp8-gemm-backend": choices.FP8_GEMM_RUNNER_BACKEND_CHOICES,
                "moe-runner-backend": choices.MOE_RUNNER_BACKEND_CHOICES}
    for b in backends.runners():
        if b.sglang_value is not None:
            assert b.sglang_value in accepted[backends.FAMILY_FLAGS[b.family]], b


def test_unknown_names_are_clear_errors():
    with pytest.raises(KeyError, match="unknown kernel family"):
        backends.backends("fp3_gemm")
    with pytest.raises(KeyError, match="unknown backend"):
        backends.get("fp4_gemm", "tensorrt")


def test_missing_package_is_a_reason_not_a_crash():
    b = backends.get("fp8_gemm", "deep_gemm")
    a = backends.availability(b, dev(90))
    assert a.ok is False and "deep_gemm" in a.reason


def test_sglang_auto_resolution_per_gpu():
    # the field failure this project exists for: auto picks trtllm MoE on SM120, which the table forbids
    auto = backends.sglang_auto("moe_fp4", dev(120))
    assert auto == "flashinfer_trtllm"
    assert not backends.availability(backends.get("moe_fp4", auto), dev(120), check_imports=False).ok
    assert backends.sglang_auto("fp4_gemm", dev(120)) == "cutlass"
    assert backends.sglang_auto("fp4_gemm", dev(100)) == "cute-dsl"
    assert backends.sglang_auto("fp8_gemm", dev(90), deep_gemm=False) == "triton"
    assert backends.sglang_auto("fp8_gemm", dev(90), deep_gemm=True) == "deep_gemm"
    assert backends.sglang_auto("moe_bf16", dev(90)) == "triton"


def test_every_sglang_fp8_linear_a_runner_calls_imports_from_the_pinned_sglang():
    # On the H200 (2026-12-01) the triton backend failed at its first launch: SGLang's quantization
    # package imports compressed_tensors, which the environment lacked. The CPU environment pins
    # the same import closure, so a missing module or a renamed function fails here first.
    import inspect

    from autotune.kernels.fp8_gemm import sglang_fp8_utils

    fp8_utils = sglang_fp8_utils()   # the import the runners use

    selectable = [b for b in backends.backends("fp8_gemm") if b.sglang_value]
    assert {b.name for b in selectable} == {"triton", "deep_gemm", "cutlass"}
    for b in selectable:
        params = list(inspect.signature(getattr(fp8_utils, b.function)).parameters)
        assert params[:4] == ["input", "weight", "block_size", "weight_scale"], (b.name, params)


def test_a_submodule_imports_where_its_package_init_needs_sgl_kernel(tmp_path, monkeypatch):
    # SGLang's quantization and triton_utils packages import sgl_kernel in their __init__ on CUDA
    # (the H200 here has no such wheel): the submodule we call must still import, with the
    # package attributes it reads, and any other import error must still surface.
    import sys

    from autotune.kernels.sglang_loader import sglang_submodule

    pkg = tmp_path / "fakequant"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import sgl_kernel\n")
    (pkg / "linear.py").write_text("from fakequant import helper\nVALUE = helper() + 1\n")
    (pkg / "broken.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fakequant", raising=False)
    mod = sglang_submodule("fakequant", "linear", helper=lambda: 41)
    assert mod.VALUE == 42
    with pytest.raises(ModuleNotFoundError, match="not_a_module_anywhere"):
        sglang_submodule("fakequant", "broken")
    for name in ("fakequant", "fakequant.linear"):
        sys.modules.pop(name, None)


def test_a_backend_is_one_module_its_family_discovers(tmp_path, monkeypatch):
    """Adding a backend is one file: a module of the family's package that declares its runner."""
    import sys

    from autotune.kernels.runner import Runner, discover

    pkg = tmp_path / "plugged"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a_one.py").write_text("from autotune.kernels.runner import Runner\n"
                                  "RUNNER = Runner('fp8_gemm', 'one', None, 'test', sms=frozenset({90}))\n")
    (pkg / "b_two.py").write_text("from autotune.kernels.runner import Runner\n"
                                  "RUNNERS = (Runner('moe_bf16', 'two', 'triton', 't'), Runner('moe_fp8', 'two', None, 't'))\n")
    (pkg / "helpers.py").write_text("X = 1\n")      # a module without a runner is not one
    monkeypatch.syspath_prepend(str(tmp_path))
    found = discover("plugged")
    assert [(r.family, r.name) for r in found] == [("fp8_gemm", "one"), ("moe_bf16", "two"), ("moe_fp8", "two")]
    assert all(isinstance(r, Runner) for r in found)
    assert backends.availability(found[0], dev(120), check_imports=False).reason == "supports SM90; this is SM120"
    sys.modules.pop("plugged", None)


def test_every_family_module_declares_its_runners_and_unbuilt_ones_say_why():
    from autotune.kernels import get_family

    declared = {(r.family, r.name) for r in backends.runners()}
    assert ("fp8_gemm", "triton") in declared and ("moe_fp4", "flashinfer_trtllm") in declared
    fam = get_family("fp4_gemm")
    reasons = {a.backend.name: a.reason for a in fam.availability(dev(100))}
    assert reasons["trtllm"] == "autotune has no runner for it yet (needs shuffled 8x4 weights)"
    from autotune.kernels.runner import Runner
    assert all(r.not_implemented or type(r).run is not Runner.run for r in backends.runners())   # each launches
