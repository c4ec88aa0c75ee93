"""Which backend of which kernel family may run on which GPU: the one capability table.

Each backend names the SGLang server-argument value that selects it (None when SGLang cannot
select it and we measure it for reference only), what it calls, and where its support comes
from: FlashInfer's own declaration (its `backend_requirement` / `supported_compute_capability`
decorators, queried at run time, so a FlashInfer upgrade that adds an architecture is seen), or
an explicit SM set where FlashInfer declares nothing. On top, `KNOWN_FAILURES` records what the
field showed despite the declarations (the hand investigation on 8x RTX PRO 6000, SM120), with
the evidence. An unsupported backend is recorded as skipped with its reason and never launched.
"""
from __future__ import annotations

from dataclasses import dataclass

from .device import DeviceInfo

# SGLang server flag each family's backend choice is exported to.
FAMILY_FLAGS = {
    "fp4_gemm": "fp4-gemm-backend",
    "fp8_gemm": "fp8-gemm-backend",
    "moe_fp4": "moe-runner-backend",
    "moe_fp8": "moe-runner-backend",
    "moe_bf16": "moe-runner-backend",
}
FAMILIES = tuple(FAMILY_FLAGS)


@dataclass(frozen=True)
class Backend:
    family: str
    name: str
    sglang_value: str | None        # value of FAMILY_FLAGS[family]; None: not selectable in SGLang
    calls: str                      # the API measured
    flashinfer: tuple | None = None  # (function, backend argument or None) whose declaration decides
    sms: frozenset | None = None     # explicit compute capabilities where FlashInfer declares none
    min_cuda: tuple | None = None    # (major, minor) of the CUDA runtime
    tactics: bool = False            # has a tactic index to search
    needs: tuple = ()                # Python modules that must import


@dataclass(frozen=True)
class KnownFailure:
    family: str
    backend: str
    sms: frozenset
    reason: str


SM100S = frozenset({100, 103})
SM120S = frozenset({120, 121})
HOPPER_AND_UP = frozenset({90, 100, 103, 110, 120, 121})

