"""Which backends of which kernel family a run launches on a GPU, and what is expected of them.

The table is made of the runners' own declarations (autotune.contract.runner: one module per
backend in its family's package). Each names the SGLang server-argument value that selects it
(None when SGLang cannot select it and we measure it for reference only), what it calls, and what
is known of where it runs: FlashInfer's own declaration (its `backend_requirement` /
`supported_compute_capability` decorators, queried at run time), an explicit SM set where
FlashInfer declares nothing, a CUDA minimum, and what the field showed despite the declarations
(the hand investigation on 8x RTX PRO 6000, SM120), with the evidence.

Those are predictions, not a gate: the sieve launches every backend the installed packages offer
(`availability`: autotune has a launch for it, SGLang offers its flag value, what it imports is
installed, the user did not skip it) and records what happened. `expected_failure` is the
prediction shown beside the outcome, so a FlashInfer or SGLang release that fixes a backend (or
breaks one) is seen, not assumed.
"""
from __future__ import annotations

import sys

import functools
from dataclasses import dataclass

from autotune.adapters import flashinfer_tuner, sglang_server
from autotune.contract import registry
from autotune.gpus.device import DeviceInfo
from autotune.gpus.catalog import SM120S

HOPPER_AND_UP = frozenset({90, 100, 103, 110, 120, 121})


@functools.cache
def _declared(package: str, asking: bool = True) -> tuple:
    from autotune.contract.runner import discover
    return tuple(discover(package, asking=asking))


def runners(family: str | None = None, asking: bool = True) -> list:
    """Every declared runner (of one backend family, or of all of them); `asking=False`: only those
    a module declares, none made from an installed package's list (runner.discover)."""
    names = registry.names(registry.BACKENDS) if family is None else (family,)
    return [r for f in names for r in _declared(registry.get(f).runners, asking) if r.family == f]


@dataclass
class Availability:
    backend: object      # the runner
    ok: bool             # the run launches it
    reason: str = ""     # why not
    expected: str = ""   # why its declarations expect it to fail here (a prediction, launched anyway)


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


def expected_failure(b, device: DeviceInfo) -> str | None:
    """Why the declarations expect `b` to fail on this GPU, or None: what the field showed, the SMs
    it is built for, FlashInfer's own requirement table, the CUDA minimum. Shown beside what the
    launch did; never consulted to decide whether to launch."""
    sm = device.sm
    for sms, reason in b.known_failures:
        if sm in sms:
            return f"known failure on SM{sm}: {reason}"
    if b.sms is not None and sm not in b.sms:
        return f"built for SM{', SM'.join(str(s) for s in sorted(b.sms))}; this is SM{sm}"
    if b.flashinfer is not None:
        declared = flashinfer_tuner.declares_support(*b.flashinfer, sm)
        if declared is False:
            fn, arg = b.flashinfer
            what = f"flashinfer.{fn}" + (f" backend '{arg}'" if arg else "")
            return f"{what} does not support SM{sm} (FlashInfer's own requirement table)"
    if b.min_cuda is not None:
        cuda = _cuda_version(device)
        if cuda is None or cuda < b.min_cuda:
            return (f"needs CUDA >= {b.min_cuda[0]}.{b.min_cuda[1]}, this is "
                    f"{device.versions.get('cuda') or 'unknown'}")
    return None


def sglang_offers(family: str, value: str) -> bool | None:
    """Whether the installed SGLang accepts `value` for the family's flag (None: SGLang absent, or the
    family names no list of SGLang's to ask)."""
    listed = registry.get(family).sglang_choices
    values = None if listed is None else sglang_server.choices_list(listed)
    return None if values is None else value in values


def availability(b, device: DeviceInfo, check_imports: bool = True) -> Availability:
    """Whether a run launches `b` here. Not when autotune has no launch for it, or (on the GPU, where
    packages are checked) SGLang does not offer its flag value or a package it imports is missing.
    The declarations' prediction rides along in `expected`; it does not decide."""
    if b.not_implemented:
        return Availability(b, False, f"not launched: {b.not_implemented}")
    if check_imports:
        needs = b.needs + (("flashinfer",) if "flashinfer" in b.calls else ())
        for mod in needs:
            if not _importable(mod):
                return Availability(b, False, f"needs the '{mod}' package, not installed")
        if b.sglang_value is not None and sglang_offers(b.family, b.sglang_value) is False:
            return Availability(b, False, f"the installed SGLang has no --{registry.get(b.family).flag} "
                                          f"{b.sglang_value}")
    return Availability(b, True, expected=expected_failure(b, device) or "")


