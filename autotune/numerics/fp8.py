"""FP8 (float8_e4m3fn) weights as SGLang's checkpoints hold them: one scale per block of the last two
dimensions (block-FP8, DeepSeek-style 128x128) or one per matrix (per-tensor FP8)."""
from __future__ import annotations

FP8_MAX = 448.0  # float8_e4m3fn


def fp8_blocks(w, block):
    """float8_e4m3fn with one scale per (block_n x block_k) tile of the last two dims: (q, scales)."""
    import torch

    *lead, R, C = w.shape
    bn, bk = block
    rb, cb = -(-R // bn), -(-C // bk)
    pad = torch.zeros(*lead, rb * bn, cb * bk, device=w.device)
    pad[..., :R, :C] = w
    blocks = pad.view(*lead, rb, bn, cb, bk)
    scale = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12) / FP8_MAX          # [..., rb, cb]
    q = (blocks / scale[..., :, None, :, None]).to(torch.float8_e4m3fn).view(*lead, rb * bn, cb * bk)
    return q[..., :R, :C].contiguous(), scale.float()


def fp8_per_matrix(w):
    """float8_e4m3fn with one scale per matrix of the last two dims: (q, scales [...])."""
    import torch

    scale = w.abs().amax(dim=(-2, -1)).clamp(min=1e-12).float() / FP8_MAX
    return (w / scale[..., None, None]).to(torch.float8_e4m3fn), scale
