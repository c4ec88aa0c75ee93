"""The capability table: what may run where, with the reason for what may not."""
import pytest

from autotune.contract import capabilities, registry
from autotune.gpus.device import DeviceInfo, SMEM_OPTIN


def dev(sm, cuda="13.0"):
    return DeviceInfo(f"sm{sm}", sm, SMEM_OPTIN.get(sm, 101376), versions={"cuda": cuda})


def allowed(family, sm, cuda="13.0"):
    return {a.backend.name: a.ok for a in capabilities.plan(family, dev(sm, cuda), check_imports=False)}


def expected(family, sm, cuda="13.0"):
    return {a.backend.name: a.expected for a in capabilities.plan(family, dev(sm, cuda), check_imports=False)}


def test_h200_launches_every_fp4_backend_and_says_what_each_is_expected_to_do():
    """The sieve launches what the packages offer: on SM90 every FP4 backend autotune can launch
    runs (to fail there for real), each with the declarations' prediction beside it."""
    for family in ("fp4_gemm", "moe_fp4"):
        plan = {a.backend.name: a for a in capabilities.plan(family, dev(90), check_imports=False)}
        launched = {n for n, a in plan.items() if a.ok}
        assert launched == {n for n, a in plan.items() if not a.backend.not_implemented}
        assert all("SM90" in a.expected for n, a in plan.items() if a.ok and n != "marlin" and a.backend.declared)
        # what no module declares (values SGLang lists, autotune/families/moe_backends/sglang_listed.py)
        # has no prediction at all: its outcome is all there is
        assert all(a.expected == "" for a in plan.values() if not a.backend.declared)
        assert plan["marlin"].ok and plan["marlin"].expected == ""      # SGLang's own SM90 NVFP4 path
    assert not capabilities.availability(capabilities.get("moe_fp4", "b12x"), dev(120), check_imports=False).ok


def test_sm120_predictions_are_the_hand_investigations_findings():
    moe = expected("moe_fp4", 120)
    assert "SM100 cubins" in moe["flashinfer_trtllm"] and "SM100 cubins" in moe["flashinfer_trtllm_routed"]
    assert "NaN" in moe["flashinfer_cutedsl"]
    assert moe["flashinfer_cutlass"] == moe["marlin"] == ""
    gemm = expected("fp4_gemm", 120)
    assert gemm["cudnn"] == gemm["cutlass"] == gemm["b12x"] == "" and gemm["trtllm"]


def test_a_known_failure_is_a_prediction_never_a_gate():
    """A backend whose declaration says it fails here is still launched: the outcome decides."""
    from autotune.contract.runner import Runner

    doomed = Runner("moe_fp4", "doomed", "flashinfer_cutedsl", "test", sms=frozenset({100}),
                    known_failures=((frozenset({120}), "NaN on SM120"),))
    a = capabilities.availability(doomed, dev(120), check_imports=False)
    assert a.ok and a.expected == "known failure on SM120: NaN on SM120"
    b = capabilities.availability(doomed, dev(90), check_imports=False)
    assert b.ok and b.expected == "built for SM100; this is SM90"


def test_sm100_expects_trtllm_to_run():
    assert expected("moe_fp4", 100)["flashinfer_trtllm"] == ""
    assert expected("fp4_gemm", 100)["trtllm"] == ""
    assert expected("moe_fp4", 100)["flashinfer_cutlass"] == ""


def test_b12x_is_expected_to_need_cuda_13():
    assert "CUDA >= 13.0" in expected("fp4_gemm", 120, cuda="12.8")["b12x"]
    assert expected("fp4_gemm", 120, cuda="13.0")["b12x"] == ""


def test_sm90_backends_for_the_h200_families():
    assert allowed("moe_bf16", 90) == {"triton": True, "flashinfer_cutlass": True}
    fp8 = allowed("fp8_gemm", 90)
    assert fp8["triton"] and fp8["torch_scaled_mm"] and fp8["flashinfer_cublas"] and fp8["flashinfer_cudnn"]
    assert expected("fp8_gemm", 90)["triton"] == ""


def test_table_agrees_with_flashinfers_own_declarations_for_mm_fp4():
    """Where we defer to FlashInfer, our answer is FlashInfer's answer (no stale copy)."""
    import flashinfer

    ours, theirs = {}, {}
    for sm in (90, 100, 120):
        for b in capabilities.backends("fp4_gemm"):
            fn, arg = b.flashinfer or (None, None)       # SGLang's own kernels (marlin): no FlashInfer table
            if arg is None:
                continue
            ours[sm, b.name] = capabilities.expected_failure(b, dev(sm)) is None
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
    for b in capabilities.runners():
        if b.sglang_value is not None:
            assert b.sglang_value in accepted[registry.get(b.family).flag], b


def test_unknown_names_are_clear_errors():
    with pytest.raises(KeyError, match="unknown kernel family"):
        capabilities.backends("fp3_gemm")
    with pytest.raises(KeyError, match="unknown backend"):
        capabilities.get("fp4_gemm", "tensorrt")


def test_missing_package_is_a_reason_not_a_crash():
    b = capabilities.get("fp8_gemm", "deep_gemm")
    a = capabilities.availability(b, dev(90))
    assert a.ok is False and "deep_gemm" in a.reason


