"""Float32 reference for NVFP4, in the conventions of FlashInfer 0.7.2.

NVFP4 is what FlashInfer's ``fp4_quantize`` / ``nvfp4_quantize``, ``mm_fp4`` and the
NVFP4 MoE kernels consume. Plain vectorised torch: works on CPU and CUDA tensors alike.
Written from FlashInfer's sources (paths below are relative to site-packages/flashinfer;
``tllm/`` is ``data/csrc/nv_internal/tensorrt_llm/``):

* Element: e2m1, magnitudes E2M1_MAGNITUDES indexed by the low 3 bits, bit 3 = sign
  (``quantization/fp4_quantization.py`` ``_E2M1_VALUES``; ``tllm/thop/fp4Op.cpp``
  ``kE2M1ToFloatArray``). Code 8 is -0.
* Rounding to e2m1: round to nearest, ties to the even code, saturating at +-6
  (``cvt.rn.satfinite.e2m1x2.f32`` in ``tllm/kernels/quantization_utils.cuh``
  ``fp32_vec_to_e2m1``; the host encoder ``floatToE2M1`` in ``fp4Op.cpp`` breaks ties the
  same way). Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. Negative
  values keep their sign, also when they round to zero (code 8).
* Packing: two elements per uint8, element 2i in the LOW nibble, element 2i+1 in the high
  nibble (the cvt puts its second source operand, array[0], in the low half; the host
  dequantizer and ``_e2m1_and_ufp8sf_scale_to_float_cpu`` read even indices from ``& 0xF``).
* Block scale: one float8_e4m3fn per 16 consecutive elements along K. The default CUDA
  recipe (``cvt_warp_fp16_to_fp4``, fast-math branch, the default since
  FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH is unset) is, with gs the global scale::

      sf   = e4m3_satfinite(gs * (amax_block * (1/6)))          # stored byte, RNE
      inv  = 1 / (float(sf) * (1/gs))    if amax_block != 0 else 0
      q    = e2m1(x * inv)

  The kernel takes 1/6, 1/gs and the outer 1/. with ``rcp.approx.ftz``; we use correctly
  rounded float32 reciprocals, which is what the kernel's exact-math branch does and what
  rcp.approx returns for these arguments as far as we know (not checked on a GPU: an
  ulp there could move a scale or a code that sits on a rounding tie).

  A zero block gets scale byte 0 and codes 0. A non-zero block whose scale rounds to 0
  (gs * amax_block / 6 <= 2**-10) dequantizes to 0 whatever its codes; for its codes we
  take inv = FLT_MAX (the kernel's exact-math branch, ``fminf(1/0, FLT_MAX)``, and TE's
  reference), so non-zero elements get +-6 and zeros 0. The default fast-math branch has
  inv = rcp(0) = inf, where 0 * inf makes the codes of the block's zeros unspecified.
* Global scale: gs = (448 * 6) / amax(|x|) in float32, FLT_MAX for an all-zero tensor
  (``quantization/nvfp4_quantization_utils.py`` ``make_nvfp4_global_scale``). Written, as
  there, with the python number on the left, torch evaluates it as reciprocal(amax) * 2688
  (amax 7 gives 384.00003, not 384); we keep that expression so the bits match.
* Dequantization: x = e2m1 * (float(sf) * (1/gs)), in that float32 order, as FlashInfer's
  host reference ``E2M1AndUFP8SFScaleToFloatV2`` (``fp4Op.cpp``) computes it when it is
  passed ``1 / global_scale`` (its tests pass exactly that).
* Swizzled "128x4" scale layout (``is_sf_swizzled_layout=True``, ``block_scale_interleave``
  / ``nvfp4_block_scale_interleave``): the [rows, K/16] scale matrix is zero-padded to
  rows multiple of 128 and columns multiple of 4, then scale (r, c) sits at flat offset
  ``(r // 128) * (128 * Cp) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``
  (``get_sf_out_offset_128x4`` in ``quantization_utils.cuh``; ``computeSFIndex`` in
  ``fp4Op.cpp``), i.e. tiles [Rp/128, Cp/4, 32, 4, 4]. ``fp4_quantize`` returns that flat
  buffer reshaped to [Rp, Cp] (uint8); we return the same 2-D shape as float8_e4m3fn.
* GEMM: ``mm_fp4(a, b.T, a_sf, b_sf.T, alpha)`` with a = [M, K/2], b = [N, K/2] both
  quantized along K (b passed as the transposed, column-major view) and
  alpha = 1 / (gs_a * gs_b); out = alpha * sum_k (e2m1_a*sf_a)(e2m1_b*sf_b)
  (``gemm/gemm_base.py`` ``mm_fp4`` docstring).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
BLOCK = 16                     # elements per scale along K
SF_ROW_TILE, SF_COL_TILE = 128, 4

# Midpoints between consecutive magnitudes; midpoint i lies between codes i and i+1.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _as_gs(gs, device) -> torch.Tensor:
    """A global scale (python number or 1-element tensor) as a float32 0-dim tensor."""
    t = torch.as_tensor(gs, dtype=torch.float32, device=device)
    if t.numel() != 1:
        raise ValueError(f"global scale must have one element, got shape {tuple(t.shape)}")
    return t.reshape(())


def e2m1_values(device=None) -> torch.Tensor:
    """float32 [16]: the value of each 4-bit code (bit 3 = sign; code 8 is -0.0)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def global_scale(x: torch.Tensor) -> torch.Tensor:
    """(448 * 6) / amax(|x|) as a float32 0-dim tensor; FLT_MAX when x is all zero.

    Bit-identical to FlashInfer's make_nvfp4_global_scale (same torch expression).

    FlashInfer's kernels take it as a float32 tensor of one element (``.reshape(1)``).
    """
    amax = x.detach().abs().max().to(torch.float32)
    if amax == 0:
        return torch.tensor(torch.finfo(torch.float32).max, dtype=torch.float32, device=x.device)
    return (E4M3_MAX * E2M1_MAX) / amax


