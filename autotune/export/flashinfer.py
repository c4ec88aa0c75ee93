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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable


@dataclass(frozen=True)
class Parallel:
    """A server's parallel layout: --tp, --pp, attention data parallel and MoE expert parallel sizes."""
    tp: int
    pp: int = 1
    attn_dp: int = 1
    ep: int = 1


@dataclass(frozen=True)
class ServerKey:
    """The values SGLang hashes into the name of a server's cache folder, as the server resolves them:
    quantization and moe_runner_backend after "auto"/checkpoint resolution, dtype as the torch dtype
    (str() of it enters the hash), hf_config_class as transformers' config class name;
    draft_quantization only for a speculative draft worker's file."""
    model_path: str
    dtype: Any
    quantization: str | None
    moe_runner_backend: str
    hf_config_class: str
    parallel: Parallel
    skip_ops: Iterable[str] = ()
    draft_quantization: str | None = None

    def folder(self) -> str:
        """The 16 hex digits naming the folder (flashinfer_autotune_cache_path's hash)."""
        dtype = str(self.dtype)
        if not dtype.startswith("torch."):   # mr.dtype is a torch.dtype: "torch.bfloat16"
            dtype = f"torch.{dtype}"
        par = self.parallel
        parts = [str(self.model_path), dtype, str(self.quantization), str(self.moe_runner_backend), str(par.tp),
                 str(par.pp), str(par.attn_dp), str(par.ep), str(self.hf_config_class),
                 "candidate_selection=v2_default", "skip_ops=" + ",".join(sorted(set(self.skip_ops)))]
        if self.draft_quantization is not None:
            parts.append(f"draft_quant={self.draft_quantization}")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Rank:
    """One rank's place in the server, which names its file; gpu_uuid only for the
    flashinfer_megamoe target file."""
    tp: int = 0
    pp: int = 0
    dp: int | None = 0
    gpu_uuid: str | None = None

    def file_name(self) -> str:
        name = f"rank_tp{self.tp}_pp{self.pp}_dp{self.dp or 0}"
        if self.gpu_uuid is not None:
            name += f"_gpu{self.gpu_uuid}"
        return f"{name}.json"


def sglang_cache_path(cache_dir: str | Path | None, server: ServerKey, rank: Rank = Rank(), *, sm: int,
                      flashinfer_version: str | None = None) -> Path:
    """Where SGLang 0.5.23 reads and writes the tactics of one rank
    (flashinfer_autotune_cache_path, flashinfer_autotune.py:164-214). cache_dir None means
    $SGLANG_CACHE_DIR, default ~/.cache/sglang; flashinfer_version None the installed one."""
    if cache_dir is None:
        cache_dir = os.environ.get("SGLANG_CACHE_DIR", os.path.expanduser("~/.cache/sglang"))
    if flashinfer_version is None:
        from autotune.adapters.flashinfer_cache import file_keys
        flashinfer_version = file_keys()["version"]
    # sm is major*10+minor, and SGLang writes f"sm{major}{minor}": the same digits.
    return (Path(cache_dir) / "flashinfer" / "autotune" / flashinfer_version / f"sm{sm}" / server.folder()
            / rank.file_name())
