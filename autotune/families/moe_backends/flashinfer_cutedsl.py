"""FlashInfer's CuTe DSL NVFP4 MoE through SGLang's MoE block, --moe-runner-backend flashinfer_cutedsl
(SGLang's standard path: its CuteDslMoEWrapper, with the interleaved weights and MMA-layout block
scales SGLang's quant method makes)."""
from autotune.gpus.catalog import SM120S
from autotune.families.moe_backends import SglangMoe

RUNNER = SglangMoe("moe_fp4", "flashinfer_cutedsl", "flashinfer_cutedsl", "flashinfer.cute_dsl_fused_moe_nvfp4",
                   ("cute_dsl_fused_moe_nvfp4", None),
                   known_failures=((SM120S, "loads but produces NaN/garbage on SM120 (hand investigation, "
                                            "8x RTX PRO 6000)"),))
