"""The gate's statistics: noise is not a gain, a real gain is, a regression fails the gate."""
import math
import random

import pytest

from autotune.validate.gate import (
    Judging,
    KnownSpread,
    Sides,
    compare,
    comparisons_from_runs,
    gate,
    robust_sigma,
    spread,
)


def _noisy(base, factor, rel_noise, n, seed):
    rng = random.Random(seed)
    return [base * factor * (1 + rng.uniform(-rel_noise, rel_noise)) for _ in range(n)]


def test_robust_sigma_small_and_large_samples():
    assert robust_sigma([1.0]) is None
    assert robust_sigma([1.0, 1.1]) == pytest.approx(0.1 / 1.128)
    assert robust_sigma([1.0, 1.05, 1.1]) == pytest.approx(0.1 / 1.693)
    # beyond 5: MAD ignores one wild value
    assert robust_sigma([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 5.0]) == pytest.approx(1.4826 * 0.01, rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_pure_noise_is_within_noise(seed):
    b = _noisy(1000, 1.0, 0.03, 5, seed)
    t = _noisy(1000, 1.0, 0.03, 5, seed + 100)
    c = compare("concurrency 8", Sides(b, t), x=8)
    assert c.verdict == "within noise", c.describe()
    assert gate([c]).passed


def test_real_gain_is_a_gain():
    b = _noisy(1000, 1.0, 0.01, 5, 1)
    t = _noisy(1000, 1.08, 0.01, 5, 2)
    c = compare("batch 1", Sides(b, t), x=1)
    assert c.verdict == "gain" and 1.05 < c.ratio < 1.11 and c.threshold < 0.03


def test_regression_fails_the_gate_naming_the_point_and_both_figures():
    b = [1000.0, 1010.0, 995.0, 1005.0, 1002.0]
    t = [930.0, 941.0, 925.0, 936.0, 931.0]
    c = compare("concurrency 32", Sides(b, t), x=32)
    assert c.verdict == "regression"
    g = gate([compare("concurrency 1", Sides([50.0, 51, 50], [52.0, 53, 52]), x=1), c])
    assert not g.passed and [r.point for r in g.regressions] == ["concurrency 32"]
    assert g.lines[0] == "tuned vs baseline: faster beyond noise at 1 of 2 points, slower beyond noise at 1"
    line = g.lines[1]
    assert "concurrency 32" in line and "tuned 931.0 tok/s" in line and "baseline 1002.0 tok/s" in line
    assert "FAILED" in g.lines[-1]


def test_allow_regression_records_and_passes():
    c = compare("batch 64", Sides([100.0, 101, 99], [90.0, 91, 89]), x=64)
    g = gate([c], allow_regression=True)
    assert g.passed and g.regressions == [c] and "allowed" in g.message and "regression at batch 64" in g.message


def test_pairing_cancels_drift_that_would_swamp_an_unpaired_comparison():
    # The machine slows down over the repeats; within each (ABBA) pair tuned is 3% faster.
    drift = [1000, 900, 820, 760, 700]
    b = [d * 1.00 for d in drift]
    t = [d * 1.03 for d in drift]
    paired = compare("batch 8", Sides(b, t), x=8)
    assert paired.verdict == "gain" and paired.ratio == pytest.approx(1.03)
    unpaired = compare("batch 8", Sides(b, t[:-1]), x=8)     # one run lost: no pairs
    assert not unpaired.paired and unpaired.verdict == "within noise"


def test_small_change_below_the_floor_and_a_noisy_regression_are_not_called():
    c = compare("batch 1", Sides([100.0] * 4, [99.5] * 4))   # -0.5 %, no noise at all
    assert c.verdict == "within noise" and c.threshold == 0.01
    c = compare("batch 1", Sides([100.0, 100, 100, 100], [108.0, 86, 104, 90]))  # -3 % median, +-10 % pairs
    assert c.ratio < 0.98 and c.verdict == "within noise" and c.threshold > 0.03


def test_one_run_per_side_is_not_judged_however_large_the_change():
    c = compare("batch 1", Sides([100.0], [95.0]))
    assert c.verdict == "not judged" and not c.judged
    assert c.sigma is None and c.threshold == 0.01 and "no noise to borrow" in c.noise
    # with the method's known spread each side borrows it: the ratio's noise is sqrt(2) x that
    c = compare("batch 1", Sides([100.0], [80.0]), known_spread=KnownSpread(0.03, "test"))
    assert c.verdict == "not judged" and c.sigma == pytest.approx(math.sqrt(2) * 0.03 * 0.8)
    assert c.threshold == pytest.approx(2 * 1.2533 * c.sigma, rel=1e-4)


def test_a_one_run_side_is_not_judged_and_never_counts_as_zero_noise():
    """SGLang 0.5.16's server arms: the default arm had one start, tuned two that agreed within
    0.03%. The one start was counted as zero noise, so +19% against a 1% threshold was a "gain"."""
    c = compare("server bf16 vs default, batch 32", Sides([1656.3], [1970.5, 1970.7]))
    assert c.verdict == "not judged"
    # its noise is the tuned side's scatter, not zero: the threshold is both sides' scatter
    tuned_sigma = (1970.7 - 1970.5) / 1.128 / 1970.6
    assert c.sigma == pytest.approx(math.hypot(tuned_sigma, tuned_sigma) * c.ratio)
    assert "baseline: 1 run, noise borrowed from the tuned side's scatter" in c.noise
    # and the method's known spread, when it is the larger
    c = compare("server bf16 vs default, batch 32", Sides([1656.3], [1970.5, 1970.7]),
                known_spread=KnownSpread(0.035, "committed runs"))
    assert c.verdict == "not judged" and c.sigma == pytest.approx(math.hypot(0.035, tuned_sigma) * c.ratio)
    assert "instance-to-instance spread (3.5%: committed runs), the larger of the two" in c.noise
    assert c.threshold > 0.09                                 # 2 x 1.2533 x ~4% over one run
    # a regression on one run is not called either: one start cannot tell it from an unlucky one
    assert compare("batch 8", Sides([100.0, 101.0], [80.0])).verdict == "not judged"


def test_the_other_sides_scatter_is_borrowed_when_it_is_the_larger():
    c = compare("batch 8", Sides([100.0, 110.0, 90.0], [104.0]), known_spread=KnownSpread(0.01, "small"))
    baseline_sigma = 20 / 1.693 / 100
    assert c.sigma == pytest.approx(math.hypot(baseline_sigma, baseline_sigma) * c.ratio)
    assert "tuned: 1 run, noise borrowed from the baseline side's scatter (11.8%)" in c.noise


def test_unequal_run_counts_of_two_or_more_are_judged_on_both_sides_own_scatter():
    b, t = [100.0, 100.2, 99.8], [104.0, 103.0]
    c = compare("batch 64", Sides(b, t), known_spread=KnownSpread(0.5, "never used: both sides have runs"))
    assert not c.paired and c.ratio == pytest.approx(103.5 / 100.0)
    sb, st = 0.4 / 1.693 / 100.0, 1.0 / 1.128 / 103.5
    assert c.sigma == pytest.approx(math.hypot(sb, st) * c.ratio)
    assert c.threshold == pytest.approx(2 * 1.2533 * c.sigma / math.sqrt(2), rel=1e-4)
    assert c.verdict == "gain" and "own scatter" in c.noise


def test_bad_samples_are_refused():
    with pytest.raises(ValueError):
        compare("batch 1", Sides([], [1.0]))
    with pytest.raises(ValueError):
        compare("batch 1", Sides([0.0], [1.0]))


def test_runs_are_grouped_per_point_and_paired_by_repeat():
    runs = []
    for rep, (b, t) in enumerate([(100, 104), (90, 93.6), (95, 98.8)]):
        # recorded in ABBA order: the pairing must come from the repeat index, not the order
        sides = [("baseline", b), ("tuned", t)] if rep % 2 == 0 else [("tuned", t), ("baseline", b)]
        for side, v in sides:
            runs.append({"side": side, "repeat": rep, "kind": "serving", "x": 8, "metrics": {"output_throughput": v}})
            runs.append({"side": side, "repeat": rep, "kind": "one_batch", "x": 1,
                         "metrics": {"output_throughput": v / 10}})
    cs = comparisons_from_runs(runs, label=lambda k, x: f"{k} {x}")
    assert [c.point for c in cs] == ["one_batch 1", "serving 8"]
    assert all(c.paired and c.ratios == pytest.approx([1.04] * 3) for c in cs)
    assert all(c.verdict == "gain" for c in cs)


def test_a_lost_run_leaves_its_point_not_judged_and_the_others_judged():
    runs = []
    for rep, (b, t) in enumerate([(100, 120), (101, 121), (99, 119)]):
        for x in (1, 8):
            for side, v in (("baseline", b), ("tuned", t)):
                if not (x == 8 and side == "baseline" and rep > 0):       # the baseline's later starts failed at 8
                    runs.append({"side": side, "repeat": rep, "kind": "serving", "x": x, "metrics": {"tok_s": v}})
    cs = comparisons_from_runs(runs, "tok_s", against="shipped", known_spread=lambda kind: KnownSpread(0.03, "t"))
    assert [(c.point, c.verdict) for c in cs] == [("serving 1", "gain"), ("serving 8", "not judged")]
    assert all(c.against == "shipped" for c in cs) and "instance-to-instance" in cs[1].noise


def test_the_gate_says_each_points_verdict_and_beyond_noise_at_k_of_n_per_baseline():
    cs = [compare("batch 1", Sides([100.0, 101, 99], [110.0, 111, 109], against="shipped")),   # gain
          compare("batch 8", Sides([100.0, 104, 96], [101.0, 105, 97], against="shipped")),    # within noise
          compare("batch 1", Sides([100.0, 101, 99], [120.0, 121, 119], against="default")),   # gain
          compare("batch 8", Sides([100.0], [130.0, 131], against="default"))]                 # not judged
    g = gate(cs)
    assert [c.verdict for c in cs] == ["gain", "within noise", "gain", "not judged"]
    assert g.passed
    assert g.lines[0] == "tuned vs shipped: faster beyond noise at 1 of 2 points, within noise at 1"
    assert g.lines[1] == ("tuned vs default: faster beyond noise at 1 of 2 points, not judged at 1 "
                          "(a side with fewer than 2 runs)")
    assert g.lines[-1] == ("gate passed: tuned is not slower than baseline beyond noise at any of 3 judged points "
                           "(1 of 4 not judged: a side with fewer than 2 runs)")
    assert g.points[0] == f"batch 1: +10.0% against a threshold of {cs[0].threshold:.1%} (3 tuned x 3 shipped runs): gain"
    assert g.points[3].endswith("(2 tuned x 1 default runs): not judged")
    assert g.to_dict()["counts"] == {
        "shipped": {"points": 2, "gain": 1, "within noise": 1, "regression": 0, "not judged": 0},
        "default": {"points": 2, "gain": 1, "within noise": 0, "regression": 0, "not judged": 1}}


def test_the_gate_fails_when_no_point_could_be_judged():
    g = gate([compare("batch 1", Sides([100.0], [130.0])), compare("batch 8", Sides([100.0], [90.0]))])
    assert not g.passed and g.regressions == []
    assert g.lines[-1] == "gate FAILED: none of 2 tested points could be judged (each needs at least 2 runs per side)"
    assert not gate([compare("batch 1", Sides([100.0], [130.0]))], allow_regression=True).passed


def test_a_change_of_exactly_the_threshold_is_not_called_either_way():
    # no scatter: the threshold is the 1% floor, and a ratio of exactly 0.99 or 1.01 is not beyond it
    assert compare("batch 1", Sides([100.0] * 4, [99.0] * 4)).verdict == "within noise"
    assert compare("batch 1", Sides([100.0] * 4, [101.0] * 4)).verdict == "within noise"
    assert compare("batch 1", Sides([100.0] * 4, [98.9] * 4)).verdict == "regression"


def test_an_empty_side_is_refused_by_name_and_a_small_positive_throughput_is_not():
    with pytest.raises(ValueError, match="batch 1: no runs on the tuned side"):
        compare("batch 1", Sides([1.0], []))
    with pytest.raises(ValueError, match="batch 1: no runs on the baseline side"):
        compare("batch 1", Sides([], [1.0]))
    with pytest.raises(ValueError, match=r"batch 1: throughputs must be positive and finite, got \[1.0\] / \[inf\]"):
        compare("batch 1", Sides([1.0], [math.inf]))
    assert compare("batch 1", Sides([0.5, 0.5], [0.6, 0.6])).verdict == "gain"   # requests per second, say


def test_each_sides_spread_is_its_interquartile_range_over_its_median():
    c = compare("batch 8", Sides([90.0, 95.0, 100.0, 105.0, 110.0], [100.0, 102.0, 101.0]))
    assert c.baseline_spread == pytest.approx((107.5 - 92.5) / 100.0)    # quartiles of five
    assert c.tuned_spread == pytest.approx((102.0 - 100.0) / 101.0)        # min..max below four
    assert math.isnan(spread([])) and spread([0.0, 0.0]) == 0.0


def test_the_grouping_hands_each_point_the_callers_settings():
    runs = [{"side": side, "repeat": rep, "kind": kind, "x": x, "metrics": {"ms": v * (1.1 if side == "tuned" else 1)}}
            for kind, x in (("server", 8), ("one_batch", 1)) for rep, v in enumerate((100.0, 103.0, 97.0))
            for side in ("baseline", "tuned")]
    known = {"server": KnownSpread(0.2, "server starts")}
    cs = comparisons_from_runs(runs, "ms", unit="ms", judging=Judging(min_effect=0.3, z=3.0), against="default",
                               known_spread=lambda kind: known.get(kind))
    assert [(c.point, c.x, c.unit, c.against) for c in cs] == [("one_batch 1", 1, "ms", "default"),
                                                              ("server 8", 8, "ms", "default")]
    assert all(c.threshold == 0.3 and c.verdict == "within noise" for c in cs)     # +10% under a 30% floor
    one = [r for r in runs if not (r["side"] == "baseline" and r["repeat"] > 0)]    # one baseline run each
    wide = comparisons_from_runs(one, "ms", judging=Judging(z=3.0), known_spread=lambda kind: known.get(kind))
    assert [c.sigma is not None for c in wide] == [True, True]
    assert wide[1].threshold == pytest.approx(3 * math.sqrt(math.pi / 2) * wide[1].sigma)
    assert "server starts" in wide[1].noise
    assert "server starts" not in wide[0].noise
    # by default the same z and floor as a single comparison
    noisy = [{**r, "metrics": {"ms": r["metrics"]["ms"] * (1 + 0.02 * r["repeat"] * (r["side"] == "tuned"))}}
             for r in runs if r["kind"] == "server"]
    (default,) = comparisons_from_runs(noisy, "ms")
    b, t = ([r["metrics"]["ms"] for r in noisy if r["side"] == side] for side in ("baseline", "tuned"))
    assert default.threshold == compare("x", Sides(b, t)).threshold > 0.01          # set by the scatter, at z = 2
    assert default.unit == "tok/s" and default.against == "baseline" and default.noise == "scatter of the 3 paired ratios"
    # points in (kind, batch) order; a point with runs on one side only is left out, not an error
    mixed = [{**r, "kind": "a" if r["kind"] == "server" else "b"} for r in runs]
    mixed.append({"side": "baseline", "repeat": 0, "kind": "c", "x": 2, "metrics": {"ms": 1.0}})
    assert [c.point for c in comparisons_from_runs(mixed, "ms")] == ["a 8", "b 1"]


def test_a_side_with_a_repeat_more_is_compared_whole_and_unpaired():
    runs = [{"side": side, "repeat": rep, "kind": "server", "x": 8, "metrics": {"m": 100.0 + rep}}
            for side, reps in (("baseline", (0, 1, 2)), ("tuned", (0, 1))) for rep in reps]
    (c,) = comparisons_from_runs(runs, "m")
    assert not c.paired and c.ratios == [] and c.baseline == [100.0, 101.0, 102.0] and c.tuned == [100.0, 101.0]
    (c,) = comparisons_from_runs([r for r in runs if r["repeat"] in (0, 1)], "m")
    assert c.paired and c.ratios == [1.0, 1.0]


def test_the_gate_record_counts_each_baseline_apart():
    cs = [compare(f"batch {x}", Sides([100.0, 101, 99], [110.0, 111, 109], against="shipped")) for x in (1, 8, 32)]
    cs.append(compare("batch 1", Sides([100.0, 101, 99], [80.0, 81, 79], against="default")))
    d = gate(cs, allow_regression=True).to_dict()
    assert d == {"passed": True, "allow_regression": True, "regressions": ["batch 1"], "lines": d["lines"],
                 "points": [c.verdict_line() for c in cs],
                 "counts": {"shipped": {"points": 3, "gain": 3, "within noise": 0, "regression": 0, "not judged": 0},
                            "default": {"points": 1, "gain": 0, "within noise": 0, "regression": 1, "not judged": 0}}}
    assert d["lines"][-1] == "gate: 1 regression(s) recorded and allowed (--allow-regression)"


def test_runs_of_other_repeats_on_each_side_are_never_paired_by_position():
    """Baseline repeats 0, 1, 2 and tuned 0, 1, 3: as many runs, but repeat 2 is not repeat 3, so the
    point is judged on each side's own scatter, not on ratios of runs that were never side by side."""
    from autotune.validate.gate import comparisons_from_runs

    def run(side, repeat, v):
        return {"side": side, "repeat": repeat, "kind": "decode", "x": 1, "metrics": {"output_throughput": v}}
    runs = [run("baseline", 0, 100.0), run("baseline", 1, 101.0), run("baseline", 2, 99.0),
            run("tuned", 0, 110.0), run("tuned", 1, 111.0), run("tuned", 3, 109.0)]
    (c,) = comparisons_from_runs(runs)
    assert "unpaired" in c.noise, c.noise
    same = [run("baseline", i, v) for i, v in enumerate((100.0, 101.0, 99.0))] + \
           [run("tuned", i, v) for i, v in enumerate((110.0, 111.0, 109.0))]
    (p,) = comparisons_from_runs(same)
    assert "paired" in p.noise and "unpaired" not in p.noise, p.noise
