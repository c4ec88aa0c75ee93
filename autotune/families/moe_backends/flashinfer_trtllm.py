"""FlashInfer's TensorRT-LLM NVFP4 block-scale MoE through SGLang's MoE block, --moe-runner-backend
flashinfer_trtllm (SGLang's auto for NVFP4 experts on SM100) and flashinfer_trtllm_routed (the same
kernels, routing done by SGLang's TopK). SGLang's quant method makes its shuffled weight layout."""
from autotune.gpus.catalog import SM100S, SM120S
from autotune.families.moe_backends import SglangMoe

_SM120 = ((SM120S, "crashes the process on load on SM120: its kernels are SM100 cubins "
                   "(hand investigation, 8x RTX PRO 6000; flashinfer 3670)"),)
RUNNERS = (
    SglangMoe("moe_fp4", "flashinfer_trtllm", "flashinfer_trtllm", "flashinfer.trtllm_fp4_block_scale_moe",
              sms=SM100S, known_failures=_SM120),
    SglangMoe("moe_fp4", "flashinfer_trtllm_routed", "flashinfer_trtllm_routed",
              "flashinfer.trtllm_fp4_block_scale_routed_moe", sms=SM100S, known_failures=_SM120),
)
