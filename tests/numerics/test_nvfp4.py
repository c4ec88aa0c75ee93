"""autotune.numerics.nvfp4: the float32 NVFP4 reference (conventions of FlashInfer 0.7.2)."""
import math

import pytest
import torch

from autotune.numerics import nvfp4

FLT_MAX = torch.finfo(torch.float32).max
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def u8(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def codes_of(packed):
    """uint8 [..., K/2] -> codes [..., K] with the low nibble first (independent of nvfp4)."""
    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2, dtype=torch.uint8, device=packed.device)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


def pack(codes):
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def test_e2m1_table():
    assert nvfp4.E2M1_MAGNITUDES == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    v = nvfp4.e2m1_values()
    assert v[:8].tolist() == list(nvfp4.E2M1_MAGNITUDES)
    assert v[8:].tolist() == [-m for m in nvfp4.E2M1_MAGNITUDES]
    assert torch.signbit(v[8])                        # code 8 is -0.0


def test_global_scale():
    x = torch.tensor([[1.0, -24.0, 3.0]], dtype=torch.bfloat16)
    gs = nvfp4.global_scale(x)
    assert gs.dtype == torch.float32 and gs.dim() == 0 and gs.item() == 112.0
    y = torch.randn(7, 33, generator=torch.Generator().manual_seed(2))
    y[3, 5] = -7.0
    # FlashInfer writes 448 * 6 / amax with a python number on the left, which torch evaluates
    # as reciprocal(amax) * 2688: for amax 7 that is 384.00003, not 2688 / 7 = 384.
    assert nvfp4.global_scale(y).item() == (torch.tensor(7.0).reciprocal() * 2688.0).item()
    assert nvfp4.global_scale(y).item() == 384.0000305175781
    utils = pytest.importorskip("flashinfer.quantization.nvfp4_quantization_utils")
    fi = utils.make_nvfp4_global_scale(y, per_token_activation=False)
    assert nvfp4.global_scale(y).item() == fi.item()
    assert nvfp4.global_scale(torch.zeros(3, 16)).item() == \
        utils.make_nvfp4_global_scale(torch.zeros(3, 16), per_token_activation=False).item()
    assert nvfp4.global_scale(torch.zeros(4, 16)).item() == FLT_MAX


@pytest.mark.parametrize("swizzle", [False, True])
def test_hand_worked_gs_one(swizzle):
    # gs = 1, amax = 12: scale = 12/6 = 2.0 -> e4m3 0x40; x * 1/2 is rounded on the e2m1 grid.
    x = torch.tensor([[12, -12, 6, 1, 0.5, 0.4, -3, 5, 2.5, 0, -0.25, 7, 9, 11, -1.5, 3.5]])
    # x/2 = 6 -6 3 .5 .25 .2 -1.5 2.5 1.25 0 -.125 3.5 4.5 5.5 -.75 1.75
    # codes 7 15 5 1 0(tie) 0 11 4(tie) 2(tie) 0 8(-0) 6(tie) 6 7 10(tie) 4(tie)
    packed, sf = nvfp4.quantize(x, 1.0, swizzle=swizzle)
    assert packed.dtype == torch.uint8 and packed.shape == (1, 8)
    assert packed[0].tolist() == [0xF7, 0x15, 0x00, 0x4B, 0x02, 0x68, 0x76, 0x4A]
    assert sf.dtype == torch.float8_e4m3fn
    if swizzle:
        assert sf.shape == (128, 4)
        flat = u8(sf).flatten()
        assert flat[0].item() == 0x40 and flat[1:].eq(0).all()
    else:
        assert sf.shape == (1, 1) and u8(sf).item() == 0x40
    deq = nvfp4.dequantize(packed, sf, 1.0, 1, 16, swizzled=swizzle)
    assert deq.tolist() == [[12, -12, 6, 1, 0, 0, -3, 4, 2, 0, 0, 8, 8, 12, -2, 4]]
    assert torch.signbit(deq[0, 10])                 # -0.125 -> code 8 -> -0.0


