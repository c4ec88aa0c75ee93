"""FlashInfer's AutoTuner as autotune reaches it: a tactic's JSON form, the metadata its cache is
keyed on, the tuner's own reading of input sizes, its blocklist, and what FlashInfer declares of
its public calls. These live in FlashInfer's
internals (`flashinfer.autotuner.autotuner`, `flashinfer.tactics_blocklist`), so a FlashInfer release
that moves one breaks here, in one place. FlashInfer is imported on call: reading this module, on a
machine without it, costs nothing.
"""
from __future__ import annotations


def tactic_to_json(tactic):
    """A tactic as FlashInfer's cache file stores it (tuples as lists)."""
    from flashinfer.autotuner import _tactic_to_json

    return _tactic_to_json(tactic)


def json_to_tactic(value):
    """The tactic a cache file's JSON value stands for, as FlashInfer reads it back."""
    from flashinfer.autotuner import _json_to_tactic

    return _json_to_tactic(value)


def metadata_fields() -> dict:
    """What FlashInfer's cache is keyed on here (cuBLAS / cuDNN / CuTe-DSL versions, GPU), by field."""
    from flashinfer.autotuner.autotuner import _collect_metadata

    return _collect_metadata()


def tuner():
    """FlashInfer's one AutoTuner of this process (what SGLang's calls consult)."""
    from flashinfer.autotuner import AutoTuner

    return AutoTuner.get()


def input_sizes(operands: list) -> tuple:
    """The shapes FlashInfer's AutoTuner reads from a call's operands (its cache key's input part)."""
    return tuner()._get_input_sizes(operands)


def blocklist_type():
    """FlashInfer's own blocklist class (its reader and writer of FLASHINFER_TACTICS_BLOCKLIST files)."""
    from flashinfer.tactics_blocklist import TacticsBlocklist

    return TacticsBlocklist


def version() -> str:
    """The installed FlashInfer's version ("unknown" where it names none)."""
    import flashinfer

    return getattr(flashinfer, "__version__", "unknown")


def declares_support(fn_name: str, backend: str | None, sm: int) -> bool | None:
    """FlashInfer's own declaration that its public `fn_name` (with `backend`) runs on SM `sm`; None
    where FlashInfer is missing or declares nothing for the function."""
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
