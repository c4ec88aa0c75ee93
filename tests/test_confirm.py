"""The per-M pick confirmed as SGLang runs the layer: a baseline pair faster than the pick beyond
the spread is written instead (with the margin), anything within the spread keeps the pick, and the
layer is timed with exactly the pairs the selection re-measured."""
import pytest

from autotune.families.triton_moe.confirm import confirm_by_layer
from autotune.gpus.device import DeviceInfo
from autotune.problems.models import Problem
from autotune.search.finalists import Choice

H200 = DeviceInfo("NVIDIA H200", 90, 232448, kind="gpu")
PROBLEM = Problem(512, 128, 4096, 10, "bf16")


def pair(bm, bn):
    cfg = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
    return cfg, dict(cfg)


def choice(M, shipped=True):
    rows = [{"source": "tuned", "gate_up": pair(16, 64)[0], "down": pair(16, 64)[1], "gate_up_us": 10.0,
             "down_us": 5.0, "total_us": 15.0},
            {"source": "default", "gate_up": pair(64, 64)[0], "down": pair(64, 64)[1], "gate_up_us": 14.0,
             "down_us": 7.0, "total_us": 21.0}]
    if shipped:
        rows.append({"source": "shipped", "gate_up": pair(32, 128)[0], "down": pair(32, 128)[1], "gate_up_us": 11.0,
                     "down_us": 6.0, "total_us": 17.0})
    g, d = pair(16, 64)
    return Choice.pair(M, (g, d), (10.0, 5.0), "tuned", {"default": 21.0, "shipped": 17.0 if shipped else None}, rows)


def timer_for(times, spread=0.005, seen=None):
    """moe_layer.time_sides' rows: times[M] = (pick, shipped side, default side) µs."""
    def timer(sides, Ms, repeats):
        rows = []
        for M in Ms:
            if seen is not None:
                seen[M] = {s: sides.side_config(M, s) for s in ("tuned", "default", "heuristic")}
            t, s, d = times[M]
            rows.append({"M": M, "tuned µs": t, "default µs": s, "heuristic µs": d,
                         **{f"{x} spread": spread for x in ("tuned", "default", "heuristic")}})
        return rows
    return timer


def test_a_baseline_faster_as_sglang_runs_the_layer_replaces_the_pick_and_says_by_how_much():
    choices = {1: choice(1), 8: choice(8), 64: choice(64)}
    seen = {}
    layer = confirm_by_layer(PROBLEM, choices, H200, timer=timer_for(
        {1: (20.0, 18.0, 25.0), 8: (30.0, 33.0, 40.0), 64: (50.0, 49.8, 60.0)}, seen=seen))
    # M=1: shipped 10% faster than the pick in the layer, though the per-GEMM sums had the pick ahead
    assert layer[1]["switched_to"] == "shipped" and layer[1]["margin"] == pytest.approx(20 / 18 - 1, abs=1e-4)
    assert (choices[1].gate_up, choices[1].down, choices[1].source) == (*pair(32, 128), "shipped")
    assert choices[1].total_us == 17.0          # the baseline's own re-measured GEMM times travel with it
    # M=8: the pick is faster; M=64: shipped 0.4% faster, inside the 1% floor: the pick stays
    assert layer[8]["kept"] == "tuned" and layer[64]["kept"] == "tuned" and choices[64].source == "tuned"
    assert layer[8]["us"] == {"pick": 30.0, "shipped": 33.0, "default": 40.0}
    # the layer ran exactly the pairs the selection re-measured, labelled
    assert seen[1]["tuned"].gate_up == pair(16, 64)[0] and seen[1]["default"].gate_up == pair(32, 128)[0]
    assert seen[1]["heuristic"].gate_up == pair(64, 64)[0] and seen[1]["default"].source == "SGLang's shipped pair"


def test_without_a_shipped_pair_both_baseline_sides_run_the_default_and_it_can_win():
    choices = {1: choice(1, shipped=False)}
    seen = {}
    layer = confirm_by_layer(PROBLEM, choices, H200, timer=timer_for({1: (20.0, 15.0, 15.2)}, seen=seen))
    assert seen[1]["default"].gate_up == seen[1]["heuristic"].gate_up == pair(64, 64)[0]
    assert layer[1]["switched_to"] == "default" and choices[1].source == "default"


def test_the_spread_decides_what_is_noise():
    choices = {1: choice(1)}
    layer = confirm_by_layer(PROBLEM, choices, H200, timer=timer_for({1: (20.0, 18.5, 25.0)}, spread=0.10))
    assert layer[1]["kept"] == "tuned" and layer[1]["spread"] == 0.10


