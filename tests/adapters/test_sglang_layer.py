"""SGLang's own layers built outside a server, on the CPU, told which GPU they are on
(autotune.adapters.sglang_layer): each backend's layout is SGLang's, made from our checkpoint
shards, and holds the weights the reference computes with; SGLang's refusals are its own."""
import dataclasses
import os

import pytest
import torch

from autotune.numerics import nvfp4
from autotune.measure import records
from autotune.adapters import sglang_layer as L
from autotune.adapters.moe_checkpoint import make_shards
from autotune.measure.measurer import classify
from autotune.problems.models import Problem

NVFP4 = Problem(E=4, N=128, K=256, top_k=2, dtype="nvfp4")


@pytest.fixture(scope="module")
def shards():
    return make_shards(NVFP4, seed=3, device="cpu")


def block(problem, backend, shards, sm):
    with L.platform_view(sm):
        return L.MoeBlock(problem, backend, device="cpu").load(shards)


def test_cutlass_layout_on_sm120_holds_the_reference_weights(shards):
    """SGLang's flashinfer_cutlass processing (w13 as [up; gate], block scales swizzled 128x4,
    the global scale folded into g1/g2 alphas) decodes to exactly the experts our reference uses."""
    ex = block(NVFP4, "flashinfer_cutlass", shards, 120).experts
    N, K = NVFP4.N, NVFP4.K
    for e in range(NVFP4.E):
        scale_2 = ex.g1_alphas[e] * ex.w13_input_scale_quant          # alpha = input_scale * weight_scale_2
        w13 = nvfp4.dequantize(ex.w13_weight[e], ex.w13_blockscale_swizzled[e], 1.0 / scale_2, 2 * N, K)
        ref = shards.dequant13(e)
        # up first, as FlashInfer's SwiGLU takes it (the alphas round the global scale by an ulp)
        close = dict(rtol=1e-6, atol=0)
        torch.testing.assert_close(w13[:N], ref[N:], **close)
        torch.testing.assert_close(w13[N:], ref[:N], **close)
        scale_2 = ex.g2_alphas[e] * ex.w2_input_scale_quant
        torch.testing.assert_close(nvfp4.dequantize(ex.w2_weight[e], ex.w2_blockscale_swizzled[e], 1.0 / scale_2, K, N),
                                   shards.dequant2(e), **close)


