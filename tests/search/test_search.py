"""The search's own rules: shared BLOCK_SIZE_M pairs, neighbour sharing, budgets."""
import optuna
import pytest

from autotune.contract.config import KernelConfig
from autotune.contract.protocol import get_family
from autotune.measure.records import Measurement, config_key
from autotune.measure.replay import ReplayPool
from autotune.families.triton_moe.pairs import candidate_pairs
from autotune.search.context import SearchContext
from autotune.search.study import ProblemTuner, TuneSettings


def _m(gemm, bm, bn, t):
    return Measurement("p", gemm, 8, KernelConfig.from_entry({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn}), "ok", time_us=t)


def test_pairs_share_block_m_and_minimise_the_sum():
    gate_up = [_m("gate_up", 16, 64, 10.0), _m("gate_up", 32, 64, 11.0), _m("gate_up", 64, 64, 15.0)]
    down = [_m("down", 64, 32, 5.0), _m("down", 32, 32, 6.0), _m("down", 16, 32, 9.0)]
    # the separate minima (bm 16 + bm 64) cannot run together; bm 32 (17 us) beats bm 16 (19) and bm 64 (20)
    best = candidate_pairs(gate_up, down, top=3)
    assert [(g["BLOCK_SIZE_M"], d["BLOCK_SIZE_M"], t) for g, d, t in best] == [(32, 32, 17.0), (16, 16, 19.0), (64, 64, 20.0)]


def test_failed_measurements_never_form_pairs():
    bad = Measurement("p", "down", 8, KernelConfig.from_entry({"BLOCK_SIZE_M": 16}), "wrong_result", time_us=1.0)
    assert candidate_pairs([_m("gate_up", 16, 64, 10.0)], [bad], top=3) == []


def _tuner(grid_cache, **kw):
    from autotune.problems.models import Problem

    p = Problem.from_dict({**next(iter(grid_cache.problems.values())), "batch_sizes": [1, 8, 32]})
    pool = ReplayPool(grid_cache)
    t = ProblemTuner(SearchContext(optuna.storages.InMemoryStorage(), pool.device, pool, TuneSettings(**kw)), p,
                     get_family("triton_moe"))
    return t, pool


def test_asked_configs_are_also_measured_at_neighbouring_M(grid_cache):
    t, _ = _tuner(grid_cache, trials=4, seed=3)
    t.measure_baselines()
    t.search()
    shared = [tr for tr in t.slots["gate_up", 8].study.trials if "shared_from" in tr.user_attrs]
    assert shared and {tr.user_attrs["shared_from"] for tr in shared} <= {1, 32}
    # M=8 learned configs asked at M=1 and M=32 without asking them itself
    assert len(t.measured["gate_up", 8]) > t.slots["gate_up", 8].asked


def test_evaluation_budget_is_respected(grid_cache):
    t, pool = _tuner(grid_cache, trials=1000, max_evaluations=120)
    t.measure_baselines()
    t.search()
    assert 120 <= t.evaluations() < 120 + 6       # at most one in-flight trial's neighbours past it


def test_rejected_configs_cost_no_device_time(grid_cache):
    t, pool = _tuner(grid_cache, trials=8, seed=1)
    t.measure_baselines()
    t.search()
    invalid = [tr for s in t.slots.values() for tr in s.study.trials
               if tr.user_attrs.get("measurement", {}).get("status") == "invalid"]
    assert invalid                                   # the sampler did propose over-limit tiles...
    assert pool.answered == t.evaluations()          # ...and none of them reached the device


def test_a_study_read_in_optunas_dashboard_shows_tile_sizes(grid_cache):
    """Params are ladder positions (ordinal for the sampler); every trial also carries its tile
    sizes, and the study the ladders that decode its params."""
    t, _ = _tuner(grid_cache, trials=4, seed=2)
    t.measure_baselines()
    t.search()
    for (gemm, M), slot in t.slots.items():
        ladders = slot.study.user_attrs["ladders"]
        told = [tr for tr in slot.study.trials if tr.state == optuna.trial.TrialState.COMPLETE]
        assert told
        for tr in told:
            sizes = tr.user_attrs["config"]
            assert sizes == {k: ladders[k][i] for k, i in tr.params.items()}
            assert sizes["BLOCK_SIZE_M"] in (16, 32, 64, 128, 256)