def test_hand_worked_global_scale_two_blocks():
    b0 = [24, -24, 12, 6, 3, 2, 1, 0.5, -7, 10, 14, 18, 22, -5, 0, 1.9]
    b1 = [3, -3, 1, 0.75, 0.5, 0.3, -0.2, 2, 1.4, -2.2, 0.1, 0, -0.0, 2.75, 1.6, -1]
    x = torch.tensor([b0 + b1])
    gs = nvfp4.global_scale(x)
    assert gs.item() == 112.0                        # 2688 / 24
    packed, sf = nvfp4.quantize(x, gs, swizzle=False)
    # block 0: 112 * 24/6 = 448 -> 0x7E, x * 1/(448/112) = x/4
    # block 1: 112 * 3/6 = 56 = 1.75 * 2^5 -> 0x66, x * 1/(56/112) = 2x
    assert u8(sf).tolist() == [[0x7E, 0x66]]
    # x/4  = 6 -6 3 1.5 .75 .5 .25 .125 -1.75 2.5 3.5 4.5 5.5 -1.25 0 .475
    #  -> 7 15 5 3 2 1 0 0 12 4 6 6 7 10 0 1
    # 2x   = 6 -6 2 1.5 1 .6 -.4 4 2.8 -4.4 .2 0 -0 5.5 3.2 -2
    #  -> 7 15 4 3 2 1 9 6 5 14 0 0 8 7 5 12
    assert packed[0].tolist() == [0xF7, 0x35, 0x12, 0x00, 0x4C, 0x66, 0xA7, 0x10,
                                  0xF7, 0x34, 0x12, 0x69, 0xE5, 0x00, 0x78, 0xC5]
    deq = nvfp4.dequantize(packed, sf, gs, 1, 32, swizzled=False)
    assert deq[0].tolist() == [24, -24, 12, 6, 4, 2, 0, 0, -8, 8, 16, 16, 24, -4, 0, 2,
                               3, -3, 1, 0.75, 0.5, 0.25, -0.25, 2, 1.5, -2, 0, 0, 0, 3, 1.5, -1]
    packed_s, sf_s = nvfp4.quantize(x, gs)           # swizzled: (0, c) sits at flat offset c
    assert torch.equal(packed_s, packed)
    flat = u8(sf_s).flatten()
    assert flat[:2].tolist() == [0x7E, 0x66] and flat[2:].eq(0).all()


def test_scale_rounding_and_saturation():
    # amax 6.3: 6.3/6 = 1.05 -> e4m3 1.0 (0x38); 6.3 * 1 saturates to 6.
    # amax 6.5: 6.5/6 = 1.083 -> e4m3 1.125 (0x39); 6.5/1.125 = 5.78 -> 6; 1/1.125 = .89 -> 1.
    x = torch.zeros(1, 32)
    x[0, 0] = 6.3
    x[0, 16], x[0, 17] = 6.5, 1.0
    packed, sf = nvfp4.quantize(x, 1.0, swizzle=False)
    assert u8(sf).tolist() == [[0x38, 0x39]]
    c = codes_of(packed)[0]
    assert c[0].item() == 7 and c[16].item() == 7 and c[17].item() == 2
    deq = nvfp4.dequantize(packed, sf, 1.0, 1, 32, swizzled=False)
    assert deq[0, 0].item() == 6.0 and deq[0, 16].item() == 6.75 and deq[0, 17].item() == 1.125


def test_kernel_arithmetic_order():
    # Scale: gs * (amax * (1/6)) as cvt_warp_fp16_to_fp4 computes it. For these float32 inputs
    # that is exactly 304.0, an e4m3 tie between 288 and 320 that goes to the even mantissa
    # (320 = 0x7A); (gs * amax) / 6 would give 303.99997 -> 288.
    amax, gs = 8.590977668762207, 212.3157501220703
    x = torch.zeros(1, 16)
    x[0, 0] = amax
    packed, sf = nvfp4.quantize(x, gs, swizzle=False)
    assert u8(sf).item() == 0x7A and sf.float().item() == 320.0
    # Dequantization: e2m1 * (sf * (1/gs)), two float32 roundings, as FlashInfer's C++ host
    # dequantizer does; 1.5 * (448 / gs) or one rounding of 1.5 * 448 / gs give 0.9731889963.
    gs2 = torch.tensor(690.5133666992188)
    packed = torch.tensor([[0x03] + [0] * 7], dtype=torch.uint8)            # code 3 = 1.5
    sf2 = torch.tensor([[0x7E]], dtype=torch.uint8)                          # 448
    deq = nvfp4.dequantize(packed, sf2, gs2, 1, 16, swizzled=False)
    assert deq[0, 0].item() == 0.9731889367103577


