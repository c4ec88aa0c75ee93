"""What GPU is this: name as SGLang writes it, compute capability, shared memory, versions."""
from __future__ import annotations

import datetime
import platform
import subprocess
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


def _driver_version() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
    except Exception:
        return ""


def detect(index: int = 0) -> DeviceInfo:
    """The local CUDA GPU. Raises NoDeviceError where there is none."""
    import torch
    if not torch.cuda.is_available():
        raise NoDeviceError("no CUDA GPU visible")
    props = torch.cuda.get_device_properties(index)
    sm = props.major * 10 + props.minor
    smem = getattr(props, "shared_memory_per_block_optin", 0) or SMEM_OPTIN.get(sm, 0)
    versions = software_versions()
    try:
        # What FlashInfer's autotuner cache is keyed on (cuBLAS / cuDNN / CuTe-DSL versions, GPU):
        # a cache we write for this machine must carry these values (autotune.adapters.flashinfer_cache).
        from flashinfer.autotuner.autotuner import _collect_metadata
        versions["flashinfer_metadata"] = _collect_metadata()
    except Exception:
        pass
    return DeviceInfo(name=torch.cuda.get_device_name(index), sm=sm, smem_optin=int(smem),
                      num_sms=props.multi_processor_count, driver=_driver_version(),
                      versions=versions, kind="gpu", gpu_count=torch.cuda.device_count())


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
