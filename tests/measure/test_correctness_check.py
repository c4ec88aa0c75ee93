"""The correctness check, pinned from both sides: per family and dtype, an output just inside its
tolerance passes and one just outside fails, through the path every trial takes (the worker's
Measurer: poison, launch, check against the family's tolerance); an output the launch did not
write (wholly or half) fails, though its buffer still holds a right answer from an earlier launch.

An audit planted `err <= 100 * tol` in autotune/measure/timing.py and the whole suite passed: the tests
only fed grossly wrong outputs. Here the outputs are off by 0.9x and 1.1x the tolerance, so a check
10x looser or tighter, or a tolerance changed by 10x, fails a test."""
import gzip
import json
import math
from pathlib import Path

import pytest
import torch

from autotune.contract.config import KernelConfig
from autotune.contract import registry
from autotune.measure import records
from autotune.contract.protocol import get_family
from autotune.measure.timing import check_output
from autotune.measure.measurer import Measurer
from autotune.problems.models import TRITON_DTYPES, Problem
from autotune.measure.tasks import Settings, Task
from tests.fakes.checked_family import CheckedOutputs, perturbed

ROOT = Path(__file__).resolve().parents[2]

# The contract: relative (Frobenius) error allowed against the float32 reference, per family and
# the dtype of its problems. A change here is a change of what autotune calls correct: it must be
# made in the family and here, and the committed recordings must still agree (below).
TOLERANCES = {
    ("triton_moe", "bf16"): 1e-2,             # bf16 tiles land at 2e-3..4e-3 on the H200
    ("triton_moe", "fp8_w8a8_block"): 5e-2,
    ("triton_moe", "fp8_w8a8"): 5e-2,
    ("moe_bf16", "bf16"): 0.02,
    ("moe_fp8", "fp8_w8a8_block"): 0.08,      # activations quantized inside each runner: ~5%
    ("moe_fp4", "nvfp4"): 0.3,                # W4A4 runners ~10%, a broken one ~100%
    ("fp8_gemm", "fp8_w8a8_block"): 0.08,     # FP8 rounding 2-4%
    ("fp4_gemm", "nvfp4"): 0.3,               # W4A4 ~9%
}
INTERPRETER = 1e-4       # triton_moe under Triton's CPU interpreter: float32 throughout, any dtype


def cases() -> list[tuple[str, str]]:
    """Every (family, dtype) a run can check: the registry's, so a new family needs a pinned tolerance."""
    out = []
    for name, fam in registry.families().items():
        out += [(name, d) for d in ((fam.dtype,) if fam.dtype else TRITON_DTYPES)]
    return out


def test_every_family_and_dtype_has_its_pinned_tolerance():
    assert sorted(cases()) == sorted(TOLERANCES)
    for (name, dtype), tol in TOLERANCES.items():
        problem = Problem(8, 32, 64, 2, dtype)
        assert get_family(name).tolerance(problem, on_cpu=False) == tol, (name, dtype)
    for dtype in TRITON_DTYPES:
        assert get_family("triton_moe").tolerance(Problem(8, 32, 64, 2, dtype), on_cpu=True) == INTERPRETER


def _family_of(row: dict, problems: dict) -> str:
    """Which family measured a recorded row: a Triton GEMM's, or the backend family of its problem."""
    if row["gemm"] != "layer":
        return "triton_moe"
    p = problems[row["problem"]]
    kind = registry.DENSE if p.get("kind") == "gemm" else registry.MOE
    (name,) = [n for n, f in registry.families().items()
               if f.step == registry.BACKENDS and f.problems == kind and f.dtype == p["dtype"]]
    return name


def recorded_errors() -> dict:
    """(family, dtype) -> [(error, status)] of every checked measurement in the committed recordings."""
    out: dict = {}
    for path in sorted([*ROOT.glob("tests/data/*.jsonl.gz"), *ROOT.glob("benchmarks/data/*.jsonl.gz")]):
        with gzip.open(path, "rt") as f:
            problems = json.loads(f.readline())["problems"]
            for row in map(json.loads, f):
                if row.get("error") is not None and row["status"] in (records.OK, records.WRONG_RESULT):
                    dtype = problems[row["problem"]]["dtype"]
                    out.setdefault((_family_of(row, problems), dtype), []).append((row["error"], row["status"]))
    return out


