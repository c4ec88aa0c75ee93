"""The per-M pick made as SGLang serves the layer: each candidate pair (the selection's best tuned pairs and
SGLang's shipped and default ones) is written as SGLang's files and timed from its own folder; the fastest is
written, a tuned pair only beyond the noise of the faster baseline; what SGLang's loader reads from each folder
is exactly the pair meant (every entry stating num_warps and num_stages)."""
import pytest

from autotune.contract.config import KernelConfig
from autotune.families.triton_moe.confirm import TOP_PAIRS, candidates, confirm_by_layer, side_folders
from autotune.families.triton_moe.layer_timing import LayerError
from autotune.gpus.device import DeviceInfo
from autotune.problems.models import Problem
from autotune.search.finalists import Choice, Finalist, Scored

H200 = DeviceInfo("NVIDIA H200", 90, 232448, kind="gpu", versions={"triton": "3.6.0"})
PROBLEM = Problem(512, 128, 4096, 10, "bf16")


def cfg(bm, bn, **kw):
    return KernelConfig.from_entry({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                                    "num_warps": 4, "num_stages": 3, **kw})


def row(source, up, down, total):
    return Scored(Finalist(source, {"gate_up": up, "down": down}), {"gate_up": total * 0.6, "down": total * 0.4})


def choice(M, shipped=True, tuned=((16, 64, 15.0), (32, 64, 16.0))):
    rows = [row("tuned", cfg(bm, bn), cfg(bm, bn), t) for bm, bn, t in tuned]
    # SGLang's default config names no num_warps / num_stages: Triton's defaults run
    default = KernelConfig.from_entry({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1})
    rows.append(row("default", default, default, 21.0))
    if shipped:
        rows.append(row("shipped", cfg(32, 128, num_stages=4), cfg(32, 128, num_stages=4), 17.0))
    best = rows[0]
    return Choice.pair(M, (best.finalist.configs["gate_up"], best.finalist.configs["down"]),
                       (best.times["gate_up"], best.times["down"]), "tuned",
                       {"default": 21.0, "shipped": 17.0 if shipped else None}, rows)


def fake_timer(times, spread=0.005, seen=None):
    """layer_timing.time_sides' row for one M: times[M] = {side: µs}."""
    def timer(sides, M, repeats):
        if seen is not None:
            seen[M] = dict(sides)
        return {"M": M, **{f"{s} µs": times[M][s] for s in sides}, **{f"{s} spread": spread for s in sides}}
    return timer


def test_the_layer_decides_even_against_the_selections_sums(tmp_path):
    choices = {1: choice(1), 8: choice(8), 64: choice(64)}
    layer = confirm_by_layer(PROBLEM, choices, H200, root=tmp_path, timer=fake_timer({
        # M=1: the sums ranked tuned1 first, but as a layer it is slower than SGLang's shipped pair
        1: {"tuned1": 20.0, "tuned2": 21.0, "shipped": 18.0, "default": 25.0},
        # M=8: tuned2 is the fastest layer, beyond the noise of the faster baseline
        8: {"tuned1": 34.0, "tuned2": 30.0, "shipped": 33.0, "default": 40.0},
        # M=64: tuned1 0.4% faster than shipped, inside the 1% floor: SGLang's own pair is written
        64: {"tuned1": 49.8, "tuned2": 55.0, "shipped": 50.0, "default": 60.0}}))
    assert (choices[1].gate_up, choices[1].source) == (cfg(32, 128, num_stages=4), "shipped")
    assert layer[1]["picked"] == "shipped" and layer[1]["pick_was"] == "tuned" and layer[1]["vs_sglang"] == 0.0
    assert choices[1].total_us == 17.0          # the written pair's own re-measured GEMM times travel with it
    assert layer[8]["picked"] == "tuned2" and choices[8].gate_up == cfg(32, 64)
    assert layer[8]["vs_sglang"] == pytest.approx(30 / 33 - 1, abs=1e-4)
    assert layer[64]["picked"] == "shipped" and layer[64]["us"] == {"tuned1": 49.8, "tuned2": 55.0,
                                                                    "shipped": 50.0, "default": 60.0}


def test_without_a_shipped_pair_the_default_is_the_baseline_and_can_win(tmp_path):
    choices = {1: choice(1, shipped=False)}
    seen = {}
    layer = confirm_by_layer(PROBLEM, choices, H200, root=tmp_path, timer=fake_timer(
        {1: {"tuned1": 20.0, "tuned2": 22.0, "default": 15.0}}, seen=seen))
    assert set(seen[1]) == {"tuned1", "tuned2", "default"}
    assert layer[1]["picked"] == "default" and choices[1].source == "default"


def test_another_tuned_pair_replaces_the_pick_only_beyond_the_noise(tmp_path):
    choices = {1: choice(1), 8: choice(8)}
    layer = confirm_by_layer(PROBLEM, choices, H200, root=tmp_path, timer=fake_timer({
        1: {"tuned1": 20.0, "tuned2": 19.9, "shipped": 25.0, "default": 25.0},      # 0.5%: the pick stays
        8: {"tuned1": 20.0, "tuned2": 19.0, "shipped": 25.0, "default": 25.0}}))    # 5%: tuned2 is written
    assert layer[1]["picked"] == "tuned1" and "pick_was" not in layer[1] and choices[1].gate_up == cfg(16, 64)
    assert layer[8]["picked"] == "tuned2" and choices[8].gate_up == cfg(32, 64)


