"""What keeps timings comparable across processes (H200, session 11): the first CUDA-graph timing after
another process's kernel is not like the later ones, so every timing follows a throwaway one; a tactic
is pinned over FlashInfer's default only when it wins by more than the noise, since smaller gains did
not carry to a fresh process."""
import pytest

from autotune.contract.config import KernelConfig
from autotune.measure import timing
from autotune.search.sieve import pins_over_default
from autotune.measure.timing import Timing
from autotune.measure.records import OK, Measurement


def timed(tactic, us, spread=0.005, status=OK):
    return Measurement("p", "layer", 8, KernelConfig.from_entry({"backend": "flashinfer_cublas", "tactic": tactic}), status,
                       time_us=us, spread=spread)


@pytest.mark.parametrize("tactic_us, spread, pinned", [
    (18.0, 0.005, True),      # 10% faster: a pin
    (19.7, 0.005, True),      # 1.5%, spreads under the 1% floor: a pin
    (19.85, 0.005, False),    # 0.75%: inside the 1% floor, -1 stays
    (19.7, 0.02, False),      # 1.5% but a 2% spread: inside the noise
    (20.5, 0.005, False),     # slower
])
def test_a_tactic_is_pinned_only_beyond_the_noise(tactic_us, spread, pinned):
    assert pins_over_default(timed(3, tactic_us, spread), timed(-1, 20.0)) is pinned


def test_no_pin_without_a_correct_default_or_for_the_default_itself():
    assert not pins_over_default(timed(3, 10.0), None)
    assert not pins_over_default(timed(3, 10.0), timed(-1, 20.0, status="wrong_result"))
    assert not pins_over_default(timed(-1, 10.0), timed(-1, 20.0))


def _counting_timer(monkeypatch):
    seen = []

    def fake(launch, n, repeats, target_ms, flush="write", warmup_ms=timing.WARMUP_MS):
        seen.append(repeats)
        return Timing(float(len(seen)), 0.0, repeats, 0.0)
    monkeypatch.setattr(timing, "_time_graph", fake)
    monkeypatch.setattr(timing, "_PRIMED", False)
    return seen


def test_the_first_timing_of_a_process_is_dropped(monkeypatch):
    seen = _counting_timer(monkeypatch)
    first = timing.time_gpu(lambda i: None, 1, repeats=21)
    second = timing.time_gpu(lambda i: None, 1, repeats=21)
    assert (first.median_us, second.median_us) == (2.0, 3.0)      # the priming result (1.0) is nobody's
    assert seen == [3, 21, 21]


def test_a_workers_every_timing_follows_a_throwaway_one(monkeypatch):
    # A run's workers share the GPU: another worker's kernels may come between two timings of one
    # worker, so each timing is primed again (session 11: a -1 re-measurement without it was 2.85 µs off).
    seen = _counting_timer(monkeypatch)
    first = timing.time_gpu(lambda i: None, 1, repeats=21, prime=True)
    second = timing.time_gpu(lambda i: None, 1, repeats=21, prime=True)
    assert (first.median_us, second.median_us) == (2.0, 4.0)
    assert seen == [3, 21, 3, 21]


def paired(tactic_us, versus_us, ratio_spread, spread=0.005):
    m = timed(3, tactic_us, spread)
    m.versus_us, m.versus_spread = versus_us, ratio_spread
    return m


@pytest.mark.parametrize("tactic, pinned", [
    # 3% under the default's own re-measurement, level with the default timed beside it: no pin
    (paired(19.4, 19.45, 0.004), False),
    (paired(19.4, 19.8, 0.004), True),       # 2% under the default beside it, rounds agree: a pin
    (paired(19.4, 19.8, 0.03), False),       # 2%, but the rounds' ratios scatter 3%
])
def test_a_tactic_timed_beside_its_default_is_judged_on_that_pair(tactic, pinned):
    assert pins_over_default(tactic, timed(-1, 20.0)) is pinned


def test_a_duel_turns_the_order_each_round_so_a_drift_weighs_on_both_sides():
    calls = []

    def time_one(fn):          # every later timing 1% slower: a drift both sides see
        calls.append(fn)
        return Timing(10.0 * 1.01 ** len(calls), 0.002, 7, 0.01)
    t, versus_us, ratio_spread = timing.duel(time_one, "tactic", "default", rounds=3)
    assert calls == ["default", "tactic", "tactic", "default", "default", "tactic"]
    assert abs(t.median_us / versus_us - 1) < 0.011 and ratio_spread > 0.015   # level, the drift shows as spread
    assert not pins_over_default(paired(t.median_us, versus_us, ratio_spread), timed(-1, 20.0))