def test_cutedsl_layout_on_sm120_is_sglangs_interleave_of_our_shards(shards):
    """SGLang's CuTe DSL path interleaves up and gate in 64-row chunks: the rows are ours."""
    ex = block(NVFP4, "flashinfer_cutedsl", shards, 120).experts
    up = shards.tensors["w3"]["weight"].reshape(NVFP4.E, -1, 64, NVFP4.K // 2)
    gate = shards.tensors["w1"]["weight"].reshape(NVFP4.E, -1, 64, NVFP4.K // 2)
    assert torch.equal(ex.w13_weight.data, torch.stack([up, gate], dim=2).reshape(NVFP4.E, 2 * NVFP4.N, -1))
    assert tuple(ex.w13_blockscale_mma.shape)[0] > 0         # MMA-layout scales: SGLang made them


@pytest.mark.parametrize("dtype", ["bf16", "fp8_w8a8_block"])
def test_bf16_and_fp8_experts_load_gate_first_as_the_triton_runner_reads_them(dtype):
    p = dataclasses.replace(NVFP4, dtype=dtype)
    sh = make_shards(p, seed=1, device="cpu")
    ex = block(p, "triton", sh, 90).experts
    assert torch.equal(ex.w13_weight.data[:, :p.N], sh.tensors["w1"]["weight"])
    assert torch.equal(ex.w13_weight.data[:, p.N:], sh.tensors["w3"]["weight"])
    if dtype == "fp8_w8a8_block":
        assert torch.equal(ex.w13_weight_scale_inv.data[:, :1], sh.tensors["w1"]["weight_scale_inv"])


def test_sglangs_refusals_are_recorded_as_its_own(shards):
    """On SM90 SGLang's NVFP4 MoE method refuses every FlashInfer runner at construction, and its
    NVFP4 linear every native GEMM at processing: status `refused`, SGLang's sentence as evidence."""
    for backend in ("flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cutedsl"):
        with pytest.raises(L.Refused, match="Current platform does not support NVFP4") as e:
            with L.refusals("SGLang"):
                block(NVFP4, backend, shards, 90)
        assert classify(e.value) == (records.REFUSED, False)
    with pytest.raises(L.Refused, match="cutlass is not supported for NVFP4 MoE"):
        with L.refusals("SGLang"):
            block(NVFP4, "cutlass", shards, 120)
    with pytest.raises(L.Refused, match="require SM100"):
        with L.refusals("SGLang"), L.platform_view(90):
            L.Fp4Linear(256, 256, "flashinfer_cutlass", device="cpu").load(_linear_weight(256, 256))
    with pytest.raises(RuntimeError) as e:           # a kernel's error is not a refusal
        with L.refusals("SGLang"):
            raise RuntimeError("CUDA error: an illegal instruction was encountered")
    assert not isinstance(e.value, L.Refused)


def test_a_flag_sglang_serves_with_another_runner_is_refused_by_the_runner(shards):
    """SGLang 0.5.23's Fp8MoEMethod answers --moe-runner-backend flashinfer_cutlass with triton: the
    run must not time triton under flashinfer_cutlass's name."""
    from autotune.families.moe_backends import MoeLayerInputs
    from autotune.families.moe_backends.flashinfer_cutlass import RUNNERS

    p = dataclasses.replace(NVFP4, dtype="fp8_w8a8_block")
    fp8 = next(r for r in RUNNERS if r.family == "moe_fp8")
    inputs = MoeLayerInputs(p, 1, [], [], [], [], make_shards(p, device="cpu"), {})
    with L.platform_view(90), pytest.raises(L.Refused, match="serves --moe-runner-backend flashinfer_cutlass with triton"):
        fp8.block(inputs)


def _linear_weight(N, K):
    w = torch.randn(N, K) / K ** 0.5
    gs = nvfp4.global_scale(w)
    q, sf = nvfp4.quantize(w, gs, swizzle=False)
    return {"weight": q, "weight_scale": sf, "weight_scale_2": (1 / gs).reshape(()).float(),
            "input_scale": torch.tensor(8 / 2688)}


def test_fp4_gemm_auto_is_asked_of_sglang_for_each_gpu():
    assert [L.resolved_fp4_gemm_backend(sm) for sm in (90, 100, 120)] == ["marlin", "flashinfer_cutedsl",
                                                                           "flashinfer_cutlass"]
    assert L.resolved_moe_backend(NVFP4, 120) == "flashinfer_cutlass"     # SGLang's server-argument stage
    assert L.resolved_moe_backend(NVFP4, 90) == "marlin"                  # its quant method's own


def test_the_triton_runner_reads_a_tuned_folder_only_where_there_is_one(tmp_path, monkeypatch):
    """A backend-only run's --out holds no Triton configs yet: SGLang must keep its own folder (on the
    H200 the run pointed it at the missing folder and every Triton launch failed)."""
    monkeypatch.delenv("SGLANG_MOE_CONFIG_DIR", raising=False)
    monkeypatch.setattr(L, "_CONFIG_DIR", [])
    L.use_triton_configs(str(tmp_path / "NVIDIA_H200"))
    assert "SGLANG_MOE_CONFIG_DIR" not in os.environ
    (tmp_path / "NVIDIA_H200" / "configs").mkdir(parents=True)
    L.use_triton_configs(str(tmp_path / "NVIDIA_H200"))
    assert os.environ["SGLANG_MOE_CONFIG_DIR"] == str(tmp_path / "NVIDIA_H200")
    L.use_triton_configs(None)
    assert "SGLANG_MOE_CONFIG_DIR" not in os.environ


def test_a_world_that_fails_half_way_gives_every_later_caller_its_first_error(monkeypatch):
    """SGLang's parallel groups cannot be made twice in one process: when the first build of the
    world fails after making them (a missing module in a later import), each later backend in that
    worker must see that cause, not SGLang's 'already initialized' (H200, session 16)."""
    calls = []

    def half_built():
        calls.append(1)
        if len(calls) == 1:
            raise ModuleNotFoundError("No module named 'openai'")
        raise AssertionError("tensor model parallel group is already initialized")

    monkeypatch.setattr(L, "_build_world", half_built)
    monkeypatch.setattr(L, "_world_failed", [])
    for _ in range(3):
        with pytest.raises(ModuleNotFoundError, match="openai"):
            L.world()
    assert len(calls) == 1


def test_sglang_auto_that_cannot_be_resolved_here_is_unknown_in_one_line(monkeypatch, capsys):
    """Asking SGLang's own `auto` resolution imports half its server; where that breaks, the run
    says so in one line and reports auto as unknown instead of ending in a traceback (H200,
    session 16: a run's selection died on it after every backend was measured)."""
    from autotune.contract import capabilities

    def broken(sm):
        raise ModuleNotFoundError("No module named 'openai'")

    monkeypatch.setattr(L, "resolved_fp4_gemm_backend", broken)
    assert capabilities.sglang_auto_value("fp4_gemm", None) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp4_gemm" in err[0] and "openai" in err[0] and "unknown" in err[0]


@pytest.mark.slow       # a fresh process (the world is built once per process) importing SGLang
def test_the_world_takes_no_port_from_the_environment_its_parent_holds(tmp_path):
    """A test process that had built its world left MASTER_PORT in its environment, and a run it started
    (the README main job) built its own world on that port, held by the parent: EADDRINUSE, and SGLang's
    `auto` reported unknown. The world now rendezvous on a free port of its own, whatever the environment."""
    import os
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT),
               "AUTOTUNE_CACHE_DIR": str(tmp_path / "memo")}
        code = ("from autotune.contract import capabilities; print(capabilities.sglang_auto_value('moe_bf16', 90)); "
                "import os; print(os.environ['MASTER_PORT'])")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "autotune: warning" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["triton", str(port)]        # answered; the environment left as it was
