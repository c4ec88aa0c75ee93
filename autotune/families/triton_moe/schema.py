"""What one of SGLang's fused-MoE config files holds, as every command that reads one checks it (export's
merge, `check`, `publish`, the shipped overlay): its schema, and SGLang's own loader on it.

The schema: keys are batch sizes (positive integers, as text); each value has BLOCK_SIZE_M/N/K
(positive powers of two), GROUP_SIZE_M, num_warps (a power of two) and num_stages (positive
integers), and optionally USE_TMA (true/false); nothing else (SGLang passes every key to its kernel).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotune.contract.config import KernelConfig

# SGLang's key order in its files, and the key SGLang reads as false where a file leaves it out
CONFIG_ORDER = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages", "USE_TMA")
SWITCHES = ("USE_TMA",)


class TritonConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    BLOCK_SIZE_M: int = Field(gt=0)
    BLOCK_SIZE_N: int = Field(gt=0)
    BLOCK_SIZE_K: int = Field(gt=0)
    GROUP_SIZE_M: int = Field(gt=0)
    num_warps: Optional[int] = Field(default=None, gt=0)     # Triton's defaults where absent: only
    num_stages: Optional[int] = Field(default=None, gt=0)    # SGLang's own shipped files leave them out
    USE_TMA: Optional[bool] = None

    @field_validator("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps")
    @classmethod
    def _power_of_two(cls, v):
        if v is not None and v & (v - 1):
            raise ValueError(f"{v} is not a power of two")
        return v


def launch_defaults() -> dict:
    """What Triton launches with where a config names no num_warps or num_stages: its CUDA backend's own
    option defaults (read from the installed Triton, not restated)."""
    import dataclasses

    from triton.backends.nvidia.compiler import CUDAOptions

    return {f.name: f.default for f in dataclasses.fields(CUDAOptions) if f.name in ("num_warps", "num_stages")}


def entry_config(entry: dict) -> KernelConfig:
    """The config a file's entry (or a record's) launches: num_warps and num_stages where it leaves one out are
    the values Triton launches it with anyway (the same kernel). Its `to_entry()` states them, in the files' key
    order: what every file written holds."""
    return KernelConfig.from_entry(entry, launch_defaults())


def schema_problem(doc, sglangs_own=lambda M, config: True) -> str | None:
    """Why `doc` (a parsed config file) is not one SGLang's loader and kernel take; None when it is.
    An entry without num_warps or num_stages must be one of SGLang's own configs at that M (its
    default heuristic and its shipped files leave them to Triton): `sglangs_own(M, config)`."""
    if not isinstance(doc, dict) or not doc:
        return "not a JSON object of batch size -> config"
    for key, config in doc.items():
        if not (key.isdigit() and int(key) > 0 and str(int(key)) == key):
            return f"key {key!r} is not a batch size (SGLang's loader reads every key as an integer)"
        try:
            c = TritonConfig.model_validate(config)
            if (c.num_warps is None or c.num_stages is None) and not sglangs_own(int(key), config):
                return f"M={key}: no {'num_warps' if c.num_warps is None else 'num_stages'} (every tuned config names both)"
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(map(str, err["loc"])) or "its config"
            return f"M={key}: {where}: {err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r:.60})"
    return None


def _problem_and_device(entry: dict):
    from autotune.gpus.device import DeviceInfo
    from autotune.problems.models import ModelError, Problem, problem_from_dict

    try:
        problem = problem_from_dict(entry.get("problem"))
    except ModelError:
        return None, None
    from autotune.gpus.catalog import SMEM_OPTIN
    sm = entry.get("compute_capability") if type(entry.get("compute_capability")) is int else 90
    device = DeviceInfo.from_dict({"name": str(entry.get("device")), "sm": sm, "smem_optin": SMEM_OPTIN.get(sm, 0),
                                   "versions": {"triton": str(entry.get("triton"))}})
    return (problem, device) if isinstance(problem, Problem) else (None, None)


def _plain(written: dict) -> dict:
    """A file's entry as SGLang reads it: a switch that is off is the same as none."""
    return {k: v for k, v in written.items() if not (k in SWITCHES and not v)}


def sglangs_own(entry: dict, M: int, written: dict, name: str) -> bool:
    """Is `written` (a file's entry at M) what SGLang itself runs at M for the file's problem (its shipped file,
    else its default heuristic)? Those may leave num_warps and num_stages to Triton; a tuned config may not."""
    from autotune.adapters.sglang_loader import sglang_default_config, sglang_selection

    problem, device = _problem_and_device(entry)
    if problem is None:
        return False
    up, down, _ = sglang_selection(problem, M, device)
    own = (down if name == entry.get("down_file") else up, sglang_default_config(problem, M, device))
    return any(_plain(c) == _plain(written) for c in own)


def sglang_loads(entry: dict, path: Path, doc: dict) -> str | None:
    """SGLang's own loader on the folder, for the file's problem at its first batch size: it must
    find the file and pick the config the file holds there."""
    from autotune.adapters.sglang_loader import sglang_selection

    problem, device = _problem_and_device(entry)
    if problem is None:
        return None if isinstance(entry.get("problem"), dict) and entry["problem"].get("kind") == "gemm" else \
            "its provenance entry has no readable problem"
    M = min(int(k) for k in doc)
    try:
        up, _, found = sglang_selection(problem, M, device, str(path.parent.parent.parent))
    except Exception as e:        # whatever SGLang's loader raises is what a server would hit
        return f"SGLang's loader fails on it ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    if not found:
        return "SGLang's loader does not find it for its problem (file name, device or Triton folder)"
    want = _plain(doc[str(M)])
    if _plain(up) != want:
        return f"SGLang's loader picks {up} at M={M}, not the file's {want}"
    return None