def _encode_e2m1(v: torch.Tensor) -> torch.Tensor:
    """float32 -> uint8 codes 0..15: RNE on the e2m1 grid, ties to the even code, |v| > 6
    saturates to 6 (inf too), the sign bit follows signbit (so -0.1 -> code 8).
    NaN (only from NaN input) is written as code 7; FlashInfer does not pin that case down."""
    a = v.abs()
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=v.device)
    lo = torch.bucketize(a, mids, right=False)          # number of midpoints < a
    hi = torch.bucketize(a, mids, right=True)           # number of midpoints <= a
    code = torch.where(hi > lo, lo + (lo & 1), lo)      # on a midpoint: the even neighbour
    code = torch.where(torch.isnan(a), torch.full_like(code, 7), code)
    sign = torch.signbit(v) & ~torch.isnan(v)
    return (code + sign.to(code.dtype) * 8).to(torch.uint8)


def quantize(x: torch.Tensor, global_scale, swizzle: bool = True):
    """Quantize x [..., rows, K] (K a multiple of 16) to NVFP4 as FlashInfer's CUDA kernel does.

    Returns (packed, scales):
      packed: uint8 [..., rows, K//2], element 2i in the low nibble of byte i.
      scales: float8_e4m3fn; with swizzle=True the 128x4 layout, shape
              [..., round_up(rows, 128), round_up(K//16, 4)] (a 2-D view of the flat buffer
              that fp4_quantize / block_scale_interleave return, padding zero);
              with swizzle=False plain row-major [..., rows, K//16].
    The results equal the kernel's when x holds the values the kernel sees (bf16/fp16 input
    upcast to float32) and gs is the same float32; leading dims are independent matrices.
    """
    if x.dim() < 2 or x.shape[-1] % BLOCK:
        raise ValueError(f"x must be [..., rows, K] with K % {BLOCK} == 0, got {tuple(x.shape)}")
    *lead, rows, k = x.shape
    gs = _as_gs(global_scale, x.device)
    xb = x.detach().to(torch.float32).reshape(*lead, rows, k // BLOCK, BLOCK)
    amax = xb.abs().amax(dim=-1)
    inv6 = torch.tensor(1.0 / 6.0, dtype=torch.float32, device=x.device)
    sf_f = gs * (amax * inv6)                            # kernel order: gs * (amax * rcp(6))
    # satfinite: clamp before the cast (torch's cast rounds to nearest even).
    sf8 = sf_f.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    sf_back = sf8.to(torch.float32)
    flt_max = torch.finfo(torch.float32).max
    inv = torch.where(amax != 0, (1.0 / (sf_back * (1.0 / gs))).clamp(max=flt_max),
                      torch.zeros_like(amax))
    codes = _encode_e2m1(xb * inv.unsqueeze(-1)).reshape(*lead, rows, k)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = swizzle_scales(sf8) if swizzle else sf8
    return packed, scales


def _unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _scales_f32(scales: torch.Tensor) -> torch.Tensor:
    if scales.dtype == torch.uint8:
        scales = scales.view(torch.float8_e4m3fn)
    return scales.to(torch.float32)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, global_scale, rows: int, K: int,
               swizzled: bool = True) -> torch.Tensor:
    """float32 [..., rows, K] = e2m1 * (scale * (1/gs)).

    packed: uint8 [..., rows, K//2]. scales: float8_e4m3fn or its uint8 bytes; swizzled=True
    takes the 128x4 buffer in any shape holding [..., round_up(rows,128) * round_up(K//16,4)]
    elements, swizzled=False takes [..., rows, K//16].
    """
    if K % BLOCK or packed.shape[-2:] != (rows, K // 2):
        raise ValueError(f"packed {tuple(packed.shape)} does not match rows={rows}, K={K}")
    lead = packed.shape[:-2]
    cols = K // BLOCK
    sf = unswizzle_scales(scales, rows, cols) if swizzled else scales
    sf = _scales_f32(sf).reshape(*lead, rows, cols, 1)
    gs = _as_gs(global_scale, packed.device)
    vals = e2m1_values(packed.device)[_unpack_codes(packed).long()]
    out = vals.reshape(*lead, rows, cols, BLOCK) * (sf * (1.0 / gs))
    return out.reshape(*lead, rows, K)


def _byte_view(s: torch.Tensor):
    # float8 tensors are moved as their bytes (padding / indexing support is thinner).
    if s.dtype.itemsize == 1 and s.dtype != torch.uint8 and s.dtype != torch.int8:
        return s.view(torch.uint8), s.dtype
    return s, None


def swizzle_scales(s: torch.Tensor) -> torch.Tensor:
    """[..., rows, cols] row-major scales -> 128x4 layout [..., round_up(rows,128), round_up(cols,4)].

    Padding rows/columns are zero. The output, read flat, is the buffer FlashInfer's
    block_scale_interleave returns (a 3-D input gives one such buffer per leading index,
    back to back, as it does for MoE experts). Any dtype; float8 in, float8 out.
    """
    if s.dim() < 2:
        raise ValueError("scales must be at least 2-D [..., rows, cols]")
    s, orig = _byte_view(s)
    *lead, rows, cols = s.shape
    rp, cp = _round_up(rows, SF_ROW_TILE), _round_up(cols, SF_COL_TILE)
    padded = s.new_zeros((*lead, rp, cp))
    padded[..., :rows, :cols] = s
    # row r = (m_tile, r % 128 // 32, r % 32); col c = (k_tile, c % 4)
    t = padded.reshape(*lead, rp // 128, 4, 32, cp // 4, 4)
    n = len(lead)
    t = t.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4)   # [mt, kt, r%32, r%128//32, c%4]
    out = t.reshape(*lead, rp, cp).contiguous()
    return out.view(orig) if orig is not None else out


def unswizzle_scales(s: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of swizzle_scales: 128x4 buffer -> [..., rows, cols] (padding dropped).

    s may be [..., Rp, Cp], flat [Rp*Cp], or flat [E*Rp*Cp] (E matrices back to back,
    as block_scale_interleave returns for a 3-D input; then the result is [E, rows, cols]).
    """
    s, orig = _byte_view(s)
    rp, cp = _round_up(rows, SF_ROW_TILE), _round_up(cols, SF_COL_TILE)
    per = rp * cp
    if s.dim() >= 3:
        lead = tuple(s.shape[:-2])
    elif s.numel() == per:
        lead = ()
    elif s.dim() == 1 and s.numel() % per == 0:
        lead = (s.numel() // per,)
    else:
        raise ValueError(f"scales of shape {tuple(s.shape)} do not hold a 128x4 layout of "
                         f"[{rows}, {cols}] (expected {per} elements per matrix)")
    if s.numel() != per * math.prod(lead):
        raise ValueError(f"scales of shape {tuple(s.shape)} do not match rows={rows}, cols={cols}")
    t = s.reshape(*lead, rp // 128, cp // 4, 32, 4, 4)
    n = len(lead)
    t = t.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4)   # [mt, r%128//32, r%32, kt, c%4]
    out = t.reshape(*lead, rp, cp)[..., :rows, :cols].contiguous()
    return out.view(orig) if orig is not None else out


@dataclass(frozen=True)
class Quantized:
    """One NVFP4 matrix as `quantize` returns it: packed [rows, K/2], its block scales (swizzled:
    the 128x4 layout, else plain [rows, K/16]) and the global scale it was quantized with."""
    packed: torch.Tensor
    scales: torch.Tensor
    global_scale: Any
    swizzled: bool = True

    def block_scaled(self) -> torch.Tensor:
        """float32 [rows, K]: e2m1 * sf, exact (the global scale not applied)."""
        rows, half_k = self.packed.shape[-2:]
        return dequantize(self.packed, self.scales, 1.0, rows, 2 * half_k, self.swizzled)


def reference_mm(a: Quantized, b: Quantized) -> torch.Tensor:
    """float32 [M, N] = dequant(a) @ dequant(b).T, for mm_fp4(a, b.T, a_sf, b_sf.T, alpha).

    a: [M, K/2] with its scales, b: [N, K/2] (the weight as quantized, before mm_fp4's
    transposed view) with its scales. Computed as the kernel does: the block-scaled
    products e2m1 * sf are exact in float32; they are accumulated in float64 and scaled
    by alpha = float32(1 / (gs_a * gs_b)) at the end.
    """
    a_u, b_u = a.block_scaled(), b.block_scaled()
    dev = a.packed.device
    alpha = 1.0 / (_as_gs(a.global_scale, dev) * _as_gs(b.global_scale, dev))
    acc = a_u.to(torch.float64) @ b_u.to(torch.float64).T
    return (acc * alpha.to(torch.float64)).to(torch.float32)