def test_a_warm_start_begins_each_study_with_another_studys_best_configs(grid_cache):
    """Warm start from the H200 block-FP8 run (another dtype of the shape): each bf16 study's
    first asks are that run's fastest configs at the nearest M, where bf16's rules admit them."""
    from autotune.families.triton_moe import TritonMoe
    from autotune.search.warm_start import fit, load
    from tests.conftest import ROOT

    warm = load(str(ROOT / "benchmarks/data/h200_run_fp8_block_2026-12-01.jsonl.gz"), TritonMoe)
    t, _ = _tuner(grid_cache, trials=4, seed=1, warm_start=warm)
    t.measure_baselines()
    t.search()
    assert t.warm_queued > 0
    for (gemm, M), slot in t.slots.items():
        space = t.spaces[gemm]
        wanted = [fit(c, space) for c in warm.configs(t.problem, gemm, M)]
        wanted = [c for c in wanted if c and t.family.check(c, t.problem, gemm, t.device) is None]
        measured = {config_key(m.config) for m in t.measured[gemm, M].values()}
        assert wanted and all(config_key(c) in measured for c in wanted), (gemm, M)
    fp8_best = min((m for m in warm.measurements if m.gemm == "gate_up" and m.M == 8), key=lambda m: m.time_us)
    assert warm.configs(t.problem, "gate_up", 8)[0] == fp8_best.config


def test_a_warm_start_source_of_another_family_is_refused():
    from autotune.families.triton_moe import TritonMoe
    from autotune.search.warm_start import WarmStartError, load
    from tests.conftest import ROOT

    with pytest.raises(WarmStartError, match="holds no triton_moe measurements"):
        load(str(ROOT / "benchmarks/data/h200_backends_2026-12-01.jsonl.gz"), TritonMoe)


def test_an_interrupt_marks_the_trial_in_flight_and_the_run_resumes(grid_cache, tmp_path):
    """Ctrl-C or SIGTERM (the CLI turns it into KeyboardInterrupt) while a trial is measured: that
    trial ends FAIL with the reason, its parameters are queued, nothing is left RUNNING, and a
    new run on the storage asks it first and finishes every study's budget."""
    from autotune.problems.models import Problem

    class InterruptedPool(ReplayPool):
        polls, armed = 0, False

        def poll(self, timeout=0.0):
            self.polls += self.armed
            if self.polls == 6 and self.busy():       # a trial is submitted and not told
                raise KeyboardInterrupt
            return super().poll(timeout)

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    p = Problem.from_dict({**next(iter(grid_cache.problems.values())), "batch_sizes": [1, 8]})
    pool = InterruptedPool(grid_cache)
    t = ProblemTuner(SearchContext(storage, pool.device, pool, TuneSettings(trials=5, seed=4)), p, get_family("triton_moe"))
    t.measure_baselines()
    pool.armed = True
    in_flight = []
    pool.submit = lambda task, submit=pool.submit: (in_flight.append(task.tag[2]._trial_id), submit(task))
    with pytest.raises(KeyboardInterrupt):
        t.search()
    trial_id = in_flight[-1]
    number = storage.get_trial_number_from_id(trial_id)
    frozen = storage.get_trial(trial_id)
    assert frozen.state == optuna.trial.TrialState.FAIL
    owner = next(s for s in t.slots.values() if any(tr._trial_id == trial_id for tr in s.study.trials))
    assert owner.study.user_attrs[f"fail_reason:{number}"].startswith("interrupted")
    waiting = [w for w in owner.study.trials if w.state == optuna.trial.TrialState.WAITING]
    assert [w.system_attrs["fixed_params"] for w in waiting] == [frozen.params]
    assert not [tr for s in t.slots.values() for tr in s.study.trials if tr.state == optuna.trial.TrialState.RUNNING]

    again = ReplayPool(grid_cache)
    t2 = ProblemTuner(SearchContext(storage, again.device, again, TuneSettings(trials=5, seed=4)), p, get_family("triton_moe"))
    t2.measure_baselines()
    t2.search()
    assert t2.complete() and all(s.asked == 5 for s in t2.slots.values())
    assert config_key(t2.spaces[owner.gemm].config_at(frozen.params)) in t2.measured[owner.gemm, owner.M]


