"""SGLang's own fused-MoE kernel, run by the family in Triton's CPU interpreter (fp32),
against the float32 reference the family checks every timed result with."""
import pytest
import torch

from autotune.contract.config import KernelConfig
from autotune.gpus.device import cpu_interpreter
from autotune.families.triton_moe.moe_align import cpu_align_block_size
from autotune.families.triton_moe import TritonMoe
from autotune.measure.timing import check_output
from autotune.problems.models import Problem

PROBLEM = Problem(E=8, N=32, K=64, top_k=2, dtype="bf16")
CONFIGS = [KernelConfig.from_entry(c) for c in (
    {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2},
    {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16, "num_warps": 8, "num_stages": 3},
)]


@pytest.mark.parametrize("gemm", ["gate_up", "down"])
@pytest.mark.parametrize("config", CONFIGS, ids=["bm16", "bm32"])
def test_sglang_kernel_matches_reference(gemm, config):
    from autotune.adapters.sglang_loader import sglang_context
    from sglang.srt import runtime_context as rc

    fam = TritonMoe()
    assert fam.check(config, PROBLEM, gemm, cpu_interpreter()) is None
    inputs = fam.make_inputs(PROBLEM, gemm, 5, seed=1, routings=2, on_cpu=True)
    with rc.use_context(sglang_context()):
        inputs.C.fill_(float("nan"))
        out = fam.run(config, inputs, 0)
    ok, reason, err = check_output(out, fam.reference(inputs), fam.tolerance(PROBLEM, on_cpu=True))
    assert ok, reason
    assert err < 1e-5
    # The check is not vacuous: another routing set's output is far from routing 0's reference.
    with rc.use_context(sglang_context()):
        other = fam.run(config, inputs, 1).clone()
    assert not check_output(other, fam.reference(inputs), fam.tolerance(PROBLEM, on_cpu=True))[0]


def test_inputs_are_random_never_zero_and_routing_is_softmax_topk():
    fam = TritonMoe()
    inp = fam.make_inputs(PROBLEM, "gate_up", 64, routings=3, on_cpu=True)
    assert (inp.B != 0).float().mean() > 0.99 and (inp.A[0] != 0).float().mean() > 0.99
    ids = inp.topk_ids[0]
    assert ids.shape == (64, 2) and all(len(set(r.tolist())) == 2 for r in ids)       # distinct experts per token
    assert torch.allclose(inp.topk_weights[0].sum(-1), torch.ones(64))
    assert not torch.equal(inp.topk_ids[0], inp.topk_ids[1])                            # sets differ


def test_skewed_routing_concentrates_tokens_on_hot_experts():
    fam = TritonMoe()
    p = Problem(E=64, N=32, K=64, top_k=2, dtype="bf16")
    share = {}
    for skew in (0.0, 3.0):
        ids = fam.make_inputs(p, "gate_up", 512, skew=skew, routings=1, on_cpu=True).topk_ids[0]
        counts = torch.bincount(ids.flatten().long(), minlength=64).sort(descending=True).values
        share[skew] = counts[:8].sum().item() / counts.sum().item()
    assert share[3.0] > 2 * share[0.0]


def test_cpu_alignment_has_sglang_semantics():
    ids = torch.tensor([[2, 3], [1, 2], [1, 3], [0, 2]], dtype=torch.int32)
    sorted_ids, expert_ids, ntp = cpu_align_block_size(ids, 4, 4)
    assert ntp.item() == len(sorted_ids) == 16 and len(expert_ids) == 4
    flat = ids.flatten().tolist()
    for b, e in enumerate(expert_ids.tolist()):
        block = sorted_ids[4 * b: 4 * b + 4].tolist()
        assert all(i == len(flat) or flat[i] == e for i in block)       # padding uses the numel sentinel
    assert sorted(i for i in sorted_ids.tolist() if i < len(flat)) == list(range(len(flat)))


def test_check_output_rejects_nan_and_error():
    ref = torch.ones(4)
    assert check_output(torch.tensor([1.0, float("nan"), 1, 1]), ref, 1e-3)[:2] == (
        False, "1 of 4 outputs NaN/Inf or never written (25%; first at (1,): nan)")
    ok, reason, err = check_output(torch.tensor([1.0, 1, 1, 1.5]), ref, 1e-3)
    assert not ok and "relative error" in reason and err == pytest.approx(0.25)
    assert reason.endswith("(furthest off at (3,): 1.5 vs 1)")      # the evidence names the element
    two_d = torch.ones(2, 3)
    two_d[1, 2] = float("inf")
    assert "first at (1, 2): inf" in check_output(two_d, torch.ones(2, 3), 1e-3)[1]


def test_tma_layout_reads_only_ids_the_alignment_wrote():
    # SGLang's alignment writes the first num_tokens_post_padded ids of a worst-case-sized buffer;
    # the rest is uninitialised (negative garbage gathered out of bounds on the H200, 2026-12-01).
    fam = TritonMoe()
    p = PROBLEM
    inputs = fam.make_inputs(p, "down", 5, routings=1, on_cpu=True)
    sorted_ids, expert_ids, ntp = cpu_align_block_size(inputs.topk_ids[0], 16, p.E)
    garbage = torch.tensor([-7, 3, 10**6, 0, -1] * 8, dtype=torch.int32)
    inputs._aligned[(16, 0)] = (torch.cat([sorted_ids, garbage]), expert_ids, ntp)
    A = inputs.A[0]
    out = fam._tma_sorted_A(inputs, 16, 0)
    n = ntp.item()
    assert out.shape == (n + len(garbage), A.shape[1])
    assert torch.count_nonzero(out[n:]) == 0                            # nothing past the written ids
    for pos, i in enumerate(sorted_ids.tolist()):
        assert torch.equal(out[pos], A[i] if i < A.shape[0] else torch.zeros_like(A[0]))