TABLE: tuple[Backend, ...] = (
    # --- NVFP4 dense GEMM: flashinfer.mm_fp4 --------------------------------------------------
    Backend("fp4_gemm", "cudnn", "flashinfer_cudnn", "flashinfer.mm_fp4(backend='cudnn')", ("mm_fp4", "cudnn")),
    Backend("fp4_gemm", "cutlass", "flashinfer_cutlass", "flashinfer.mm_fp4(backend='cutlass')",
            ("mm_fp4", "cutlass"), tactics=True),
    Backend("fp4_gemm", "trtllm", "flashinfer_trtllm", "flashinfer.mm_fp4(backend='trtllm')", ("mm_fp4", "trtllm")),
    Backend("fp4_gemm", "cute-dsl", "flashinfer_cutedsl", "flashinfer.mm_fp4(backend='cute-dsl')", ("mm_fp4", "cute-dsl")),
    # b12x is what mm_fp4's auto prefers on SM120; SGLang reaches it through `auto`.
    Backend("fp4_gemm", "b12x", None, "flashinfer.mm_fp4(backend='b12x')", ("mm_fp4", "b12x"),
            min_cuda=(13, 0), tactics=True),
    # --- NVFP4 MoE ------------------------------------------------------------------------------
    Backend("moe_fp4", "flashinfer_cutlass", "flashinfer_cutlass", "flashinfer.cutlass_fused_moe (nvfp4)",
            sms=frozenset({100, 103, 110, 120, 121}), tactics=True),
    Backend("moe_fp4", "flashinfer_trtllm", "flashinfer_trtllm", "flashinfer.trtllm_fp4_block_scale_moe",
            sms=SM100S, tactics=True),
    Backend("moe_fp4", "flashinfer_cutedsl", "flashinfer_cutedsl", "flashinfer.cute_dsl_fused_moe_nvfp4",
            ("cute_dsl_fused_moe_nvfp4", None)),
    Backend("moe_fp4", "b12x", None, "flashinfer.b12x_fused_moe", ("b12x_fused_moe", None), min_cuda=(13, 0)),
    # --- FP8 dense GEMM (what runs on SM90 too) ---------------------------------------------------
    Backend("fp8_gemm", "triton", "triton", "SGLang w8a8_block_fp8_matmul (Triton, block [128, 128])",
            sms=frozenset({89}) | HOPPER_AND_UP, needs=("sglang",)),
    Backend("fp8_gemm", "deep_gemm", "deep_gemm", "deep_gemm fp8 GEMM (block [128, 128])",
            sms=frozenset({90, 100, 103}), needs=("deep_gemm",)),
    Backend("fp8_gemm", "cutlass", "cutlass", "sgl_kernel fp8_blockwise_scaled_mm",
            sms=frozenset({90, 100, 103, 120, 121}), needs=("sgl_kernel",)),
    Backend("fp8_gemm", "torch_scaled_mm", None, "torch._scaled_mm (cuBLASLt, per-tensor)",
            sms=frozenset({89}) | HOPPER_AND_UP),
    Backend("fp8_gemm", "flashinfer_cublas", None, "flashinfer.bmm_fp8(backend='cublas') (per-tensor)",
            ("bmm_fp8", "cublas")),
    Backend("fp8_gemm", "flashinfer_cudnn", None, "flashinfer.bmm_fp8(backend='cudnn') (per-tensor)",
            ("bmm_fp8", "cudnn")),
    # --- MoE in FP8 (block [128, 128]) and BF16 -------------------------------------------------
    Backend("moe_fp8", "triton", "triton", "SGLang fused_moe Triton kernel (tuned configs)",
            sms=frozenset({89}) | HOPPER_AND_UP, needs=("sglang",)),
    # FlashInfer's block-scale FP8 CUTLASS MoE exists for SM90 only; SGLang's Fp8MoEMethod has no
    # flashinfer_cutlass path (it falls back to triton), so it is measured for reference.
    Backend("moe_fp8", "flashinfer_cutlass", None, "flashinfer.cutlass_fused_moe (fp8 block, deepseek scales)",
            sms=frozenset({90}), tactics=True),
    Backend("moe_bf16", "triton", "triton", "SGLang fused_moe Triton kernel (tuned configs)",
            sms=frozenset({80, 86, 89}) | HOPPER_AND_UP, needs=("sglang",)),
    Backend("moe_bf16", "flashinfer_cutlass", "flashinfer_cutlass", "flashinfer.cutlass_fused_moe (bf16)",
            sms=frozenset({89}) | HOPPER_AND_UP, tactics=True),
)

KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure("moe_fp4", "flashinfer_trtllm", SM120S,
                 "crashes the process on load on SM120: its kernels are SM100 cubins (hand investigation, 8x RTX PRO 6000)"),
    KnownFailure("moe_fp4", "flashinfer_cutedsl", SM120S,
                 "loads but produces NaN/garbage on SM120 (hand investigation, 8x RTX PRO 6000)"),
)


@dataclass
class Availability:
    backend: Backend
    ok: bool
    reason: str = ""


def _flashinfer_supports(fn_name: str, backend: str | None, sm: int) -> bool | None:
    """FlashInfer's own declaration, or None when it declares nothing for this function."""
    try:
        import flashinfer
    except Exception:
        return None
    fn = getattr(flashinfer, fn_name, None)
    if fn is None:
        return False
    if backend is not None and hasattr(fn, "is_backend_supported"):
        return bool(fn.is_backend_supported(backend, sm))
    if hasattr(fn, "is_compute_capability_supported"):
        return bool(fn.is_compute_capability_supported(sm))
    return None


