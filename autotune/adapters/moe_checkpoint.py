"""A problem's routed experts as a checkpoint holds them, for SGLang's layers to load.

Per expert, the three shards of a Qwen3.5 checkpoint: w1 (gate) [N, K], w3 (up) [N, K] and
w2 (down) [K, N], in the storage format of the experts' dtype, under the parameter names SGLang's
quant method registers (its weight_loader puts each where its layout wants it):
- bf16: `weight`;
- block FP8 (Qwen3.5 FP8 checkpoints, [128, 128]): float8_e4m3fn `weight` and one float32
  `weight_scale_inv` per 128 x 128 tile;
- NVFP4 (ModelOpt, Qwen3.5 NVFP4 checkpoints): e2m1 `weight` packed two per byte, e4m3
  `weight_scale` per 16 along K in plain row-major order, `weight_scale_2` (1 / the global scale,
  shared by gate and up as ModelOpt writes it) and a static activation `input_scale`.
The float32 dequantization of each expert is the reference's weights (what the kernels see).
Weights are random normal / sqrt(fan-in), generated on `device` in chunks of experts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

E2M1_MAX, E4M3_MAX = 6.0, 448.0
# NVFP4 static activation scales (ModelOpt calibrates amax / (448 * 6)): the amax each covers.
# Layer inputs are unit normal (amax ~5.6 over the largest batch); the SiLU-and-mul intermediate
# of unit-variance projections stays under ~30.
NVFP4_INPUT_AMAX = {"w13": 8.0, "w2": 32.0}
CHUNK = 32          # experts generated at a time (bounds the float32 temporaries)


@dataclass
class ExpertShards:
    dtype: str
    E: int
    N: int
    K: int
    # shard -> name suffix -> tensor with a leading expert dim; "w1", "w3", "w2"
    tensors: dict = field(default_factory=dict)
    block_shape: tuple | None = None

    @property
    def device(self):
        return self.tensors["w2"]["weight"].device

    # -- loading ---------------------------------------------------------------------------------
    def load(self, layer) -> None:
        """Every shard through SGLang's FusedMoE.weight_loader, as its model loader calls it."""
        for e in range(self.E):
            for shard, parts in self.tensors.items():
                prefix = "w2" if shard == "w2" else "w13"
                for suffix, t in parts.items():
                    name = f"{prefix}_{suffix}"
                    layer.weight_loader(getattr(layer, name), t[e], name, shard_id=shard, expert_id=e)

    # -- the reference's weights -----------------------------------------------------------------
    def dequant13(self, e: int):
        """float32 [2N, K] of expert e, gate rows first (SGLang's w13 order)."""
        import torch
        return torch.cat([self._dequant("w1", e), self._dequant("w3", e)])

    def dequant2(self, e: int):
        """float32 [K, N] of expert e."""
        return self._dequant("w2", e)

    def _dequant(self, shard: str, e: int):
        import torch

        from autotune.numerics import nvfp4

        t = self.tensors[shard]
        rows, cols = (self.K, self.N) if shard == "w2" else (self.N, self.K)
        if self.dtype == "bf16":
            return t["weight"][e].float()
        if self.dtype == "fp8_w8a8_block":
            bn, bk = self.block_shape
            s = t["weight_scale_inv"][e].repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:rows, :cols]
            return t["weight"][e].float() * s
        if self.dtype == "nvfp4":
            gs = 1.0 / t["weight_scale_2"][e]
            return nvfp4.dequantize(t["weight"][e], t["weight_scale"][e], gs, rows, cols, swizzled=False)
        raise ValueError(self.dtype)


# Bytes per weight element in each dtype's checkpoint format, scales included (block FP8: one float32 per
# 128 x 128; NVFP4: e2m1 two a byte and one e4m3 scale per 16).
STORED_BYTES = {"bf16": 2.0, "fp8_w8a8_block": 1.0 + 4 / (128 * 128), "nvfp4": 0.5 + 1 / 16}


def shard_bytes(problem) -> int:
    """The GPU memory of a problem's experts as the checkpoint holds them (w1, w3, w2 of every expert)."""
    return int(problem.E * 3 * problem.N * problem.K * STORED_BYTES[problem.dtype])