def test_the_spread_decides_what_is_noise(tmp_path):
    choices = {1: choice(1)}
    layer = confirm_by_layer(PROBLEM, choices, H200, root=tmp_path, timer=fake_timer(
        {1: {"tuned1": 16.5, "tuned2": 30.0, "shipped": 18.0, "default": 25.0}}, spread=0.10))
    assert layer[1]["picked"] == "shipped" and layer[1]["spread"]["tuned1"] == 0.10     # 8% faster, 10% spread


def test_at_most_the_top_tuned_pairs_are_timed_by_their_sums():
    many = choice(1, tuned=[(16, 16 * (i + 1), 15.0 + i) for i in range(TOP_PAIRS + 2)])
    names = candidates(many)
    assert [n for n in names if n.startswith("tuned")] == [f"tuned{i}" for i in range(1, TOP_PAIRS + 1)]
    assert names["tuned1"].total_us == 15.0 and {"shipped", "default"} <= set(names)


def test_each_side_folder_serves_exactly_its_pair_through_sglangs_loader(tmp_path):
    """What SGLang's own loader reads from each side's folder at each M is the candidate pair, every entry
    stating num_warps and num_stages (SGLang's default config included: Triton's defaults written out),
    the down config on the gate_up BLOCK_SIZE_M."""
    from autotune.adapters.sglang_loader import sglang_selection

    choices = {1: choice(1), 8: choice(8, tuned=((64, 128, 15.0),))}
    cands = {M: candidates(c) for M, c in choices.items()}
    folders = side_folders(PROBLEM, H200, cands, tmp_path)
    assert folders["shipped"] is None
    for M, sides in cands.items():
        for name, r in sides.items():
            if name == "shipped":
                continue
            up, down, found = sglang_selection(PROBLEM, M, H200, folders[name])
            if name == "default":
                assert not found and up["BLOCK_SIZE_N"] == 32      # an empty folder: SGLang's default config
                continue
            g, d = r.finalist.configs["gate_up"], r.finalist.configs["down"]
            assert found and up == g.to_entry() and down == d.with_params(BLOCK_SIZE_M=g["BLOCK_SIZE_M"]).to_entry()
            assert {"num_warps", "num_stages"} <= set(up) and {"num_warps", "num_stages"} <= set(down)


def test_a_folder_that_serves_another_pair_is_refused(tmp_path):
    """A timer whose row says SGLang loaded something else than the candidate (the nearest key of a folder that
    lacks M, say) stops the check: a number for another pair never decides."""
    choices = {1: choice(1)}

    def timer(sides, M, repeats):
        out = fake_timer({1: {s: 20.0 for s in sides}})(sides, M, repeats)
        out["tuned1 loads"] = [cfg(64, 64), cfg(64, 64)]
        return out
    with pytest.raises(LayerError, match="SGLang loads .* for the tuned1 side"):
        confirm_by_layer(PROBLEM, choices, H200, root=tmp_path, timer=timer)


# --- the layer check's own rules: each dtype's tolerance, a side's time the median of its repeats --------

@pytest.mark.parametrize("dtype, tol", [("bf16", 0.02), ("fp8_w8a8_block", 0.08)])
def test_on_a_gpu_the_layer_check_holds_each_dtype_to_its_own_tolerance(dtype, tol):
    """Each side's layer is checked against the float32 reference at the tolerance of the family that runs that
    dtype's layer (bf16 0.02, block FP8 0.08: tests/measure/test_correctness_check.py pins them): a layer off by 0.9x the
    tolerance passes, one off by 1.1x fails, so bf16 is never judged at FP8's."""
    import torch

    from autotune.families.triton_moe.layer_timing import LayerTimer
    from tests.fakes.checked_family import perturbed

    ref = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    timer = LayerTimer.__new__(LayerTimer)          # what a GPU would make, without the GPU: the check alone
    timer.problem, timer.held_s = Problem(8, 128, 256, 2, dtype), 0.0
    timer._inputs = {2: (None, None, None, ref)}
    timer.loads = lambda folder, M: ({}, {})
    timer.launch = lambda folder, M: (lambda i: perturbed(ref, 0.9 * tol))
    assert timer.error("f", 2) == pytest.approx(0.9 * tol, rel=1e-3)
    timer.launch = lambda folder, M: (lambda i: perturbed(ref, 1.1 * tol))
    with pytest.raises(LayerError, match=rf"relative error {1.1 * tol:.3g} > tolerance {tol:.3g}"):
        timer.error("f", 2)


def test_a_sides_layer_time_is_the_median_of_its_repeats_and_its_spread_their_range():
    """Each side timed `repeats` times in turns: its time is the median of its repeats (one lucky fast repeat
    moves it no more than one slow one), its spread (max - min) / median, at least its replays' own."""
    from types import SimpleNamespace

    from autotune.families.triton_moe.layer_timing import time_sides

    repeats = {"tuned": [10.0, 2.0, 30.0, 20.0, 40.0], "shipped": [5.0, 6.0, 7.0, 8.0, 100.0],
               "default": [9.0, 1.0, 9.0, 9.0, 9.0]}
    left, ran = {s: iter(ts) for s, ts in repeats.items()}, []

    def time(folder, M):
        ran.append(folder)
        return SimpleNamespace(median_us=next(left[folder]), spread=0.01)
    timer = SimpleNamespace(loads=lambda folder, M: ({}, {}), error=lambda folder, M: 0.0, time=time)
    [row] = time_sides(timer, {s: s for s in repeats}, [2], repeats=5)
    assert sorted(ran) == sorted(s for s in repeats for _ in range(5))
    assert (row["tuned µs"], row["shipped µs"], row["default µs"]) == (20.0, 7.0, 9.0)
    assert row["tuned spread"] == pytest.approx(38.0 / 20.0) and row["default spread"] == pytest.approx(8.0 / 9.0)
