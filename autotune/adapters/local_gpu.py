"""The GPU of this machine as torch, the NVIDIA driver and FlashInfer report it: a DeviceInfo of kind
"gpu" (autotune.gpus.device holds the type and the devices a run plans for without one)."""
from __future__ import annotations

from autotune import programs
from autotune.gpus.catalog import SMEM_OPTIN
from autotune.gpus.device import DeviceInfo, NoDeviceError, software_versions


def driver_version() -> str:
    try:
        r = programs.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
    except Exception:          # no driver tools here (ProgramMissing), or they hung: the driver is not known
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
        from autotune.adapters.flashinfer_tuner import metadata_fields
        versions["flashinfer_metadata"] = metadata_fields()
    except Exception:
        pass
    return DeviceInfo(name=torch.cuda.get_device_name(index), sm=sm, smem_optin=int(smem),
                      num_sms=props.multi_processor_count, driver=driver_version(),
                      versions=versions, kind="gpu", gpu_count=torch.cuda.device_count())
