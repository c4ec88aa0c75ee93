"""FlashInfer's autotuner cache: its keys, bucketing and file format, as the installed FlashInfer
builds them (its own `ProfilingCacheKey`, `_find_nearest_profile`, tuning configs, metadata fields).

The runners declare the entries a tactic pins (`Runner.cache_entries`), a measurement pins them
through this file format (`runner.flashinfer_pin`: loaded with FlashInfer's `AutoTuner.load_configs`,
as SGLang loads ours), and the export writes the winners with it (autotune.export.tactics; where
SGLang reads the file: autotune.export.flashinfer). The file is FlashInfer's `save_configs` format:
  {"_metadata": {...}, ["_records": {...},] "<file_key>": [runner, tactic(, policy)], ..., "_generation": sha}
Keys and bucketing are built with the installed FlashInfer's own code, so the FlashInfer here
must be the version the GPU machine runs (`metadata_for` checks it).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from autotune.fileio.writing import json_with, write_atomic
from autotune.fileio.reading import load_json


def _autotuner():
    """FlashInfer's autotuner module (imported on first use: with torch, 3-4 s of CPU, which reading
    and writing a cache file of the same environment need not pay: `file_keys`)."""
    import flashinfer.autotuner.autotuner as at

    return at


def file_keys() -> dict[str, str]:
    """FlashInfer's names of its cache file's own keys ("metadata", "records", "generation") and its
    version ("version"), as the installed FlashInfer gives them; remembered per FlashInfer release with
    SGLang's loader answers (autotune.adapters.sglang_loader.remembered), so a command that only reads
    or writes such a file (`autotune install`) imports no FlashInfer once they were asked."""
    import importlib.metadata as md

    from autotune.adapters.sglang_loader import remembered

    def ask():
        import flashinfer

        at = _autotuner()
        return {"metadata": at._METADATA_KEY, "records": at._NAMESPACED_RECORDS_KEY,
                "generation": at._CACHE_GENERATION_KEY, "version": getattr(flashinfer, "__version__", "unknown")}
    try:
        release = md.version("flashinfer-python")
    except md.PackageNotFoundError:
        release = None
    return remembered(("flashinfer_file_keys", release), ask,
                      lambda a: isinstance(a, dict) and all(isinstance(a.get(k), str)
                                                            for k in ("metadata", "records", "generation", "version")))


def CACHE_OURS(path: Path) -> bool:
    """Ours to merge into: a JSON object in FlashInfer's cache format (what it writes, or we did)."""
    return json_with(file_keys()["metadata"])(path)


Shapes = tuple[tuple[int, ...], ...]

# FlashInfer's custom_op names of the ops SGLang tunes (the first argument of choose_one).
MM_FP4 = "fp4_gemm"                                        # mm_fp4: Cutlass/Cudnn/TrtllmGemm runners
BMM_FP8 = "fp8_gemm"                                       # bmm_fp8 (and fp8 mm on SM100)
CUTLASS_MOE_GEMM1 = "trtllm::fused_moe::gemm1"             # cutlass_fused_moe, two tuned stages
CUTLASS_MOE_GEMM2 = "trtllm::fused_moe::gemm2"
TRTLLM_FP4_MOE = "flashinfer::trtllm_fp4_block_scale_moe"

# DeviceInfo.versions spells two of FlashInfer's metadata fields differently.
_ALIASES = {"flashinfer": "flashinfer_version", "cuda": "cuda_version"}


