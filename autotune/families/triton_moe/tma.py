"""Whether SGLang's TMA paths (USE_TMA configs) run: asked by the family's rules, its export and the shipped
overlay. A module of its own: the family's package reaches the export through its hooks, so the export
cannot import the package."""
from __future__ import annotations

from autotune.gpus.device import DeviceInfo


def tma_capable(device: DeviceInfo) -> bool:
    """Whether SGLang's TMA paths run on `device`: SM90 or later, a GPU (not Triton's interpreter), and
    a Triton with tensor descriptors there (recorded as versions["triton_tma"])."""
    return device.sm >= 90 and device.kind != "cpu-interpreter" and bool(device.versions.get("triton_tma", True))
