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
