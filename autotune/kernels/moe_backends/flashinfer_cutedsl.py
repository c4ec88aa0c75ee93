"""FlashInfer's CuTe DSL NVFP4 MoE, --moe-runner-backend flashinfer_cutedsl."""
from ...backends import SM120S
from ..runner import Runner

RUNNER = Runner("moe_fp4", "flashinfer_cutedsl", "flashinfer_cutedsl", "flashinfer.cute_dsl_fused_moe_nvfp4",
                ("cute_dsl_fused_moe_nvfp4", None), not_implemented="its input layout is not built yet",
                known_failures=((SM120S, "loads but produces NaN/garbage on SM120 (hand investigation, "
                                         "8x RTX PRO 6000)"),))