@dataclass(frozen=True)
class CacheEntry:
    """One tuned (op, runner, bucketed shapes, extras) -> tactic record of FlashInfer's file."""

    custom_op: str
    runner: str                     # runner class name; FlashInfer serves it only to that class
    profile: Shapes                 # input shapes after FlashInfer's bucketing (-1 = constrained dim)
    tactic: Any                     # runner-specific: int, or nested tuples (cuDNN, trtllm MoE)
    extras: tuple = ()              # runner.get_cache_key_extras(inputs), part of the key
    policy: tuple | None = None     # measurement provenance; tuning-mode lookups require a match

    def __post_init__(self) -> None:
        # load_configs silently drops cuDNN entries with integer plan indices (autotuner.py:3793-3799).
        if self.runner.startswith("Cudnn") and isinstance(self.tactic, int) and self.tactic >= 0:
            raise ValueError(f"{self.runner}: cuDNN tactics are (engine_id, ((knob, value), ...)), "
                             f"not plan index {self.tactic}; FlashInfer would ignore this entry")

    @classmethod
    def from_call(cls, custom_op: str, runner: str, input_shapes: Iterable[Sequence[int]],
                  tuning_config: TuningConfig, tactic: Any, extras: tuple = ()) -> "CacheEntry":
        """The entry FlashInfer would store for a call with these input shapes: the shapes go
        through its bucket mapping, the policy is what a warm-up under this config requests."""
        shapes = tuple(tuple(int(d) for d in s) for s in input_shapes)
        tuner = _autotuner().AutoTuner
        return cls(custom_op, runner, tuner._find_nearest_profile(shapes, tuning_config), tactic,
                   tuple(extras), tuner._profiling_policy(tuning_config))

    @classmethod
    def from_key(cls, key: ProfilingCacheKey, tactic: Any, policy: tuple | None = None) -> "CacheEntry":
        """From a key FlashInfer built on the GPU (AutoTuner._get_cache_key / profiling_cache)."""
        return cls(key.custom_op, key.runner_class_name, key.nearest_profile, tactic, key.extras, policy)

    @property
    def file_key(self) -> str:
        # FlashInfer's own key: runner_hash is not part of file_key, so any value does.
        return _autotuner().ProfilingCacheKey(self.custom_op, self.runner, 0, self.profile, self.extras).file_key

    @property
    def value(self) -> list:
        value = [self.runner, _autotuner()._tactic_to_json(self.tactic)]
        if self.policy is not None:
            value.append(list(self.policy))
        return value


def profiled_shapes(tuning_config: TuningConfig, input_shapes: Iterable[Sequence[int]]) -> list[Shapes]:
    """Opt shapes FlashInfer profiles during a tuning-mode call with these inputs, one per bucket.
    A warm-up call skips profiling only where the file holds an entry for each of them."""
    import torch

    # Meta tensors carry shapes only; a non-tensor input and a (0,)-shaped tensor profile alike.
    inputs = [torch.empty(tuple(s), device="meta") for s in input_shapes]
    profiles = _autotuner().AutoTuner.get()._generate_optimization_profiles(tuning_config, inputs)
    return [p.get_opt_shapes() for p in profiles]


def tuning_config_for(custom_op: str, *, tune_max_num_tokens: int = 8192, use_8x4_sf_layout: bool = False,
                      input_shapes: Sequence[Sequence[int]] | None = None, hidden_size: int | None = None,
                      num_experts: int | None = None) -> TuningConfig:
    """The TuningConfig FlashInfer passes to choose_one for `custom_op` (it decides bucketing and
    policy). trtllm_fp4_block_scale_moe needs its 8 input shapes ((0,) for None), hidden_size and
    num_experts, because FlashInfer derives its config from the tensors present."""
    if custom_op == MM_FP4:
        from flashinfer.gemm import gemm_base as gb
        return gb._MM_FP4_TUNING_CONFIG_8x4 if use_8x4_sf_layout else gb._MM_FP4_TUNING_CONFIG_128x4
    if custom_op == BMM_FP8:
        from flashinfer.gemm import gemm_base as gb
        return gb._FP8_GEMM_SM100_TUNING_CONFIG
    if custom_op in (CUTLASS_MOE_GEMM1, CUTLASS_MOE_GEMM2):
        # MoERunner.refine_tuning_config (fused_moe/core.py) only exists once the JIT module is
        # built; this is the same config from the same FlashInfer helpers.
        from flashinfer.autotuner import DynamicTensorSpec, TuningConfig
        from flashinfer.fused_moe.utils import get_hybrid_num_tokens_buckets, make_hybrid_bucket_mapper
        return TuningConfig(dynamic_tensor_specs=(DynamicTensorSpec(
            (0,), (0,), get_hybrid_num_tokens_buckets(tune_max_num_tokens),
            make_hybrid_bucket_mapper(tune_max_num_tokens)),))
    if custom_op == TRTLLM_FP4_MOE:
        if input_shapes is None or hidden_size is None or num_experts is None:
            raise ValueError(f"{custom_op} needs input_shapes, hidden_size and num_experts")
        from flashinfer.fused_moe.shared.inputs import MoeRunnerInputs
        from flashinfer.fused_moe.shared.tuning import make_moe_tuning_config
        from flashinfer.tllm_enums import Fp8QuantizationType
        import torch
        tensors = [None if tuple(s) == (0,) else torch.empty(tuple(s), device="meta") for s in input_shapes]
        # Initializers do not enter the key, so none are passed (the real one reads topk_ids).
        return make_moe_tuning_config(
            MoeRunnerInputs.from_list(tensors), num_experts=num_experts, hidden_size=hidden_size,
            fp8_quantization_type=Fp8QuantizationType.NoneFp8, init_packed_topk_ids=None,
            tune_max_num_tokens=tune_max_num_tokens, use_cold_l2_cache=True, use_cuda_graph=True)
    raise ValueError(f"no tuning config known for FlashInfer op {custom_op!r}")