def _cuda_version(device: DeviceInfo) -> tuple | None:
    v = device.versions.get("cuda") or ""
    try:
        major, minor = v.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def availability(b: Backend, device: DeviceInfo, check_imports: bool = True) -> Availability:
    sm = device.sm
    needs = b.needs + (("flashinfer",) if "flashinfer" in b.calls else ())
    for kf in KNOWN_FAILURES:
        if kf.family == b.family and kf.backend == b.name and sm in kf.sms:
            return Availability(b, False, f"known failure on SM{sm}: {kf.reason}")
    if b.sms is not None and sm not in b.sms:
        return Availability(b, False, f"supports SM{', SM'.join(str(s) for s in sorted(b.sms))}; this is SM{sm}")
    if b.flashinfer is not None:
        declared = _flashinfer_supports(*b.flashinfer, sm)
        if declared is False:
            fn, arg = b.flashinfer
            what = f"flashinfer.{fn}" + (f" backend '{arg}'" if arg else "")
            return Availability(b, False, f"{what} does not support SM{sm} (FlashInfer's own requirement table)")
    if b.min_cuda is not None:
        cuda = _cuda_version(device)
        if cuda is None or cuda < b.min_cuda:
            return Availability(b, False, f"needs CUDA >= {b.min_cuda[0]}.{b.min_cuda[1]}, "
                                          f"this is {device.versions.get('cuda') or 'unknown'}")
    if check_imports:
        for mod in needs:
            if not _importable(mod):
                return Availability(b, False, f"needs the '{mod}' package, not installed")
    return Availability(b, True)


def backends(family: str) -> list[Backend]:
    if family not in FAMILY_FLAGS:
        raise KeyError(f"unknown kernel family {family!r}; known: {', '.join(FAMILIES)}")
    return [b for b in TABLE if b.family == family]


def get(family: str, name: str) -> Backend:
    for b in backends(family):
        if b.name == name:
            return b
    raise KeyError(f"unknown backend {name!r} for {family}; known: {', '.join(b.name for b in backends(family))}")


def plan(family: str, device: DeviceInfo, check_imports: bool = True) -> list[Availability]:
    return [availability(b, device, check_imports) for b in backends(family)]


def sglang_auto(family: str, device: DeviceInfo, deep_gemm: bool | None = None) -> str | None:
    """The backend SGLang 0.5.23 resolves `auto` to for this family on this GPU (its code, by file):
    - fp4_gemm: srt/layers/quantization/fp4_utils.py initialize_fp4_gemm_config: SM100 ->
      flashinfer_cutedsl, SM80-SM99 -> marlin, otherwise flashinfer_cutlass.
    - moe_fp4: srt/layers/quantization/modelopt_quant.py create_moe_runner: SM80-SM99 -> marlin,
      otherwise flashinfer_trtllm (also on SM120, where it crashes: the reason this tool exists).
    - fp8_gemm: srt/layers/quantization/fp8_utils.py: SM120 -> cutlass; deep_gemm when its JIT
      is enabled; Blackwell + FlashInfer -> flashinfer_trtllm; otherwise triton.
    - moe_fp8: srt/layers/quantization/fp8.py: deep_gemm only with DeepEP-style all-to-all, else triton.
    - moe_bf16: srt/layers/quantization/unquant.py: triton.
    Returned names are our backend names; None when SGLang's choice is not one we measure.
    """
    sm = device.sm
    if deep_gemm is None:
        deep_gemm = _importable("deep_gemm") if device.kind == "gpu" else False
    if family == "fp4_gemm":
        return "cute-dsl" if sm in SM100S else ("cutlass" if sm >= 100 else None)
    if family == "moe_fp4":
        return "flashinfer_trtllm" if sm >= 100 else None
    if family == "fp8_gemm":
        if sm in SM120S:
            return "cutlass"
        if deep_gemm and sm in (90, 100, 103):
            return "deep_gemm"
        return "triton" if sm < 100 else None
    if family in ("moe_fp8", "moe_bf16"):
        return "triton"
    raise KeyError(f"unknown kernel family {family!r}; known: {', '.join(FAMILIES)}")