def test_a_worker_times_a_duel_in_one_task_and_a_failing_baseline_leaves_it_unpaired():
    # In-process on the CPU (the family's own clock in place of the wall clock): tactic 0 beside -1 is paired;
    # beside tactic 1, wrong at M=2, the timing goes unpaired and tactic 0 is not blamed for it.
    from autotune.measure.measurer import Measurer
    from autotune.problems.models import Problem
    from autotune.measure.tasks import Settings, Task
    from tests.fakes.tactic_backends import TacticBackends

    fam, problem = TacticBackends(), Problem(8, 32, 64, 2, "bf16", batch_sizes=(2,))
    measurer = Measurer(Settings(family=fam.spec, on_cpu=True, routings=1, repeats=3), None)

    def beside(baseline):
        task = Task(problem.to_dict(), problem.key, "layer", KernelConfig.from_entry({"backend": "tunable", "tactic": 0}), [2],
                    family=fam.spec, versus=KernelConfig.from_entry({"backend": "tunable", "tactic": baseline}))
        m, fatal = measurer.measure(task, problem, 2)
        assert m.ok and not fatal
        return m
    paired = beside(-1)
    # the declared costs (tests/fakes/tactic_backends.py: -1 20 ms, tactic 0 1 ms), read on the family's clock
    assert paired.versus_us == pytest.approx(20_000) and paired.time_us == pytest.approx(1_000)
    assert paired.versus_spread == pytest.approx(0, abs=1e-9) and paired.samples == 3 * 3     # 3 rounds of (at most) 3
    assert beside(1).versus_us is None


def test_a_duels_result_is_the_median_of_its_rounds_and_the_spread_of_their_ratios():
    # three rounds: the tactic at 9, 10 and 12 µs beside the default at 10, 20 and 10: ratios 0.9, 0.5, 1.2
    mine = iter([Timing(9.0, 0.01, 7, 0.1, 4), Timing(10.0, 0.03, 7, 0.1, 5), Timing(12.0, 0.02, 7, 0.1, 6)])
    theirs = iter([Timing(us, 0.005, 7, 0.2, 4) for us in (10.0, 20.0, 10.0)])

    def time_one(fn):
        return next(mine) if fn == "tactic" else next(theirs)
    t, versus_us, ratio_spread = timing.duel(time_one, "tactic", "default", rounds=3)
    assert (t.median_us, t.spread, t.samples, t.calls) == (10.0, 0.02, 21, 4)
    assert t.bench_s == pytest.approx(3 * 0.1 + 3 * 0.2)           # both sides' timing time
    assert versus_us == 10.0 and ratio_spread == pytest.approx((1.2 - 0.5) / 0.9)
    # a tactic timed at zero (no ratio to spread over) has no spread, not a division by zero
    _, _, spread = timing.duel(lambda fn: Timing(0.0 if fn == "tactic" else 10.0, 0.0, 1, 0.0), "tactic", "default")
    assert spread == 0.0


def test_the_pin_rule_weighs_both_sides_noise_and_a_gain_of_exactly_the_noise_is_no_pin():
    assert not pins_over_default(timed(3, 19.4, spread=0.005), timed(-1, 20.0, spread=0.04))   # the default's 4%
    assert not pins_over_default(paired(19.4, 19.8, 0.004, spread=0.03), timed(-1, 20.0))      # the tactic's 3%
    assert pins_over_default(paired(19.4, 19.8, None), timed(-1, 20.0))        # no ratio spread: the 1% floor
    # 100 µs x (1 + 1%) is exactly 101 µs: not beyond the noise, either way of timing it
    assert not pins_over_default(timed(3, 100.0, spread=0.0), timed(-1, 101.0, spread=0.0))
    assert not pins_over_default(paired(100.0, 101.0, 0.0, spread=0.0), timed(-1, 200.0))
    # a config that names no tactic runs the backend's default: never a pin over itself
    no_tactic = Measurement("p", "layer", 8, KernelConfig.from_entry({"backend": "flashinfer_cublas"}), OK, time_us=1.0, spread=0.0)
    assert not pins_over_default(no_tactic, timed(-1, 20.0))


def test_a_cpu_timing_is_the_median_of_its_repeats_with_their_spread_on_the_given_clock():
    ticks = iter([0.0, 1.0, 1.000002, 2.0, 2.000004, 3.0, 3.000001, 4.0, 4.000010, 5.0, 5.000003, 6.0])
    launched = []
    t = timing.time_cpu(launched.append, 2, repeats=5, clock=lambda: next(ticks))
    assert launched == [0, 1, 0, 1, 0]                               # routing sets in turn
    assert t.median_us == pytest.approx(3.0) and t.samples == 5 and t.bench_s == pytest.approx(6.0)
    assert t.spread == pytest.approx((7.0 - 1.5) / 3.0)              # (p75 - p25) / median of 2, 4, 1, 10, 3 µs
    ticks = iter([0.0] * 8)
    t = timing.time_cpu(lambda i: None, 1, clock=lambda: next(ticks))
    assert t.samples == 3 and t.spread == 0.0                         # three by default; a zero median, no spread