def test_config_key_is_the_compact_json_of_the_canonical_config_for_every_kind_of_config():
    # config_key writes Triton configs itself (fast path) and everything else with json.dumps: both must give
    # the exact string json.dumps gives, since caches and studies written before compare by it.
    import json
    import random

    from autotune.families.triton_moe.schema import CONFIG_ORDER
    from autotune.contract.config import canonical, config_key

    rng = random.Random(0)
    configs = [{"backend": "flashinfer_cudnn", "tactic": [7, [[12, 41]]]}, {"backend": "triton", "tactic": -1}, {},
               {"BLOCK_SIZE_M": 16, "USE_TMA": False}, {"USE_TMA": True, "num_stages": 2, "BLOCK_SIZE_M": -1},
               {"BLOCK_SIZE_M": 64, "name": "ü"}, {"BLOCK_SIZE_M": 1.5}, {"bad key": 1}]
    for _ in range(200):
        keys = rng.sample(CONFIG_ORDER + ("zeta", "alpha"), rng.randint(1, 9))
        configs.append({k: rng.choice([1, 16, 4] if k in ("num_warps", "num_stages") else [True, False, 0, 1, 16, 256, -3])
                        for k in keys})
    for c in configs:
        assert config_key(c) == json.dumps(canonical(c), separators=(",", ":")), c
    # the key order is the one its family declares (SGLang's, in the files it reads), switches only when on
    shuffled = dict(reversed([(k, 1) for k in CONFIG_ORDER]), zeta=0, alpha=0)
    assert list(canonical(shuffled)) == [*CONFIG_ORDER, "alpha", "zeta"]
    assert list(canonical({**shuffled, "USE_TMA": False})) == [*CONFIG_ORDER[:-1], "alpha", "zeta"]


class _Stopped(BaseException):
    """A stop the search does not handle (SIGKILL): whatever was RUNNING stays RUNNING."""


def _resumable_run(grid_cache, storage):
    from autotune.problems.models import Problem

    p = Problem.from_dict({**next(iter(grid_cache.problems.values())), "batch_sizes": [1, 8]})
    pool = ReplayPool(grid_cache)
    t = ProblemTuner(SearchContext(storage, pool.device, pool, TuneSettings(trials=8, seed=4)), p, get_family("triton_moe"))
    t.measure_baselines()
    t.search()


def _asks(storage):
    return {s.study_name: [t.params for t in optuna.load_study(study_name=s.study_name, storage=storage).trials
                           if t.user_attrs.get("asked")] for s in optuna.get_all_study_summaries(storage)}


@pytest.fixture(scope="module")
def uninterrupted_asks(grid_cache):
    storage = optuna.storages.InMemoryStorage()
    _resumable_run(grid_cache, storage)
    return _asks(storage)


@pytest.mark.parametrize("ask,stop", [("sampled", KeyboardInterrupt), ("sampled", _Stopped), ("queued", _Stopped)])
def test_a_run_stopped_inside_an_ask_resumes_to_the_uninterrupted_runs_asks(grid_cache, uninterrupted_asks, ask, stop):
    """Optuna stores an ask's parameters one at a time (one commit each in a database): a stop can
    leave a trial with half of them. The resumed run must ask exactly what the uninterrupted run
    asked, whether the stop was handled (Ctrl-C: the trial is re-queued at once) or not (a kill:
    re-queued on resume), and whether the stopped ask was sampled or took fixed parameters from
    the queue (CI, 2026-12-02: a resumed run diverged after a kill inside a sampled ask)."""
    storage = optuna.storages.InMemoryStorage()
    set_param, seen = storage.set_trial_param, []

    def stop_half_way(trial_id, *param):
        t = storage.get_trial(trial_id)
        fixed = t.system_attrs.get("fixed_params")
        half_way = (fixed is None and len(t.params) == 2) if ask == "sampled" else \
            (fixed is not None and len(fixed) < 6 and len(t.params) == len(fixed) + 1)
        if half_way and "asked" not in t.user_attrs:
            seen.append(trial_id)
            if len(seen) == 3:                 # past the first asks
                raise stop()
        return set_param(trial_id, *param)
    storage.set_trial_param = stop_half_way
    with pytest.raises(stop):
        _resumable_run(grid_cache, storage)
    storage.set_trial_param = set_param
    stopped = storage.get_trial(seen[-1])
    assert 0 < len(stopped.params) < 6 and stopped.state == (
        optuna.trial.TrialState.FAIL if stop is KeyboardInterrupt else optuna.trial.TrialState.RUNNING)
    _resumable_run(grid_cache, storage)
    assert _asks(storage) == uninterrupted_asks


