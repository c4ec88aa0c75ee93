"""The gate's statistics: noise is not a gain, a real gain is, a regression fails the gate."""
import random

import pytest

from autotune.validate.gate import compare, comparisons_from_runs, gate, robust_sigma


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
    c = compare("concurrency 8", b, t, x=8)
    assert c.verdict == "within noise", c.describe()
    assert gate([c]).passed


def test_real_gain_is_a_gain():
    b = _noisy(1000, 1.0, 0.01, 5, 1)
    t = _noisy(1000, 1.08, 0.01, 5, 2)
    c = compare("batch 1", b, t, x=1)
    assert c.verdict == "gain" and 1.05 < c.ratio < 1.11 and c.threshold < 0.03


def test_regression_fails_the_gate_naming_the_point_and_both_figures():
    b = [1000.0, 1010.0, 995.0, 1005.0, 1002.0]
    t = [930.0, 941.0, 925.0, 936.0, 931.0]
    c = compare("concurrency 32", b, t, x=32)
    assert c.verdict == "regression"
    g = gate([compare("concurrency 1", [50.0, 51, 50], [52.0, 53, 52], x=1), c])
    assert not g.passed and [r.point for r in g.regressions] == ["concurrency 32"]
    line = g.lines[0]
    assert "concurrency 32" in line and "tuned 931.0 tok/s" in line and "baseline 1002.0 tok/s" in line
    assert "FAILED" in g.lines[-1]


def test_allow_regression_records_and_passes():
    c = compare("batch 64", [100.0, 101, 99], [90.0, 91, 89], x=64)
    g = gate([c], allow_regression=True)
    assert g.passed and g.regressions == [c] and "allowed" in g.message and "regression at batch 64" in g.message


def test_pairing_cancels_drift_that_would_swamp_an_unpaired_comparison():
    # The machine slows down over the repeats; within each (ABBA) pair tuned is 3% faster.
    drift = [1000, 900, 820, 760, 700]
    b = [d * 1.00 for d in drift]
    t = [d * 1.03 for d in drift]
    paired = compare("batch 8", b, t, x=8)
    assert paired.verdict == "gain" and paired.ratio == pytest.approx(1.03)
    unpaired = compare("batch 8", b, t[:-1], x=8)            # one run lost: no pairs
    assert not unpaired.paired and unpaired.verdict == "within noise"


def test_small_change_below_the_floor_and_a_noisy_regression_are_not_called():
    c = compare("batch 1", [100.0] * 4, [99.5] * 4)          # -0.5 %, no noise at all
    assert c.verdict == "within noise" and c.threshold == 0.01
    c = compare("batch 1", [100.0, 100, 100, 100], [108.0, 86, 104, 90])  # -3 % median, +-10 % pairs
    assert c.ratio < 0.98 and c.verdict == "within noise" and c.threshold > 0.03


def test_single_run_has_no_noise_estimate_and_uses_the_floor():
    c = compare("batch 1", [100.0], [95.0])
    assert c.sigma is None and c.threshold == 0.01 and c.verdict == "regression"
    assert "noise not estimated" in c.describe()


def test_bad_samples_are_refused():
    with pytest.raises(ValueError):
        compare("batch 1", [], [1.0])
    with pytest.raises(ValueError):
        compare("batch 1", [0.0], [1.0])


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
