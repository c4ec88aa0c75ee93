"""The header of a measurement cache (a recording's first line), read by one schema: it becomes the
device a replay runs as (DeviceInfo), whose name and Triton version name the files the run writes
(`device_name=NAME` in SGLang's file names, `configs/triton_<version>/`), and the problems it was
recorded for. What a replay needs is required and typed (no default where a guess would write a
folder SGLang cannot read: a recording without a Triton version wrote `configs/triton_unknown/`);
what it does not read (torch, CUDA, FlashInfer's metadata) is kept as written.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from autotune.fileio.names import DeviceName, TritonVersion

KINDS = ("gpu", "replay", "cpu-interpreter", "planned")      # device.DeviceInfo.kind


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class RecordedVersions(_Strict):
    triton: TritonVersion                   # the configs/triton_<version>/ folder SGLang reads
    triton_tma: bool = True                 # whether that Triton had tensor descriptors (TMA configs)


class RecordedDevice(_Strict):
    name: DeviceName
    sm: int = Field(gt=0, lt=1000)                     # compute capability, major*10+minor
    smem_optin: int = Field(gt=0, le=1 << 24)          # bytes of shared memory a block may opt into
    num_sms: int = Field(default=0, ge=0, le=1 << 16)
    driver: str = Field(default="", max_length=80, pattern=r"^[ -~]*$")    # printable ASCII
    versions: RecordedVersions
    kind: Literal[KINDS] = "gpu"
    gpu_count: int = Field(default=1, ge=1, le=1 << 10)


class RecordedNotes(_Strict):
    # absent where the recorder did not say (a replay then assumes 15); never null, which read as a number
    compile_workers: int = Field(default=None, ge=1, le=1 << 12)


def _problems(problems: dict) -> dict:
    """Each recorded problem readable as the problem its key names (a replay looks problems up by key)."""
    from autotune.problems.models import ModelError, problem_from_dict

    for key, p in problems.items():
        try:
            problem = problem_from_dict(p)
        except ModelError as e:
            raise ValueError(f"problem {key!r:.60}: {e}") from None
        if problem.key != key:
            raise ValueError(f"problem {key!r:.60} holds the problem {problem.key!r:.60}")
    return problems


class CacheHeader(_Strict):
    kind: Literal["autotune-measurement-cache"]
    version: Literal[1]
    device: RecordedDevice
    problems: Annotated[dict[str, dict], AfterValidator(_problems)] = {}
    notes: RecordedNotes = RecordedNotes()
