"""MoE runner backends: the whole routed-expert layer, compared across the runners SGLang selects
with --moe-runner-backend. Three families (bf16, block-FP8, NVFP4 experts) share the inputs and the
reference here; one module per backend beside this one declares its runner for each family it
serves (autotune.contract.runner).

Every runner SGLang can select is launched through SGLang's own layer (autotune.adapters.sglang_layer:
Qwen3.5's TopK + FusedMoE block with the experts' quant method, loaded from checkpoint-format
shards, processed by SGLang into that backend's layouts); a runner's module holds its flag value
and what is known about where it runs, no layout code. The inputs are the checkpoint's experts
(autotune.adapters.moe_checkpoint), activations and router logits per routing set; the reference
is the float32 layer of the dequantized experts with the routing SGLang's router computes from
the same logits.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autotune.contract.backend_family import BackendFamily
from autotune.contract.registry import MOE
from autotune.contract.runner import Runner


# SGLang MoE blocks (one per backend, each with its processed copy of the experts) a worker keeps.
KEPT_BLOCKS = 2


@dataclass
class MoeLayerInputs:
    problem: object
    M: int
    x: list                 # bf16 [M, K] per routing set
    router_logits: list     # bf16 [M, E] per routing set (the router's output)
    topk_ids: list          # int32 [M, top_k]: the routing the logits give (the reference's)
    topk_weights: list      # float32 [M, top_k]
    shards: object          # moe_checkpoint.ExpertShards
    blocks: dict            # runner name -> its built SGLang block, shared by every M of the problem
    triton_config_dir: str | None = None   # where SGLang's Triton runner finds configs (a tuned folder)
    C: object = None
    cache: dict = field(default_factory=dict)


class _MoeLayerFamily(BackendFamily):
    # Declared (autotune.contract.registry): one family per expert dtype, `dtype` its Problem.dtype
    problems = MOE
    flag, sglang_choices = "moe-runner-backend", "MOE_RUNNER_BACKEND_CHOICES"
    options = ("triton_config_dir", "skip")
    tol = 0.02

    def __init__(self, triton_config_dir: str | None = None, skip: tuple = ()):
        super().__init__(skip)
        # Where the Triton runner's configs come from: a tuned folder, or SGLang's own files.
        self.triton_config_dir = triton_config_dir
        self._problem = None      # (problem key, seed) whose shards and blocks are kept
        self._shards = None
        self._blocks: dict = {}

    def tolerance(self, problem, on_cpu: bool = False) -> float:
        return self.tol

    def unsupported_reason(self, problem, device):
        if problem.dtype != self.dtype:
            return f"{self.name} serves {self.dtype} experts, not {problem.dtype}"
        return super().unsupported_reason(problem, device)

    def sglang_auto(self, device) -> str | None:
        from autotune.contract import capabilities as table
        return table.sglang_auto(self.name, device)

    # -- GPU memory (autotune.gpus.memory_plan) ---------------------------------------------------------
    def footprint(self, problem, device, routings: int = 10):
        """One worker's GPU memory for `problem`: the checkpoint's experts and the processed copies of the
        SGLang blocks it keeps (KEPT_BLOCKS), two of the largest batch's inputs and references, and the
        layer's own intermediates at that batch."""
        from autotune.adapters.moe_checkpoint import shard_bytes
        from autotune.gpus.memory_plan import FLUSH_BYTES, Footprint

        p, M = problem, max(problem.batch_sizes)
        T = M * p.top_k
        held = routings * (M * p.K * 2 + M * p.E * 2 + T * 8) + M * p.K * (2 + 4)
        layer = T * (3 * p.N + p.K) * 2
        return Footprint(f"{self.name} {p.key}", {
            "weights": shard_bytes(p) * (1 + KEPT_BLOCKS), "inputs": 2 * held,
            "workspace": FLUSH_BYTES + layer + 32 * 3 * p.N * p.K * 4 * 3})

    # -- inputs -----------------------------------------------------------------------------------
    def make_inputs(self, problem, gemm, M, *, seed=0, skew=0.0, routings=10, on_cpu=False):
        import torch

        from autotune.adapters.moe_checkpoint import make_shards, renormalized_topk

        if self._problem != (problem.key, seed):      # one problem's experts at a time
            self._shards, self._blocks = None, {}
            self._shards = make_shards(problem, seed)
            self._problem = (problem.key, seed)
        g = torch.Generator(device="cuda").manual_seed(seed * 7919 + M)
        # Router logits as the bf16 gate produces them; `skew` > 0 adds a per-expert bias of that
        # many standard deviations (hot experts). The reference routes them as SGLang's router does.
        bias = torch.randn(problem.E, generator=g, device="cuda") * skew
        logits = [(torch.randn(M, problem.E, generator=g, device="cuda") + bias).to(torch.bfloat16)
                  for _ in range(routings)]
        ids, wts = zip(*(renormalized_topk(lg, problem.top_k) for lg in logits))
        xs = [torch.randn(M, problem.K, generator=g, device="cuda").to(torch.bfloat16) for _ in range(routings)]
        return MoeLayerInputs(problem, M, xs, logits, list(ids), list(wts), self._shards, self._blocks,
                              self.triton_config_dir)

    def reference(self, inputs: MoeLayerInputs, config=None):
        from autotune.adapters.moe_checkpoint import reference

        s = inputs.shards
        return reference(inputs.x[0], inputs.topk_ids[0], inputs.topk_weights[0], s.dequant13, s.dequant2, s.N)


