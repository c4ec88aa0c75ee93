"""What GPU is this: name as SGLang writes it, compute capability, shared memory, versions."""
from __future__ import annotations

import datetime
import platform
from dataclasses import asdict, dataclass, field

from autotune.gpus import catalog
from autotune.gpus.catalog import SMEM_OPTIN, arch_section  # noqa: F401  (arch_section: DeviceInfo.arch)


class NoDeviceError(RuntimeError):
    pass


@dataclass(frozen=True)
class DeviceInfo:
    name: str                 # torch.cuda.get_device_name(), e.g. "NVIDIA H200"
    sm: int                   # compute capability major*10+minor
    smem_optin: int           # bytes of shared memory a block may opt into
    num_sms: int = 0
    driver: str = ""
    versions: dict = field(default_factory=dict)   # torch, triton, sglang, cuda
    kind: str = "gpu"         # "gpu" | "replay" | "cpu-interpreter" | "planned"
    gpu_count: int = 1

    @property
    def file_name(self) -> str:
        """The name SGLang puts into config file names and we use as the tuned_configs folder."""
        return self.name.replace(" ", "_")

    @property
    def arch(self) -> str:
        return arch_section(self.sm)

    @property
    def is_replay(self) -> bool:
        return self.kind == "replay"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceInfo":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def software_versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "triton", "sglang", "optuna", "flashinfer"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception:
            continue
    try:
        import torch
        out["cuda"] = torch.version.cuda or ""
    except Exception:
        pass
    return out


def cpu_interpreter() -> DeviceInfo:
    """Triton's interpreter on the CPU: runs the kernels for tests, its timings mean nothing."""
    return DeviceInfo(name="CPU Triton interpreter", sm=90, smem_optin=SMEM_OPTIN[90],
                      versions=software_versions(), kind="cpu-interpreter", gpu_count=1)


def planned(sm: int) -> DeviceInfo:
    if sm not in SMEM_OPTIN:
        raise NoDeviceError(f"unknown compute capability {sm}; known: {sorted(SMEM_OPTIN)}")
    gpu = catalog.BY_SM.get(sm)
    return DeviceInfo(name=gpu.name if gpu else f"sm{sm}", sm=sm, smem_optin=SMEM_OPTIN[sm], kind="planned")


def planned_gpu(name: str) -> DeviceInfo:
    """A GPU model of the catalog a run is planned for here (nothing is measured): its name, SM, shared
    memory and SM count, the software of this machine."""
    gpu = catalog.find(name)
    if gpu is None:
        raise NoDeviceError(f"--target-device {name!r} is not a GPU autotune can plan for; known: "
                            f"{', '.join(repr(g.name) for g in catalog.CATALOG)} (or plan by architecture with "
                            "`autotune shapes --target-sm N`)")
    return DeviceInfo(name=gpu.name, sm=gpu.sm, smem_optin=gpu.smem_optin, num_sms=gpu.num_sms,
                      versions=software_versions(), kind="planned")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
