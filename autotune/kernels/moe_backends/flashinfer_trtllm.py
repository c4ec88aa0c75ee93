"""FlashInfer's TensorRT-LLM NVFP4 block-scale MoE, --moe-runner-backend flashinfer_trtllm: SGLang's
auto for NVFP4 experts on SM100 and (wrongly) on SM120, where its SM100 cubins crash the process."""
from ...backends import SM100S, SM120S
from ..runner import Runner

RUNNER = Runner("moe_fp4", "flashinfer_trtllm", "flashinfer_trtllm", "flashinfer.trtllm_fp4_block_scale_moe",
                sms=SM100S, tunable=True, not_implemented="its shuffled weight layout is not built yet",
                known_failures=((SM120S, "crashes the process on load on SM120: its kernels are SM100 cubins "
                                          "(hand investigation, 8x RTX PRO 6000)"),))