WRITES = ("create_new_trial", "set_trial_param", "set_trial_state_values", "set_trial_user_attr",
          "set_trial_system_attr", "set_study_user_attr", "set_study_system_attr")


# Three positions in the quick tier (the first write, one inside the search, the last), the others slow:
# each is a whole search on SQLite, the same path at another write.
@pytest.mark.parametrize("kth", [1, 9, 41, *(pytest.param(k, marks=pytest.mark.slow) for k in (2, 3, 4, 6, 13, 19, 28))])
def test_a_stop_arriving_inside_any_storage_write_lands_after_it_and_the_run_resumes(grid_cache, tmp_path, kth):
    """Ctrl-C is a signal, and Python raises it between any two bytecodes, so without care it lands
    inside Optuna's and SQLAlchemy's storage code (CI, session 16: a trial a SIGTERM left RUNNING).
    Here SIGINT arrives inside the kth storage write of the search: that write still completes, the
    stop surfaces as KeyboardInterrupt, nothing is left RUNNING, what was being asked or measured is
    queued again, and a new run on the storage finishes every study's budget."""
    import os
    import signal

    from autotune.problems.models import Problem

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    p = Problem.from_dict({**next(iter(grid_cache.problems.values())), "batch_sizes": [1, 8]})
    pool = ReplayPool(grid_cache)
    t = ProblemTuner(SearchContext(storage, pool.device, pool, TuneSettings(trials=5, seed=4)), p, get_family("triton_moe"))
    t.measure_baselines()
    calls = {"began": 0, "ended": 0, "at": None}

    def interrupting(name, real):
        def write(*a, **kw):
            calls["began"] += 1
            if calls["began"] == kth:
                calls["at"] = name
                os.kill(os.getpid(), signal.SIGINT)     # delivered at once, inside this call
            out = real(*a, **kw)
            calls["ended"] += 1
            return out
        return write

    for name in WRITES:
        setattr(storage, name, interrupting(name, getattr(storage, name)))
    with pytest.raises(KeyboardInterrupt):
        t.search()
    assert calls["at"] is not None, "the search made fewer storage writes than kth"
    assert calls["began"] == calls["ended"], f"the stop cut a {calls['at']} call short"
    studies = [s.study for s in t.slots.values()]
    assert not [tr for s in studies for tr in s.trials if tr.state == optuna.trial.TrialState.RUNNING]
    for s in studies:
        queued = [w.system_attrs["fixed_params"] for w in s.trials if w.state == optuna.trial.TrialState.WAITING]
        for tr in s.trials:
            if tr.state == optuna.trial.TrialState.FAIL:
                assert s.user_attrs[f"fail_reason:{tr.number}"].startswith("interrupted")
                assert tr.params in queued or not tr.params

    again = ReplayPool(grid_cache)
    t2 = ProblemTuner(SearchContext(storage, again.device, again, TuneSettings(trials=5, seed=4)), p, get_family("triton_moe"))
    t2.measure_baselines()
    t2.search()
    assert t2.complete() and all(s.asked == 5 for s in t2.slots.values())


def test_a_wall_time_end_stops_the_search_with_room_for_what_follows_it(grid_cache):
    """With an end (a GPU run's --budget), the search stops asking as soon as what the problem still needs after
    it (the finalists' re-measurements, the files, at the pace measured so far: after_search_s) would pass the end;
    a later end measures more. The clock runs on the replay's recorded seconds here, as a GPU's would on the wall."""
    from autotune.search.context import Clock

    class Recorded(Clock):
        def now(self):
            return self.pool.charged_s

    runs = {}
    for extra in (1.0, 2.5):           # recorded seconds of search left once the baselines are measured
        t, pool = _tuner(grid_cache, trials=1000)
        t.clock = Recorded(pool)
        pool.seconds_per_measurement = lambda: 0.05       # a steady pace: the reserve does not drift
        t.measure_baselines()
        t.settings.ends_at = pool.charged_s + t.after_search_s() + extra
        t.search()
        # stopped with room for what follows, within the last tasks' own cost of the line
        slack = 3 * max(m.bench_s + m.compile_s / pool.parallel for d in t.measured.values() for m in d.values())
        assert abs(pool.charged_s + t.after_search_s() - t.settings.ends_at) <= slack
        runs[extra] = t.evaluations()
    assert runs[2.5] > runs[1.0] > 12         # more than the baselines