@pytest.mark.slow
def test_the_layer_runs_the_given_pairs_in_the_interpreter():
    """Given pairs (MoeSides' `configs`) through SGLang's kernels in Triton's interpreter: each given pair is checked against
    the float32 reference and timed (the numbers are the interpreter's: meaningless for speed)."""
    from autotune.families.triton_moe.confirm import baseline_rows
    from autotune.gpus.device import cpu_interpreter
    from autotune.families.triton_moe.moe_layer import MoeSides, SideConfig, time_sides

    tiny = Problem(8, 32, 64, 2, "bf16")
    c = choice(2)
    pairs = {(2, "tuned"): SideConfig(c.gate_up, c.down, True, "the pick")}
    for side, row in baseline_rows(c).items():
        pairs[2, side] = SideConfig(row["gate_up"], row["down"], True, row["source"])
    sides = MoeSides(tiny, cpu_interpreter(), ".", configs=pairs, on_cpu=True, inner_repeats=1)
    [row] = time_sides(sides, [2], repeats=1)
    assert row["default source"] == "shipped" and row["heuristic source"] == "default"
    assert all(row[f"{s} error"] < 1e-3 for s in ("tuned", "default", "heuristic"))


# --- the layer check's own rules: each dtype's tolerance, a side's time the median of its repeats --------

def _given_sides(problem, device, on_cpu):
    """MoeSides whose pairs are given (no loader asked) for M=2."""
    from autotune.families.triton_moe.moe_layer import SIDES, MoeSides, SideConfig

    g, d = pair(16, 64)
    return MoeSides(problem, device, ".", on_cpu=on_cpu, inner_repeats=1,
                    configs={(2, s): SideConfig(g, d, True, s) for s in SIDES})


@pytest.mark.parametrize("dtype, tol", [("bf16", 0.02), ("fp8_w8a8_block", 0.08)])
def test_on_a_gpu_the_layer_check_holds_each_dtype_to_its_own_tolerance(dtype, tol):
    """On a GPU each side's layer is checked against the float32 reference at the tolerance of the family
    that runs that dtype's layer (bf16 0.02, block FP8 0.08: tests/test_correctness_check.py pins them):
    a layer off by 0.9x the tolerance passes, one off by 1.1x fails, so bf16 is never judged at FP8's."""
    import torch

    from autotune.adapters.moe_checkpoint import reference
    from autotune.families.triton_moe.moe_layer import LayerError
    from tests.checked_family import perturbed

    p = Problem(8, 128, 256, 2, dtype)
    sides = _given_sides(p, H200, on_cpu=False)
    g = torch.Generator().manual_seed(5)
    w13, w2 = torch.randn(p.E, 2 * p.N, p.K, generator=g), torch.randn(p.E, p.K, p.N, generator=g)
    x = torch.randn(2, p.K, generator=g)
    ids, w = torch.tensor([[0, 3], [5, 3]]), torch.tensor([[0.6, 0.4], [0.3, 0.7]])
    up, down = (None, None, lambda e: w13[e]), (None, None, lambda e: w2[e])
    ref = reference(x, ids, w, up[2], down[2], p.N)
    sides.moe = lambda *a: perturbed(ref, 0.9 * tol)
    errors = sides.check_sides(up, down, x, ids, w)
    assert errors == {s: pytest.approx(0.9 * tol, rel=1e-3) for s in ("heuristic", "default", "tuned")}
    sides.moe = lambda *a: perturbed(ref, 1.1 * tol)
    with pytest.raises(LayerError, match=rf"relative error {1.1 * tol:.3g} > tolerance {tol:.3g}"):
        sides.check_sides(up, down, x, ids, w)


def test_a_sides_layer_time_is_the_median_of_its_repeats_and_its_spread_their_range():
    """Each side timed `repeats` times in turns: its time is the median of its repeats (one lucky fast
    repeat moves it no more than one slow one), its spread (max - min) / median."""
    from types import SimpleNamespace

    from autotune.gpus.device import cpu_interpreter
    from autotune.families.triton_moe.moe_layer import SIDES, time_sides

    sides = _given_sides(Problem(8, 32, 64, 2, "bf16"), cpu_interpreter(), on_cpu=True)
    sides.check_sides = lambda *a: {s: 0.0 for s in SIDES}
    repeats = {"tuned": [10.0, 2.0, 30.0, 20.0, 40.0], "default": [5.0, 6.0, 7.0, 8.0, 100.0],
               "heuristic": [9.0, 1.0, 9.0, 9.0, 9.0]}
    left, ran = {s: iter(ts) for s, ts in repeats.items()}, []
    sides.moe = lambda *a: ran.append(a[-1])

    def timer(fn):
        fn()
        return SimpleNamespace(median_us=next(left[ran[-1]]))
    sides.timer = timer
    [row] = time_sides(sides, [2], repeats=5)
    assert sorted(ran) == sorted(s for s in SIDES for _ in range(5))
    assert (row["tuned µs"], row["default µs"], row["heuristic µs"]) == (20.0, 7.0, 9.0)
    assert row["tuned spread"] == pytest.approx(38.0 / 20.0) and row["heuristic spread"] == pytest.approx(8.0 / 9.0)
