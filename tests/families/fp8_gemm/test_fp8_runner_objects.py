"""bmm_fp8's tactics go to the runner object FlashInfer builds for the backend that lists them. A
worker keeps one set of inputs per (problem, M) for every backend it measures there, so the runner
is kept per backend: on the H200 (session 12) one shared slot sent cuDNN's (engine, knobs) tactics
to the cuBLAS runner (16 false disqualifications) and cuBLAS algo indices to cuDNN's. FlashInfer's
runners need a GPU, so their factories are replaced by stand-ins that say which backend they are."""
import pytest
from flashinfer.gemm import gemm_base as g

from autotune.families.fp8_gemm import Fp8Gemm
from autotune.contract.runner import discover
from autotune.problems.models import GemmProblem

OFFERED = {"cublas": [0, 1, 2, 5], "cudnn": [(7, ((12, 3),)), (4, ((12, 9),))]}


class StandIn:
    def __init__(self, backend):
        self.backend = backend

    def get_valid_tactics(self, inputs, profile):
        return OFFERED[self.backend]


@pytest.fixture
def runners(monkeypatch):
    monkeypatch.setattr(g, "get_gemm_module", lambda: type("M", (), {"cublas_fp8_gemm_runner": lambda: StandIn("cublas")}))
    monkeypatch.setattr(g, "_cudnn_gemm_fp8_runner", lambda: StandIn("cudnn"))
    return {r.name: r for r in discover("autotune.families.fp8_gemm")}


@pytest.mark.parametrize("first, second", [("flashinfer_cublas", "flashinfer_cudnn"),
                                           ("flashinfer_cudnn", "flashinfer_cublas")])
def test_each_backend_lists_and_runs_on_its_own_runner_over_shared_inputs(runners, first, second):
    inputs = Fp8Gemm().make_inputs(GemmProblem("o", 64, 128, "fp8_w8a8_block"), "layer", 8, routings=1, on_cpu=True)
    for name in (first, second):
        r = runners[name]
        assert r._flashinfer_runner(inputs).backend == r.backend
    assert runners["flashinfer_cudnn"].tactics(inputs) == [-1, [7, [[12, 3]]], [4, [[12, 9]]]]


def test_cublas_algo_0_is_not_offered_beside_the_default_it_is(runners):
    inputs = Fp8Gemm().make_inputs(GemmProblem("o", 64, 128, "fp8_w8a8_block"), "layer", 8, routings=1, on_cpu=True)
    assert runners["flashinfer_cublas"].tactics(inputs) == [-1, 1, 2, 5]