def metadata_for(device_versions: Mapping[str, Any], *, wildcard: Iterable[str] = ()) -> dict[str, str]:
    """`_metadata` for the GPU machine's environment, from versions recorded there (best:
    flashinfer.autotuner._collect_metadata() run on that machine; "flashinfer"/"cuda" are accepted
    for flashinfer_version/cuda_version). Fields in `wildcard` become "*", which any environment
    accepts. load_configs ignores the whole file when a field differs or is missing."""
    fields = list(_autotuner()._collect_metadata())   # the fields this FlashInfer compares
    given = {_ALIASES.get(k, k): v for k, v in device_versions.items()}
    wild = set(wildcard)
    unknown = wild - set(fields)
    if unknown:
        raise ValueError(f"FlashInfer has no metadata field(s) {sorted(unknown)}; fields: {fields}")
    missing = [f for f in fields if f not in wild and given.get(f) is None]
    if missing:
        raise ValueError(f"versions of the target machine lack {missing}; record "
                         "flashinfer.autotuner._collect_metadata() on the GPU machine")
    # Values are compared as strings (cudnn_version is "92400", not 92400).
    meta = {f: "*" if f in wild else str(given[f]) for f in fields}
    import flashinfer
    if meta["flashinfer_version"] not in ("*", flashinfer.__version__):
        raise ValueError(f"target runs FlashInfer {meta['flashinfer_version']}, keys here would be built by "
                         f"FlashInfer {flashinfer.__version__}; install the target's version")
    return meta


class ForeignCache(ValueError):
    """An existing cache file of another FlashInfer/CUDA environment: never overwritten."""

    def __init__(self, path, details: str):
        super().__init__(f"{path} belongs to a different environment ({details}); not overwritten")
        self.path, self.details = path, details


def read_cache(path: str | Path) -> tuple[dict | None, dict, dict] | None:
    """(metadata, records, entries) of a FlashInfer cache file, None where there is none; ValueError
    where the file is not one."""
    try:
        disk = load_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); not overwritten") from None
    if not isinstance(disk, dict):
        raise ValueError(f"{path} is not a FlashInfer cache (not a JSON object); not overwritten")
    keys = file_keys()
    meta = disk.pop(keys["metadata"], None)
    disk.pop(keys["generation"], None)
    records = disk.pop(keys["records"], {})
    return meta, (records if isinstance(records, dict) else {}), disk


def kept_entries(path: str | Path, metadata: Mapping[str, Any]) -> tuple[dict, dict, dict | None]:
    """(entries, records, metadata) of an existing file that a write for `metadata` keeps: nothing
    where there is no file or its metadata is indeterminate ("unknown" or missing fields: FlashInfer
    heals such a file by replacing it); ForeignCache where it belongs to another environment."""
    got = read_cache(path)
    if got is None:
        return {}, {}, None
    disk_meta, records, entries = got
    if disk_meta is None:
        return entries, records, None
    at = _autotuner()
    hard, soft = at._classify_metadata_mismatches(disk_meta, dict(metadata))
    if hard:
        raise ForeignCache(path, at._format_meta_mismatches(hard))
    return ({}, {}, None) if soft else (entries, records, disk_meta)


def write_cache(path: str | Path, entries: Iterable[CacheEntry], metadata: Mapping[str, Any]) -> None:
    """Write `entries` to FlashInfer cache file `path`, atomically, as save_configs would.

    An existing file of the same environment is merged (its other entries and records are kept,
    ours win on equal keys, its metadata stays). One whose metadata is indeterminate is replaced,
    as FlashInfer heals it. One of a different environment, or one that is not a JSON object,
    raises ValueError and is left as it is."""
    kept, records, disk_meta = kept_entries(path, metadata)
    configs = {**kept, **{e.file_key: e.value for e in entries}}
    write_atomic(Path(path), render(disk_meta or dict(metadata), records, configs), ours=CACHE_OURS)


def render(meta: Mapping, records: Mapping, configs: Mapping) -> str:
    """save_configs' layout: metadata, records, sorted entries, then the generation hash."""
    keys = file_keys()
    ordered: dict[str, Any] = {keys["metadata"]: dict(meta)}
    if records:
        ordered[keys["records"]] = dict(records)
    for key in sorted(configs):
        ordered[key] = configs[key]
    # Same hash as save_configs; SGLang's namespaced-record writers compare it to detect races.
    source = json.dumps(ordered, sort_keys=True, separators=(",", ":")).encode()
    ordered[keys["generation"]] = hashlib.sha256(source).hexdigest()
    return json.dumps(ordered, indent=2)