class MoeBf16(_MoeLayerFamily):
    name, dtype, order = "moe_bf16", "bf16", 10
    tol = 0.02


class MoeFp8(_MoeLayerFamily):
    """Block [128, 128] FP8 experts (Qwen3.5 FP8 checkpoints); activations quantized per token
    group of 128 inside each runner."""

    name, dtype, order = "moe_fp8", "fp8_w8a8_block", 11
    tol = 0.08


class MoeFp4(_MoeLayerFamily):
    """NVFP4 experts (Qwen3.5 NVFP4 checkpoints, ModelOpt format). Runners that quantize the
    activations (W4A4) land at ~10% from the unquantized reference, W4A16 ones (marlin) far below;
    a broken runner at ~100%."""

    name, dtype, order = "moe_fp4", "nvfp4", 12
    tol = 0.3


FAMILIES = (MoeBf16, MoeFp8, MoeFp4)


@dataclass(frozen=True)
class SglangMoe(Runner):
    """A --moe-runner-backend value, launched through SGLang's own MoE block. The block is built
    (and SGLang's refusals raised) on the first launch of a problem and kept for its other Ms."""

    def block(self, inputs: MoeLayerInputs):
        from autotune.adapters.sglang_layer import MoeBlock, Refused, refusals

        if self.name not in inputs.blocks:
            # Each block holds its own processed copy of the experts: a worker keeps the last few only
            # (a task runs one backend at every M, so the next one rarely needs an older block again).
            while len(inputs.blocks) >= KEPT_BLOCKS:
                del inputs.blocks[next(iter(inputs.blocks))]
            with refusals(f"SGLang's {self.sglang_value} MoE runner"):
                block = MoeBlock(inputs.problem, self.sglang_value, device=inputs.shards.device).load(inputs.shards)
            if block.runner_backend != self.sglang_value:
                raise Refused(f"SGLang serves --moe-runner-backend {self.sglang_value} with "
                              f"{block.runner_backend} for {inputs.problem.dtype} experts")
            inputs.blocks[self.name] = block
        return inputs.blocks[self.name]

    def run(self, inputs: MoeLayerInputs, routing: int, tactic=-1):
        from autotune.adapters.sglang_layer import refusals, use_triton_configs

        use_triton_configs(inputs.triton_config_dir)
        block = self.block(inputs)
        with refusals(f"SGLang's {self.sglang_value} MoE runner"), self.pinned(inputs, tactic):
            inputs.C = block(inputs.x[routing], inputs.router_logits[routing])
        return inputs.C

    def pinned(self, inputs, tactic):
        """Where the tactic goes (runners with tactics: FlashInfer's cache, as the server reads it)."""
        import contextlib
        return contextlib.nullcontext()
