"""Where SGLang reads FlashInfer's autotuner cache (the file format and its keys:
autotune.adapters.flashinfer_cache).

SGLang 0.5.23 keeps FlashInfer's tuned tactics per model, parallel layout and rank in
  $SGLANG_CACHE_DIR/flashinfer/autotune/<flashinfer version>/sm<XY>/<16 hex>/rank_tp<t>_pp<p>_dp<d>.json
loads the file with `AutoTuner.load_configs` before its warm-up forward and saves it back after
(sglang/srt/model_executor/runner/flashinfer_autotune.py). A warm-up op finds an entry for each
bucket it would profile and skips its profiling.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable


def sglang_cache_path(cache_dir: str | Path | None, *, model_path: str, dtype: Any, quantization: str | None,
                      moe_runner_backend: str, tp_size: int, pp_size: int, attn_dp_size: int, moe_ep_size: int,
                      hf_config_class: str, sm: int, flashinfer_version: str | None = None,
                      skip_ops: Iterable[str] = (), draft_quantization: str | None = None,
                      tp_rank: int = 0, pp_rank: int = 0, dp_rank: int | None = 0,
                      gpu_uuid: str | None = None) -> Path:
    """Where SGLang 0.5.23 reads and writes the tactics of one rank
    (flashinfer_autotune_cache_path, flashinfer_autotune.py:164-214).

    Pass the values as the server resolves them: quantization and moe_runner_backend after
    "auto"/checkpoint resolution, dtype as the torch dtype (str() of it enters the hash),
    hf_config_class as transformers' config class name. draft_quantization only for a
    speculative draft worker's file; gpu_uuid only for the flashinfer_megamoe target file.
    cache_dir None means $SGLANG_CACHE_DIR, default ~/.cache/sglang."""
    if cache_dir is None:
        cache_dir = os.environ.get("SGLANG_CACHE_DIR", os.path.expanduser("~/.cache/sglang"))
    if flashinfer_version is None:
        from autotune.adapters.flashinfer_tuner import version
        flashinfer_version = version()
    dtype_str = str(dtype)
    if not dtype_str.startswith("torch."):   # mr.dtype is a torch.dtype: "torch.bfloat16"
        dtype_str = f"torch.{dtype_str}"
    parts = [str(model_path), dtype_str, str(quantization), str(moe_runner_backend), str(tp_size),
             str(pp_size), str(attn_dp_size), str(moe_ep_size), str(hf_config_class),
             "candidate_selection=v2_default", "skip_ops=" + ",".join(sorted(set(skip_ops)))]
    if draft_quantization is not None:
        parts.append(f"draft_quant={draft_quantization}")
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    rank = f"rank_tp{tp_rank}_pp{pp_rank}_dp{dp_rank or 0}"
    if gpu_uuid is not None:
        rank += f"_gpu{gpu_uuid}"
    # sm is major*10+minor, and SGLang writes f"sm{major}{minor}": the same digits.
    return Path(cache_dir) / "flashinfer" / "autotune" / flashinfer_version / f"sm{sm}" / key / f"{rank}.json"