def make_shards(problem, seed: int = 0, device: str = "cuda") -> ExpertShards:
    """Random experts of `problem` (E, N, K at one rank) in the checkpoint format of its dtype."""
    import torch

    E, N, K = problem.E, problem.N, problem.K
    out = ExpertShards(problem.dtype, E, N, K, block_shape=tuple(problem.block_shape) if problem.block_shape else None)
    g = torch.Generator(device=device).manual_seed(seed * 104729 + 17)
    parts: dict = {s: {} for s in ("w1", "w3", "w2")}
    for e0 in range(0, E, CHUNK):
        n = min(CHUNK, E - e0)
        w13 = torch.randn((n, 2 * N, K), generator=g, device=device) / K ** 0.5
        w2 = torch.randn((n, K, N), generator=g, device=device) / N ** 0.5
        for shard, w in _stored(problem, w13, w2).items():
            for suffix, t in w.items():
                parts[shard].setdefault(suffix, []).append(t)
        del w13, w2
    out.tensors = {s: {k: torch.cat(v) for k, v in p.items()} for s, p in parts.items()}
    return out


def _stored(problem, w13, w2) -> dict:
    """shard -> {suffix: tensor} of a chunk of experts, in the dtype's checkpoint format."""
    import torch

    N = problem.N
    raw = {"w1": w13[:, :N], "w3": w13[:, N:], "w2": w2}
    if problem.dtype == "bf16":
        return {s: {"weight": w.to(torch.bfloat16).contiguous()} for s, w in raw.items()}
    if problem.dtype == "fp8_w8a8_block":
        from autotune.numerics.fp8 import fp8_blocks
        out = {}
        for s, w in raw.items():
            q, scale = fp8_blocks(w.contiguous(), problem.block_shape)
            out[s] = {"weight": q, "weight_scale_inv": scale.float()}
        return out
    if problem.dtype == "nvfp4":
        return _nvfp4(raw)
    raise ValueError(f"no checkpoint format for {problem.dtype!r} experts")


def _nvfp4(raw: dict) -> dict:
    """ModelOpt's NVFP4 storage: gate and up share one global scale per expert."""
    import torch

    from autotune.numerics import nvfp4

    bf = {s: w.to(torch.bfloat16).float() for s, w in raw.items()}     # what a bf16 checkpoint held
    amax13 = torch.maximum(bf["w1"].abs().amax(dim=(1, 2)), bf["w3"].abs().amax(dim=(1, 2)))
    amax = {"w1": amax13, "w3": amax13, "w2": bf["w2"].abs().amax(dim=(1, 2))}
    out = {}
    for s, w in bf.items():
        gs = (E4M3_MAX * E2M1_MAX) / amax[s].clamp(min=1e-12)
        q, sf = zip(*(nvfp4.quantize(w[i], gs[i], swizzle=False) for i in range(w.shape[0])))
        act = NVFP4_INPUT_AMAX["w2" if s == "w2" else "w13"] / (E4M3_MAX * E2M1_MAX)
        out[s] = {"weight": torch.stack(q), "weight_scale": torch.stack(sf), "weight_scale_2": (1.0 / gs).float(),
                  "input_scale": torch.full_like(gs, act)}
    return out


def renormalized_topk(router_logits, top_k: int):
    """(topk_ids int32, topk_weights float32) as Qwen3.5's router takes them (SGLang's
    RenormalizeNaive: softmax over all experts in float32, top-k, weights renormalised)."""
    import torch

    w, ids = torch.topk(torch.softmax(router_logits.float(), dim=-1), top_k, dim=-1)
    return ids.to(torch.int32), w / w.sum(-1, keepdim=True)


def reference(x, topk_ids, topk_weights, dequant13, dequant2, N: int):
    """float32 [M, K] = sum over the chosen experts of w * (silu(x W_gate^T) * (x W_up^T)) W_down^T,
    with the experts' float32 weights (`dequant13(e)` [2N, K] gate rows first, `dequant2(e)` [K, N])
    and unquantized activations."""
    import torch

    xf, ids = x.float(), topk_ids.long()
    out = None
    for e in torch.unique(ids).tolist():
        m, t = (ids == e).nonzero(as_tuple=True)
        h = xf[m] @ dequant13(e).T
        act = torch.nn.functional.silu(h[:, :N]) * h[:, N:]
        part = (act @ dequant2(e).T) * topk_weights[m, t, None]
        if out is None:
            out = torch.zeros((x.shape[0], part.shape[1]), dtype=torch.float32, device=x.device)
        out.index_add_(0, m, part)
    return out