def test_the_tolerances_pass_every_correct_output_the_h200_recorded():
    """Each recorded verdict is what the committed tolerance says of its error: a tighter tolerance
    would call the H200's correct kernels wrong (bf16 Triton tiles at up to 1.7e-3, block-FP8 GEMM
    backends at up to 5.1e-2)."""
    seen = recorded_errors()
    assert {k for k in seen if k[0] == "triton_moe"} >= {("triton_moe", "bf16"), ("triton_moe", "fp8_w8a8_block")}
    assert len(seen) >= 6
    for key, rows in seen.items():
        tol = TOLERANCES[key]
        for err, status in rows:
            assert (status == records.OK) == (math.isfinite(err) and err <= tol), (key, err, status)


def tolerance_of(name: str, dtype: str, on_cpu: bool = False) -> float:
    return get_family(name).tolerance(Problem(8, 32, 64, 2, dtype), on_cpu=on_cpu)


BOUNDARY = [(name, dtype, False) for name, dtype in TOLERANCES] + [("triton_moe", d, True) for d in TRITON_DTYPES]


@pytest.mark.parametrize("name, dtype, on_cpu", BOUNDARY)
@pytest.mark.parametrize("shape", ["uniform", "spot"])
def test_check_output_passes_just_inside_and_fails_just_outside(name, dtype, on_cpu, shape):
    tol = tolerance_of(name, dtype, on_cpu)
    ref = torch.randn(64, 96, generator=torch.Generator().manual_seed(7))
    ok, reason, err = check_output(perturbed(ref, 0.9 * tol, shape), ref, tol)
    assert ok and reason == "" and err == pytest.approx(0.9 * tol, rel=1e-3)
    ok, reason, err = check_output(perturbed(ref, 1.1 * tol, shape), ref, tol)
    assert not ok and err == pytest.approx(1.1 * tol, rel=1e-3)
    assert reason.startswith(f"relative error {1.1 * tol:.3g} > tolerance {tol:.3g}")


def test_an_error_of_exactly_the_tolerance_passes_and_the_reason_names_where_the_output_is_off():
    from autotune.measure.timing import rel_error

    ref = torch.arange(1.0, 21.0).reshape(4, 5)
    out = ref.clone()
    out[2, 3] += 3.0
    err = rel_error(out, ref)
    assert err == pytest.approx(3.0 / ref.norm().item()) and check_output(out, ref, err) == (True, "", err)
    ok, reason, _ = check_output(out, ref, err / 2)
    assert not ok and "furthest off at (2, 3): 17 vs 14)" in reason
    out[0, 1] = out[2, 4] = float("nan")
    ok, reason, e = check_output(out, ref, 1.0)
    assert not ok and math.isnan(e) and reason.startswith("2 of 20 outputs NaN/Inf or never written (10%; first at (0, 1): nan)")
    assert math.isnan(rel_error(out, ref)) and rel_error(torch.ones(4), torch.zeros(4)) == 2.0   # |out| over 1



@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_reference_with_nan_or_inf_fails_every_output(bad):
    """An error that cannot be computed is never a pass: against a float32 reference holding a NaN or an
    Inf, a finite output fails at any tolerance (written `err > tol`, a NaN error compares false and passed)."""
    ref = torch.ones(4, 5)
    ref[1, 2] = bad
    for out in (torch.ones(4, 5), ref.nan_to_num(posinf=1.0, neginf=1.0)):
        ok, reason, err = check_output(out, ref, 1e6)
        assert not ok and math.isnan(err) and reason.startswith("relative error nan > tolerance")


def measure(family_spec: str, config: dict, options: dict | None = None, M: int = 4):
    """One measurement by the worker's own Measurer, in this process, on the CPU."""
    problem = Problem(8, 32, 64, 2, "bf16", batch_sizes=(M,))
    settings = Settings(family=family_spec, options={family_spec: options or {}}, on_cpu=True, routings=1, repeats=3)
    m, fatal = Measurer(settings, None).measure(Task(problem.to_dict(), problem.key, "g", KernelConfig.from_entry(config), [M],
                                                     family=family_spec), problem, M)
    assert not fatal
    return m