@pytest.fixture
def fresh_memo(tmp_path, monkeypatch):
    import autotune.adapters.sglang_loader as loader

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(loader, "_memo", None)


def test_sglang_auto_resolution_per_gpu_is_sglangs_own(fresh_memo):
    """`auto` as SGLang 0.5.23's own code resolves it, told which GPU it is on: its server-argument
    stage puts ModelOpt NVFP4 MoE on flashinfer_cutlass on SM120 (an earlier release's trtllm, the
    field failure this project began with, is gone), its quant method picks trtllm on SM100 and
    marlin on SM90."""
    assert [capabilities.sglang_auto("moe_fp4", dev(sm)) for sm in (90, 100, 120)] == \
        ["marlin", "flashinfer_trtllm", "flashinfer_cutlass"]
    assert [capabilities.sglang_auto("fp4_gemm", dev(sm)) for sm in (90, 100, 120)] == ["marlin", "cute-dsl", "cutlass"]
    assert [capabilities.sglang_auto("moe_bf16", dev(sm)) for sm in (90, 120)] == ["triton", "triton"]
    assert capabilities.sglang_auto("moe_fp8", dev(90)) == "triton"
    assert capabilities.sglang_auto("fp8_gemm", dev(90), deep_gemm=False) == "triton"
    assert capabilities.sglang_auto("fp8_gemm", dev(90), deep_gemm=True) == "deep_gemm"


def test_sglang_auto_follows_sglangs_code_not_a_copy(fresh_memo, monkeypatch):
    """Change SGLang's resolution and ours changes with it."""
    from sglang.srt.layers.quantization import fp4_utils

    def resolve():
        fp4_utils.FP4_GEMM_RUNNER_BACKEND = fp4_utils.Fp4GemmRunnerBackend.FLASHINFER_CUDNN
    monkeypatch.setattr(fp4_utils, "initialize_fp4_gemm_config", resolve)
    assert capabilities.sglang_auto("fp4_gemm", dev(120)) == "cudnn"


def test_every_sglang_fp8_linear_a_runner_calls_imports_from_the_pinned_sglang():
    # On the H200 (2026-12-01) the triton backend failed at its first launch: SGLang's quantization
    # package imports compressed_tensors, which the environment lacked. The CPU environment pins
    # the same import closure, so a missing module or a renamed function fails here first.
    import inspect

    from autotune.families.fp8_gemm import sglang_fp8_utils

    fp8_utils = sglang_fp8_utils()   # the import the runners use

    selectable = [b for b in capabilities.backends("fp8_gemm") if b.sglang_value]
    assert {b.name for b in selectable} == {"triton", "deep_gemm", "cutlass"}
    for b in selectable:
        params = list(inspect.signature(getattr(fp8_utils, b.function)).parameters)
        assert params[:4] == ["input", "weight", "block_size", "weight_scale"], (b.name, params)


def test_a_submodule_imports_where_its_package_init_needs_sgl_kernel(tmp_path, monkeypatch):
    # SGLang's quantization and triton_utils packages import sgl_kernel in their __init__ on CUDA
    # (the H200 here has no such wheel): the submodule we call must still import, with the
    # package attributes it reads, and any other import error must still surface.
    import sys

    from autotune.adapters.sglang_loader import sglang_submodule

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

    from autotune.contract.runner import Runner, discover

    pkg = tmp_path / "plugged"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a_one.py").write_text("from autotune.contract.runner import Runner\n"
                                  "RUNNER = Runner('fp8_gemm', 'one', None, 'test', sms=frozenset({90}))\n")
    (pkg / "b_two.py").write_text("from autotune.contract.runner import Runner\n"
                                  "RUNNERS = (Runner('moe_bf16', 'two', 'triton', 't'), Runner('moe_fp8', 'two', None, 't'))\n")
    (pkg / "helpers.py").write_text("X = 1\n")      # a module without a runner is not one
    monkeypatch.syspath_prepend(str(tmp_path))
    found = discover("plugged")
    assert [(r.family, r.name) for r in found] == [("fp8_gemm", "one"), ("moe_bf16", "two"), ("moe_fp8", "two")]
    assert all(isinstance(r, Runner) for r in found)
    assert capabilities.availability(found[0], dev(120), check_imports=False).expected == "built for SM90; this is SM120"
    sys.modules.pop("plugged", None)


def test_every_backend_sglang_offers_is_launched_and_unbuilt_ones_say_why():
    """No runner SGLang can select is a declaration only; what is not launched says why."""
    from autotune.contract.protocol import get_family
    from autotune.contract.runner import Runner

    declared = {(r.family, r.name) for r in capabilities.runners()}
    assert ("fp8_gemm", "triton") in declared and ("moe_fp4", "flashinfer_trtllm") in declared
    for r in capabilities.runners():
        if r.sglang_value is not None:
            assert not r.not_implemented and type(r).run is not Runner.run, r
    reasons = {a.backend.name: a.reason for a in get_family("moe_fp4").availability(dev(120)) if not a.ok}
    assert reasons == {"b12x": "not launched: SGLang 0.5.23 has no --moe-runner-backend value for it"}