def test_round_to_nearest_even_at_ties():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    rows = [
        torch.cat([torch.tensor([6.0]), mids, -mids, torch.tensor([0.0])]),
        torch.cat([torch.tensor([6.0]), torch.nextafter(mids, torch.tensor(9.0)),
                   torch.nextafter(mids, torch.tensor(0.0)), torch.tensor([-6.0])]),
    ]
    x = torch.stack(rows)                            # amax 6, gs 1 -> scale 1.0, q = x exactly
    packed, sf = nvfp4.quantize(x, 1.0, swizzle=False)
    assert u8(sf).flatten().tolist() == [0x38, 0x38]
    c = codes_of(packed)
    # ties go to the even code: .25->0 .75->1.0 1.25->1.0 1.75->2 2.5->2 3.5->4 5->4
    assert c[0].tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 0]
    # one ulp above a tie rounds up, one ulp below rounds down
    assert c[1].tolist() == [7, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 15]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gs", [1.0, 2.0 ** -6, 2.0 ** 5])
def test_exact_round_trip_on_grid(device, gs):
    g = torch.Generator().manual_seed(1)
    rows, k = 200, 96
    codes = torch.randint(0, 16, (rows, k), generator=g, dtype=torch.uint8)
    codes.view(rows, k // 16, 16)[..., 3] = 7 | (torch.randint(0, 2, (rows, k // 16), generator=g,
                                                               dtype=torch.uint8) << 3)  # |6| per block
    sf_bytes = torch.randint(1, 127, (rows, k // 16), generator=g, dtype=torch.uint8)  # 1..126, subnormals too
    sf_val = sf_bytes.view(torch.float8_e4m3fn).float()
    x = nvfp4.e2m1_values()[codes.long()] * sf_val.repeat_interleave(16, dim=1) / gs
    x = x.to(torch.bfloat16).float().to(device)     # on the grid: exact in bf16 too
    for swizzle in (False, True):
        packed, sf = nvfp4.quantize(x, gs, swizzle=swizzle)
        plain = nvfp4.unswizzle_scales(sf, rows, k // 16) if swizzle else sf
        assert torch.equal(u8(plain).cpu(), sf_bytes)
        assert torch.equal(packed.cpu(), pack(codes))
        deq = nvfp4.dequantize(packed, sf, gs, rows, k, swizzled=swizzle)
        assert torch.equal(deq, x)


def _offset_128x4(r, c, cols):
    """FlashInfer's get_sf_out_offset_128x4 / computeSFIndex, written out."""
    cp = (cols + 3) // 4 * 4
    return (r // 128) * (128 * cp) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


@pytest.mark.parametrize("rows,cols", [(1, 1), (100, 3), (128, 4), (129, 7), (300, 8), (257, 2)])
def test_swizzle_offsets(rows, cols):
    s = torch.arange(1, rows * cols + 1, dtype=torch.int32).reshape(rows, cols)
    sw = nvfp4.swizzle_scales(s)
    rp, cp = (rows + 127) // 128 * 128, (cols + 3) // 4 * 4
    assert sw.shape == (rp, cp)
    flat = sw.flatten()
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    off = _offset_128x4(r, c, cols)
    assert torch.equal(flat[off], s)
    mask = torch.ones(rp * cp, dtype=torch.bool)
    mask[off.flatten()] = False
    assert flat[mask].eq(0).all()                    # padding is zero


@pytest.mark.parametrize("rows,cols", [(1, 2), (77, 6), (130, 5), (383, 12)])
def test_swizzle_unswizzle_inverse(rows, cols):
    g = torch.Generator().manual_seed(rows)
    s = torch.randint(0, 127, (rows, cols), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    sw = nvfp4.swizzle_scales(s)
    assert sw.dtype == torch.float8_e4m3fn
    back = nvfp4.unswizzle_scales(sw, rows, cols)
    assert back.shape == (rows, cols) and torch.equal(u8(back), u8(s))
    assert torch.equal(u8(nvfp4.unswizzle_scales(sw.flatten(), rows, cols)), u8(s))
    assert torch.equal(u8(nvfp4.swizzle_scales(back)), u8(sw))   # swizzle . unswizzle on a padded buffer
    # batched (MoE experts): one buffer per expert, back to back, as block_scale_interleave does
    e = torch.stack([s.view(torch.uint8), s.view(torch.uint8).flip(0)])
    swe = nvfp4.swizzle_scales(e)
    assert torch.equal(swe[1], nvfp4.swizzle_scales(e[1]))
    assert torch.equal(nvfp4.unswizzle_scales(swe.flatten(), rows, cols), e)
    assert torch.equal(nvfp4.unswizzle_scales(swe, rows, cols), e)
    with pytest.raises(ValueError):
        nvfp4.unswizzle_scales(sw.flatten()[:-1], rows, cols)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_dequant_error_on_normal_data(scale):
    # Measured (seed 0, 300x1024): ||deq - x|| / ||x|| = 0.095 at every scale, float32 and bf16
    # input; worst element error 0.175 * block amax. Bounds: 0.10 and (1/6)(1 + 1/16) = 0.1771
    # (half the top grid step, 1, times a block scale at most 1/16 above amax/6).
    g = torch.Generator().manual_seed(0)
    rows, k = 300, 1024
    x = (torch.randn(rows, k, generator=g) * scale).to(torch.bfloat16).float()
    gs = nvfp4.global_scale(x)
    packed, sf = nvfp4.quantize(x, gs)
    deq = nvfp4.dequantize(packed, sf, gs, rows, k)
    rel = ((deq - x).norm() / x.norm()).item()
    assert 0.08 < rel < 0.10
    amax = x.view(rows, k // 16, 16).abs().amax(-1, keepdim=True)
    per = (deq - x).view(rows, k // 16, 16).abs() / amax
    assert per.max().item() <= (1 / 6) * (1 + 1 / 16) * (1 + 1e-6)


def test_swizzled_and_plain_quantize_agree():
    x = torch.randn(150, 80, generator=torch.Generator().manual_seed(3))
    gs = nvfp4.global_scale(x)
    p1, s1 = nvfp4.quantize(x, gs, swizzle=False)
    p2, s2 = nvfp4.quantize(x, gs, swizzle=True)
    assert torch.equal(p1, p2)
    assert s2.shape == (256, 8)
    assert torch.equal(u8(s2), u8(nvfp4.swizzle_scales(s1)))
    assert torch.equal(nvfp4.dequantize(p1, s1, gs, 150, 80, swizzled=False),
                       nvfp4.dequantize(p2, u8(s2), gs, 150, 80))   # uint8 scale bytes accepted


@pytest.mark.parametrize("device", DEVICES)
def test_reference_mm(device):
    g = torch.Generator().manual_seed(4)
    M, N, K = 130, 70, 96                            # K/16 = 6: scale columns padded to 8
    a = torch.randn(M, K, generator=g).to(device)
    b = (torch.randn(N, K, generator=g) * 0.02).to(device)
    ga, gb = nvfp4.global_scale(a), nvfp4.global_scale(b)
    ap, asf = nvfp4.quantize(a, ga)
    bp, bsf = nvfp4.quantize(b, gb)
    out = nvfp4.reference_mm(nvfp4.Quantized(ap, asf, ga), nvfp4.Quantized(bp, bsf, gb))
    assert out.shape == (M, N) and out.dtype == torch.float32
    ref = nvfp4.dequantize(ap, asf, ga, M, K) @ nvfp4.dequantize(bp, bsf, gb, N, K).T
    tol = 1e-5 * (a.abs().max() * b.abs().max() * K).item()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=tol)
    # and it approximates the unquantized product (relative Frobenius error, measured ~0.13)
    exact = a @ b.T
    assert ((out - exact).norm() / exact.norm()).item() < 0.2
    # plain (unswizzled) scales give the same result
    ap2, asf2 = nvfp4.quantize(a, ga, swizzle=False)
    bp2, bsf2 = nvfp4.quantize(b, gb, swizzle=False)
    out2 = nvfp4.reference_mm(nvfp4.Quantized(ap2, asf2, ga, swizzled=False),
                              nvfp4.Quantized(bp2, bsf2, gb, swizzled=False))
    assert torch.equal(out, out2)


def test_zero_blocks():
    x = torch.zeros(3, 32)
    x[1, 16:] = torch.linspace(-2, 3, 16)            # row 1: block 0 zero, block 1 not
    x[2, 16:] = 1000.0                               # row 2: block 0 underflows its e4m3 scale
    x[2, :16] = torch.linspace(-1e-10, 1e-10, 16)
    x[2, 7] = 0.0
    gs = nvfp4.global_scale(x)
    packed, sf = nvfp4.quantize(x, gs, swizzle=False)
    b = u8(sf)
    assert b[0].tolist() == [0, 0] and b[1, 0].item() == 0 and b[2, 0].item() == 0
    assert b[1, 1].item() != 0 and b[2, 1].item() == 0x7E
    assert packed[0].eq(0).all() and packed[1, :8].eq(0).all()
    c = codes_of(packed)[2, :16]
    # inverse scale FLT_MAX (exact-math kernel branch, TE's reference): +-6 and a zero stays 0
    assert c[x[2, :16] > 0].eq(7).all() and c[x[2, :16] < 0].eq(15).all() and c[7].item() == 0
    deq = nvfp4.dequantize(packed, sf, gs, 3, 32, swizzled=False)
    assert torch.isfinite(deq).all()
    assert deq[0].eq(0).all() and deq[1, :16].eq(0).all() and deq[2, :16].eq(0).all()
    torch.testing.assert_close(deq[2, 16:], x[2, 16:], rtol=1e-6, atol=0)   # 6 * 448 / gs
    # an all-zero tensor: gs = FLT_MAX, every byte zero, dequantizes to zeros
    z = torch.zeros(5, 48)
    gz = nvfp4.global_scale(z)
    pz, sz = nvfp4.quantize(z, gz)
    assert pz.eq(0).all() and u8(sz).eq(0).all()
    dz = nvfp4.dequantize(pz, sz, gz, 5, 48)
    assert torch.isfinite(dz).all() and dz.eq(0).all()


def test_matches_flashinfer_cpu_dequantize():
    # FlashInfer's only NVFP4 helper that runs without a GPU: the pure-torch fallback behind
    # e2m1_and_ufp8sf_scale_to_float (linear scale layout only); it multiplies by the global
    # scale it is given, so it gets 1/gs, as FlashInfer's own tests pass it.
    fq = pytest.importorskip("flashinfer.quantization.fp4_quantization")
    ref_fn = getattr(fq, "_e2m1_and_ufp8sf_scale_to_float_cpu", None)
    if ref_fn is None:
        pytest.skip("flashinfer has no _e2m1_and_ufp8sf_scale_to_float_cpu")
    g = torch.Generator().manual_seed(5)
    rows, k = 37, 64
    packed = torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8)
    sf = torch.randint(0, 127, (rows, k // 16), generator=g, dtype=torch.uint8)
    gs = torch.tensor(2688.0) / 3.7
    theirs = ref_fn(packed, sf, 1.0 / gs.reshape(1), 16, 1, False)
    ours = nvfp4.dequantize(packed, sf, gs, rows, k, swizzled=False)
    # they round (e2m1 * sf) * (1/gs) once, we round e2m1 * (sf * (1/gs)) as the C++ host
    # dequantizer does: at most one float32 ulp apart
    torch.testing.assert_close(ours, theirs, rtol=2.0 ** -23, atol=0)
    # exactly equal with gs = 1 (every product exact)
    assert torch.equal(nvfp4.dequantize(packed, sf, 1.0, rows, k, swizzled=False),
                       ref_fn(packed, sf, torch.tensor([1.0]), 16, 1, False))
    # and our swizzled path reads the same scales
    sws = nvfp4.swizzle_scales(sf)
    assert torch.equal(nvfp4.dequantize(packed, sws, gs, rows, k), ours)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x = torch.randn(333, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).float()
    gs = nvfp4.global_scale(x)
    p_cpu, s_cpu = nvfp4.quantize(x, gs)
    p_gpu, s_gpu = nvfp4.quantize(x.cuda(), gs.cuda())
    assert torch.equal(p_gpu.cpu(), p_cpu) and torch.equal(u8(s_gpu).cpu(), u8(s_cpu))
    d_cpu = nvfp4.dequantize(p_cpu, s_cpu, gs, 333, 256)
    assert torch.equal(nvfp4.dequantize(p_gpu, s_gpu, gs.cuda(), 333, 256).cpu(), d_cpu)
    assert math.isfinite(d_cpu.abs().max().item())