@pytest.mark.parametrize("name, dtype, on_cpu", BOUNDARY)
def test_a_trial_passes_just_inside_its_tolerance_and_fails_just_outside(name, dtype, on_cpu):
    tol = tolerance_of(name, dtype, on_cpu)
    options = {"like": name, "dtype": dtype, "as_gpu": not on_cpu}
    for shape in ("uniform", "spot"):
        inside = measure(CheckedOutputs.spec, {"writes": "all", "error": 0.9, "shape": shape}, options)
        assert inside.ok and inside.error == pytest.approx(0.9 * tol, rel=1e-3), inside.reason
        outside = measure(CheckedOutputs.spec, {"writes": "all", "error": 1.1, "shape": shape}, options)
        assert outside.status == records.WRONG_RESULT and outside.time_us is None
        assert outside.error == pytest.approx(1.1 * tol, rel=1e-3) and "relative error" in outside.reason


@pytest.mark.parametrize("name, dtype", TOLERANCES)
def test_a_trial_passes_just_inside_the_pinned_tolerance_and_fails_just_outside(name, dtype):
    """The same through the Measurer, at the contract's numbers rather than the family's: a family whose
    tolerance drifted 10x either way fails here as well as in the table above."""
    options = {"like": name, "dtype": dtype, "as_gpu": True}
    tol = TOLERANCES[(name, dtype)]
    assert measure(CheckedOutputs.spec, {"writes": "all", "rel": 0.9 * tol}, options).ok
    assert measure(CheckedOutputs.spec, {"writes": "all", "rel": 1.1 * tol}, options).status == records.WRONG_RESULT


@pytest.mark.parametrize("writes", ["none", "half"])
def test_an_output_the_launch_did_not_write_fails_though_its_buffer_held_a_right_answer(writes):
    assert measure(CheckedOutputs.spec, {"writes": "all", "error": 0.0}).ok
    m = measure(CheckedOutputs.spec, {"writes": writes, "error": 0.0})
    assert m.status == records.WRONG_RESULT, m.reason
    share = "100%" if writes == "none" else "50%"
    assert f"outputs NaN/Inf or never written ({share}" in m.reason


TRITON_CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 2}


def _triton_measurer():
    problem = Problem(8, 32, 64, 2, "bf16", batch_sizes=(2,))
    measurer = Measurer(Settings(family="triton_moe", on_cpu=True, routings=1, repeats=3), None)

    def one(gemm="gate_up"):
        return measurer.measure(Task(problem.to_dict(), problem.key, gemm, KernelConfig.from_entry(TRITON_CFG), [2]), problem, 2)[0]
    return one


@pytest.mark.parametrize("gemm", ["gate_up", "down"])
def test_the_triton_family_checks_its_own_output_buffer_at_its_interpreter_tolerance(monkeypatch, gemm):
    """The real family (SGLang's inputs, the float32 reference, the output buffer the kernel writes
    into), its launch replaced by one that writes the reference off by 0.9x / 1.1x the tolerance."""
    from autotune.families.triton_moe import TritonMoe

    error = {}

    def run(self, config, inputs, routing, **kw):
        inputs.C.copy_(perturbed(self.reference(inputs), error["rel"]).view_as(inputs.C))
        return inputs.C
    monkeypatch.setattr(TritonMoe, "run", run)
    one = _triton_measurer()
    error["rel"] = 0.9 * INTERPRETER
    m = one(gemm)
    assert m.ok and m.error == pytest.approx(0.9 * INTERPRETER, rel=1e-2)
    error["rel"] = 1.1 * INTERPRETER
    m = one(gemm)
    assert m.status == records.WRONG_RESULT and "relative error" in m.reason


def test_a_triton_launch_that_writes_nothing_fails_after_a_right_one_filled_its_buffer(monkeypatch):
    """SGLang's kernel on Triton's interpreter fills the shared output buffer with the right answer;
    a later config whose launch writes nothing finds that answer still there: only the poison
    before each checked launch tells them apart."""
    from autotune.families.triton_moe import TritonMoe

    one = _triton_measurer()
    first = one()
    assert first.ok and first.error < INTERPRETER
    monkeypatch.setattr(TritonMoe, "run", lambda self, config, inputs, routing, **kw: inputs.C)
    m = one()
    assert m.status == records.WRONG_RESULT and "outputs NaN/Inf or never written (100%" in m.reason
