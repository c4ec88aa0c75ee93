"""FlashInfer's two files for the tactics our gate checked, beside the tuned configs:

- `flashinfer_autotune_cache.json`: the winning tactic of each (shape, M) in FlashInfer's cache
  format (keys by its own key code), one file, identical for every TP rank; `autotune install`
  style placement under SGLANG_CACHE_DIR is the user's step, said in server_args.yaml.
- `flashinfer_tactics_blocklist.json`: every tactic the gate disqualified (wrong, NaN, zero,
  crashed, hung, or replaced by FlashInfer's default), in FlashInfer's blocklist format, written
  by its own `TacticsBlocklist.save`. FlashInfer applies it to fresh enumeration only, so SGLang's
  start-up tuning of shapes the cache misses cannot pick them. A blocklist has no shape in its
  key: a tactic wrong for one shape is dropped for all (it only removes options, never adds risk).

Only Ms that are FlashInfer buckets are pinned: a batch between buckets is served by its bucket's
entry, so two winners would fight over one key.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

from autotune.fileio.reading import load_json

CACHE_FILE = "flashinfer_autotune_cache.json"
BLOCKLIST_FILE = "flashinfer_tactics_blocklist.json"


def blocklist_of(family, tuners: Iterable) -> dict[str, list]:
    """"op::RunnerClass" -> the disqualified tactics (JSON form), over every problem's tuner."""
    out: dict[str, list] = {}
    for t in tuners:
        for m in t.disqualified_tactics().values():
            r = family.runner(m.config["backend"])
            keys = r.blocklist_keys(m.config["tactic"]) if hasattr(r, "blocklist_keys") else []
            for key, tactic in keys:          # FlashInfer's op and runner class, and its tactic value
                tactics = out.setdefault(key, [])
                if tactic not in tactics:
                    tactics.append(tactic)
    return {k: sorted(v, key=json.dumps) for k, v in sorted(out.items())}


def cache_entries_of(family, chosen: Iterable[tuple]) -> list:
    """FlashInfer cache entries for (problem, per-M choices) whose winner is a tactic other than
    -1 of a runner that declares its FlashInfer key, at the Ms that are FlashInfer buckets."""
    entries = []
    for problem, choices in chosen:
        for M, c in sorted(choices.items()):
            tactic = c.config.get("tactic", -1)
            if tactic == -1:
                continue
            r = family.runner(c.config["backend"])
            entries.extend(r.cache_entries(problem, M, tactic) if hasattr(r, "cache_entries") else [])
    return entries


def blocklist_metadata(gpu_name: str) -> dict:
    """Every FlashInfer metadata field "*" but the GPU: a tactic bad on this GPU model is dropped
    under any FlashInfer/CUDA version (a blocklist only narrows the search)."""
    from autotune.adapters.flashinfer_tuner import metadata_fields

    return {f: (gpu_name if f == "gpu" else "*") for f in metadata_fields()}


def write_blocklist(path: str | Path, invalid: Mapping[str, list], metadata: Mapping) -> None:
    """Write FlashInfer's blocklist at `path` with its own writer (atomic). The tactics of an
    existing file are kept: a later run adds to what an earlier one found, never drops it."""
    from autotune.adapters.flashinfer_tuner import blocklist_type

    path = Path(path)
    merged: dict[str, list] = {}
    if path.exists():
        try:
            old = load_json(path)
            old_invalid = old["invalid_tactics"]
            if not isinstance(old_invalid, dict):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"{path} is not a FlashInfer tactics blocklist; not overwritten") from None
        merged = {k: list(v) for k, v in old_invalid.items()}
    for key, tactics in invalid.items():
        have = merged.setdefault(key, [])
        have.extend(t for t in tactics if t not in have)
    # FlashInfer's own writer lays the file out; ours puts it in place (atomic, our mode, ownership)
    import tempfile

    from autotune.fileio.writing import json_with, write_bytes
    with tempfile.TemporaryDirectory() as tmp:
        blocklist_type().save(str(Path(tmp) / path.name), merged, dict(metadata))
        write_bytes(path, (Path(tmp) / path.name).read_bytes(), ours=json_with("invalid_tactics"))
