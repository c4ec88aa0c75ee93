"""FlashInfer's b12x NVFP4 MoE (SM120, CUDA 13). SGLang 0.5.23 has no --moe-runner-backend value for
it, so no server can run it; it stays declared (and listed as not run) so a release that adds the
value is one line here."""
from autotune.contract.runner import Runner

RUNNER = Runner("moe_fp4", "b12x", None, "flashinfer.b12x_fused_moe", ("b12x_fused_moe", None), min_cuda=(13, 0),
                not_implemented="SGLang 0.5.23 has no --moe-runner-backend value for it")
