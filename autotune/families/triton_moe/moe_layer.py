"""The fused MoE composed from SGLang's kernels with the configs each side would load: the decode harness's
MoE (autotune.validate.harness builds its step from it, where SGLang's server cannot run; on the CPU too).

Sides: `heuristic` = SGLang's default config with no file at all; `default` = what SGLang loads
from its own folder (its shipped file for this GPU, else its heuristic: a server started without
SGLANG_MOE_CONFIG_DIR); `tuned` = the tuned folder. The layer is SGLang's call sequence: block
alignment with SGLang's `moe_align_block_size`, `TritonMoe.run` (SGLang's `invoke_fused_moe_kernel`)
for gate_up, SGLang's `silu_and_mul`, `TritonMoe.run` for down with the routing weights, the sum
over top-k. It is a composition of SGLang's pieces, not SGLang's layer: the run's pick and `autotune check`
time SGLang's own MoE block instead (autotune.families.triton_moe.layer_timing).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autotune.contract.config import KernelConfig


SIDES = ("heuristic", "default", "tuned")


from autotune.families.triton_moe.layer_timing import LayerError  # noqa: E402  (one error for both layers)


@dataclass
class SideConfig:
    gate_up: KernelConfig
    down: KernelConfig
    file_found: bool
    source: str

    def __post_init__(self):      # SGLang's loader hands its entries: read as configs
        self.gate_up, self.down = KernelConfig.from_entry(self.gate_up), KernelConfig.from_entry(self.down)

    def to_dict(self) -> dict:
        """As a report records it: the two entries SGLang loads, whether a file held them, and what they are."""
        return {"gate_up": self.gate_up.to_entry(), "down": self.down.to_entry(), "file_found": self.file_found,
                "source": self.source}


class MoeSides:
    """One MoE problem on this device, with the (gate_up, down) configs of each side per M."""

    def __init__(self, problem, device, tuned_dir: str | Path, *, on_cpu: bool = False, inner_repeats: int | None = None,
                 configs: dict | None = None):
        """`configs`: (M, side) -> SideConfig given instead of read through SGLang's loader (the run's
        layer check times the pairs its selection re-measured)."""
        from autotune.adapters.sglang_loader import sglang_file_name
        from autotune.families.triton_moe import TritonMoe, compute_dtype

        self.problem, self.device, self.on_cpu = problem, device, on_cpu
        self.tuned_dir = Path(tuned_dir)
        self.fam = TritonMoe()
        why = self.fam.unsupported_reason(problem, device)
        if why:
            raise LayerError(f"the fused MoE cannot run here: {why}")
        self.dev = "cpu" if on_cpu else "cuda"
        self.dtype = compute_dtype(problem, on_cpu)
        self.inner = inner_repeats or (2 if on_cpu else 7)
        self.file_name = sglang_file_name(problem, device)
        self._sides: dict[tuple[int, str], SideConfig] = dict(configs or {})

    # -- configs ---------------------------------------------------------------------------------
    def side_config(self, M: int, side: str) -> SideConfig:
        """The (gate_up, down) configs SGLang's loader picks at M for this side."""
        from autotune.adapters.sglang_loader import sglang_selection

        key = (M, side)
        if key not in self._sides:
            cdir = {"tuned": str(self.tuned_dir), "heuristic": self._empty_dir()}.get(side)
            up, down, found = sglang_selection(self.problem, M, self.device, cdir)
            if side == "tuned":
                source = "tuned file" if found else "NO tuned file: SGLang's default heuristic"
            elif side == "heuristic":
                source = "SGLang's default heuristic (no file)"
            else:
                source = "SGLang's shipped file" if found else "SGLang's default heuristic"
            self._sides[key] = SideConfig(up, down, found, source)
        return self._sides[key]

    def _empty_dir(self) -> str:
        """A config folder SGLang lists and finds nothing in: its default heuristic config."""
        import tempfile

        if not hasattr(self, "_empty"):
            self._empty = tempfile.mkdtemp(prefix="autotune_no_configs_")
            os.makedirs(os.path.join(self._empty, "configs"))
        return self._empty

    def require_tuned_file(self) -> None:
        if not self.side_config(1, "tuned").file_found:
            raise LayerError(f"{self.tuned_dir} has no config for {self.problem.key} ({self.file_name} under "
                               f"configs/triton_*/): the tuned side would run SGLang's defaults, nothing to validate")

    # -- the layer -------------------------------------------------------------------------------
    def expert_weights(self, seed: int):
        """((w13, scale, dequantized), (w2, scale, dequantized)) of one layer's experts."""
        p = self.problem
        return (self.fam.weights(p, "gate_up", seed, self.dev, self.dtype),
                self.fam.weights(p, "down", seed, self.dev, self.dtype))

    def silu_and_mul(self, a):
        if self.on_cpu:
            import torch.nn.functional as F
            d = a.shape[-1] // 2
            return F.silu(a[..., :d]) * a[..., d:]
        from sglang.kernels.ops.activation import silu_and_mul
        return silu_and_mul(a)

    def moe(self, up_w, down_w, x, ids, w, side: str):
        """SGLang's fused MoE for one layer through the tuning runner (TritonMoe.run), in SGLang's
        order (fused_moe.py `_fused_moe_kernel_sequence`): with a plain down GEMM, gate_up writes
        token-major rows and the activation runs on all of them; with TMA on the down GEMM
        (block-FP8), gate_up writes its rows expert-sorted into a block-padded buffer (`c_sorted`),
        the activation and FP8 quantization run on the rows down reads, and down reads that buffer
        by TMA as it is (no gather)."""
        import torch

        from autotune.families.triton_moe import MoeInputs

        p, M = self.problem, x.shape[0]
        cfg = self.side_config(M, side)
        T = M * p.top_k
        down_tma = bool(cfg.down.get("USE_TMA"))
        bm = cfg.gate_up["BLOCK_SIZE_M"]
        rows = T + (min(T, p.E + 1) * (bm - 1) if down_tma else 0)      # SGLang's padded_tokens
        cache1 = torch.empty((rows, 2 * p.N), dtype=self.dtype, device=x.device)
        up = MoeInputs(p, "gate_up", M, [x], *up_w, cache1, [ids], [w], self.on_cpu)
        self.fam.run(cfg.gate_up, up, 0, c_sorted=down_tma)   # aligns with gate_up's BLOCK_SIZE_M (SGLang's op)
        cache3 = torch.empty((M, p.top_k, p.K), dtype=self.dtype, device=x.device)
        down = MoeInputs(p, "down", M, [cache1], *down_w, cache3, [ids], [w], self.on_cpu,
                         _aligned=up._aligned)     # BLOCK_SIZE_M is coupled: SGLang aligns once
        if down_tma:
            act, scale = self.sorted_activation(cache1, self.fam.aligned(up, bm, 0), T, bm)
            self.fam.run(cfg.down, down, 0, a_sorted=act, a_scale=scale)
        else:
            down.A = [self.silu_and_mul(cache1)]
            self.fam.run(cfg.down, down, 0)
        return cache3.sum(dim=1)

    def sorted_activation(self, cache1, aligned, valid: int, bm: int):
        """SiLU-and-mul (and, for a block-FP8 down GEMM whose K is not one block, its per-token-group
        quantization) of the rows the TMA down GEMM reads, as SGLang computes them with its row
        filter. On the CPU every row is computed (the rows down skips are never read)."""
        if self.on_cpu:
            return self.silu_and_mul(cache1), None
        import torch
        from sglang.kernels.ops.activation.activation import silu_and_mul

        sorted_ids, expert_ids, ntp = aligned
        out = torch.empty((cache1.shape[0], cache1.shape[1] // 2), dtype=cache1.dtype, device=cache1.device)
        silu_and_mul(cache1, out, expert_ids=expert_ids, expert_step=bm, sorted_token_ids=sorted_ids,
                     num_tokens_post_padded=ntp, num_valid_tokens=valid)
        block = self.problem.block_shape
        if block is None or out.shape[-1] == block[1]:
            return out, None            # the down call quantizes it itself (SGLang's condition)
        from sglang.kernels.ops.quantization.per_token_group_quant import per_token_group_quant

        return per_token_group_quant(out, group_size=block[1], sorted_token_ids=sorted_ids,
                                     num_tokens_post_padded=ntp, num_valid_tokens=valid)

    def check_sides(self, up_w, down_w, x, ids, w) -> dict:
        """Every side's layer against the float32 reference of the same layer (the moe_* families'
        reference): a config that computes wrong numbers fails here. Returns side -> relative error."""
        from autotune.families.moe_backends import MoeBf16, MoeFp8
        from autotune.adapters.moe_checkpoint import reference
        from autotune.families.triton_moe import TOLERANCE
        from autotune.measure.timing import check_output

        M = x.shape[0]
        ref_fam = MoeBf16 if self.problem.dtype == "bf16" else MoeFp8
        ref = reference(x, ids, w, up_w[2], down_w[2], self.problem.N)
        tol = TOLERANCE["fp32"] if self.on_cpu else ref_fam.tol
        out = {}
        for side in SIDES:
            ok, reason, err = check_output(self.moe(up_w, down_w, x, ids, w, side), ref, tol)
            if not ok:
                cfg = self.side_config(M, side)
                raise LayerError(f"{side} configs at batch {M} compute wrong results ({reason}); "
                                   f"gate_up {cfg.gate_up.to_entry()}, down {cfg.down.to_entry()} ({cfg.source})")
            out[side] = err
        return out

    def timer(self, fn):
        from autotune.measure.timing import time_cpu, time_gpu

        if self.on_cpu:
            return time_cpu(lambda i: fn(), 1, repeats=self.inner)
        return time_gpu(lambda i: fn(), 1, repeats=self.inner)
