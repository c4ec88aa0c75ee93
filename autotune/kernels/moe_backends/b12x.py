"""FlashInfer's b12x NVFP4 MoE (SM120, CUDA 13); SGLang has no --moe-runner-backend value for it."""
from ..runner import Runner

RUNNER = Runner("moe_fp4", "b12x", None, "flashinfer.b12x_fused_moe", ("b12x_fused_moe", None), min_cuda=(13, 0),
                not_implemented="its input layout is not built yet")