def backends(family: str, asking: bool = True) -> list:
    if family not in registry.names(registry.BACKENDS):
        raise KeyError(f"unknown kernel family {family!r}; known: {', '.join(registry.names(registry.BACKENDS))}")
    return runners(family, asking)


def get(family: str, name: str):
    """The runner `name` of `family`: a module's declaration first, so SGLang is asked for its list
    only for a name no module declares."""
    for asking in (False, True):
        for b in backends(family, asking):
            if b.name == name:
                return b
    raise KeyError(f"unknown backend {name!r} for {family}; known: {', '.join(b.name for b in backends(family))}")


def plan(family: str, device: DeviceInfo, check_imports: bool = True) -> list[Availability]:
    return [availability(b, device, check_imports) for b in backends(family)]


def sglang_auto(family: str, device: DeviceInfo, deep_gemm: bool | None = None) -> str | None:
    """Our name of the backend SGLang resolves `auto` to for this family on this GPU, or None when
    it is not one we measure.
    - moe_*, fp4_gemm: asked of the installed SGLang's own resolution code
      (autotune.adapters.sglang_layer: its server-argument stage, then the quant method's; FP4 GEMM:
      fp4_utils.initialize_fp4_gemm_config), as on this GPU: the GPU itself, or, from a CPU or a
      replay, SGLang told it runs on an SM`device.sm` GPU. Answers are remembered per SGLang install.
    - fp8_gemm (restated from SGLang 0.5.23, srt/layers/quantization/fp8_utils.py): SM120 -> cutlass;
      deep_gemm when its JIT is enabled; Blackwell + FlashInfer -> flashinfer_trtllm; otherwise triton.
    """
    sm = device.sm
    if family == "fp8_gemm":
        if deep_gemm is None:
            deep_gemm = _importable("deep_gemm") if device.kind == "gpu" else False
        if sm in SM120S:
            return "cutlass"
        if deep_gemm and sm in (90, 100, 103):
            return "deep_gemm"
        return "triton" if sm < 100 else None
    if family not in registry.names(registry.BACKENDS):
        raise KeyError(f"unknown kernel family {family!r}; known: {', '.join(registry.names(registry.BACKENDS))}")
    value = sglang_auto_value(family, None if _is_this_gpu(device) else sm)
    return next((r.name for r in runners(family) if value is not None and r.sglang_value == value), None)


def _is_this_gpu(device: DeviceInfo) -> bool:
    """Whether `device` is the GPU this process runs on (then SGLang answers for itself)."""
    if device.kind != "gpu":
        return False
    import torch
    if not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor == device.sm


def sglang_auto_value(family: str, sm: int | None) -> str | None:
    """The flag value SGLang's own code resolves `auto` to (sm None: this machine's GPU); None
    where SGLang is not installed."""
    if not _importable("sglang"):
        return None
    from autotune.adapters import sglang_layer
    from autotune.adapters.sglang_loader import remembered

    def ask():
        if family == "fp4_gemm":
            return sglang_layer.resolved_fp4_gemm_backend(sm)
        spec = registry.get(family)
        if spec.problems != registry.MOE:
            return None                  # a dense family whose `auto` SGLang's code is not asked for
        from autotune.problems.models import Problem
        return sglang_layer.resolved_moe_backend(Problem(E=8, N=128, K=256, top_k=2, dtype=spec.dtype), sm)
    def ask_or_none():
        # SGLang's resolution builds its parallel groups and imports half its server: in a broken
        # environment (a missing `openai` module, say) say so, as unknown.
        try:
            return ask()
        except Exception as e:
            why = str(e).splitlines()[0] if str(e) else ""
            print(f"autotune: warning: SGLang's own `auto` resolution for {family} failed here "
                  f"({type(e).__name__}: {why}); its auto is reported as unknown", file=sys.stderr)
            return None
    if sm is None:
        return ask_or_none()
    return remembered(("auto", family, sm), ask_or_none, lambda a: isinstance(a, str))
