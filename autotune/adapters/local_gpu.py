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


def no_cuda_driver() -> bool:
    """Whether this machine surely has no CUDA GPU: the driver's library (libcuda, which torch's CUDA
    build loads to find GPUs and never ships) cannot be loaded, and torch is no ROCm build. Asked
    before torch is imported (2-3 s of CPU), which a machine without a GPU need not pay."""
    import ctypes
    import importlib.metadata as md

    try:
        if "rocm" in md.version("torch"):
            return False
    except md.PackageNotFoundError:
        pass
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


def triton_has_tma() -> bool:
    """Whether the Triton installed here has tensor descriptors (what SGLang's USE_TMA configs launch with),
    recorded with the device as versions["triton_tma"]."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
        return True
    except Exception:
        return False


def detect(index: int = 0) -> DeviceInfo:
    """The local CUDA GPU. Raises NoDeviceError where there is none."""
    if no_cuda_driver():
        raise NoDeviceError("no CUDA GPU visible")
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
