"""Which backend of which kernel family may run on which GPU: the capability table.

The table is made of the runners' own declarations (autotune.kernels.runner: one module per
backend in its family's package). Each names the SGLang server-argument value that selects it
(None when SGLang cannot select it and we measure it for reference only), what it calls, and where
its support comes from: FlashInfer's own declaration (its `backend_requirement` /
`supported_compute_capability` decorators, queried at run time, so a FlashInfer upgrade that adds
an architecture is seen), or an explicit SM set where FlashInfer declares nothing; and what the
field showed despite the declarations (the hand investigation on 8x RTX PRO 6000, SM120), with the
evidence. This module applies those rules; an unsupported backend is recorded as skipped with its
reason and never launched.
"""
from __future__ import annotations

import functools
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
# The package whose modules declare each family's runners.
RUNNER_PACKAGES = {"fp4_gemm": "autotune.kernels.fp4_gemm", "fp8_gemm": "autotune.kernels.fp8_gemm",
                   "moe_fp4": "autotune.kernels.moe_backends", "moe_fp8": "autotune.kernels.moe_backends",
                   "moe_bf16": "autotune.kernels.moe_backends"}

SM100S = frozenset({100, 103})
SM120S = frozenset({120, 121})
HOPPER_AND_UP = frozenset({90, 100, 103, 110, 120, 121})


@functools.cache
def _declared(package: str) -> tuple:
    from .kernels.runner import discover
    return tuple(discover(package))


def runners(family: str | None = None) -> list:
    """Every declared runner (of one family)."""
    families = FAMILIES if family is None else (family,)
    return [r for f in families for r in _declared(RUNNER_PACKAGES[f]) if r.family == f]


@dataclass
class Availability:
    backend: object      # the runner
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


def availability(b, device: DeviceInfo, check_imports: bool = True) -> Availability:
    sm = device.sm
    needs = b.needs + (("flashinfer",) if "flashinfer" in b.calls else ())
    for sms, reason in b.known_failures:
        if sm in sms:
            return Availability(b, False, f"known failure on SM{sm}: {reason}")
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


def backends(family: str) -> list:
    if family not in FAMILY_FLAGS:
        raise KeyError(f"unknown kernel family {family!r}; known: {', '.join(FAMILIES)}")
    return runners(family)


def get(family: str, name: str):
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
