"""Selection, unit by unit (autotune.families.triton_moe.pairs, autotune.search.finalists): which pairs become finalists, what a
re-measurement is asked and reused, and which finalist wins. The end-to-end replays
(tests/run/test_replay_run.py) show the outcome on the H200 grid; here each rule is set up to decide."""
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from autotune.contract.config import KernelConfig
from autotune.measure import records
from autotune.search.finalists import TUNED, Choice, Finalist, Scored, remeasure, score, winner
from autotune.measure.records import Measurement, config_key
from autotune.families.triton_moe.pairs import candidate_pairs, select_problem


def cfg(bm: int, n: int = 64) -> KernelConfig:
    return KernelConfig.from_entry({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                                    "num_warps": 4, "num_stages": 3})


def timed(gemm: str, M: int, config: KernelConfig, us: float | None, status: str = records.OK) -> Measurement:
    return Measurement("p", gemm, M, config, status, time_us=us if status == records.OK else None, spread=0.01)


# --- candidate pairs ----------------------------------------------------------------------------------

def test_pairs_share_block_size_m_and_are_ranked_by_their_estimated_total():
    up = [timed("gate_up", 8, cfg(16, 32), 10.0), timed("gate_up", 8, cfg(32), 5.0), timed("gate_up", 8, cfg(64), 1.0)]
    down = [timed("down", 8, cfg(16), 3.0), timed("down", 8, cfg(32), 20.0)]    # no down of BLOCK_SIZE_M 64
    pairs = candidate_pairs(up, down, top=5)
    assert [(g["BLOCK_SIZE_M"], d["BLOCK_SIZE_M"], t) for g, d, t in pairs] == [(16, 16, 13.0), (32, 32, 25.0)]


def test_only_correct_measurements_and_the_best_per_side_and_the_top_few_are_paired():
    up = [timed("gate_up", 8, cfg(16, n), us) for n, us in ((32, 4.0), (64, 2.0), (128, 3.0))]
    up.append(timed("gate_up", 8, cfg(16, 256), None, records.WRONG_RESULT))     # would be the fastest
    down = [timed("down", 8, cfg(16, n), us) for n, us in ((32, 1.0), (64, 5.0), (128, 9.0))]
    pairs = candidate_pairs(up, down, top=3, per_side=2)
    # the two best of each side (gate_up N 64 and 128, down N 32 and 64), best total first, three kept
    assert [(g["BLOCK_SIZE_N"], d["BLOCK_SIZE_N"], t) for g, d, t in pairs] == [(64, 32, 3.0), (128, 32, 4.0),
                                                                                (64, 64, 7.0)]
    assert len(candidate_pairs(up, down, top=10, per_side=2)) == 4
    assert candidate_pairs(up, down, top=10) == candidate_pairs(up, down, top=10, per_side=2)   # two a side by default
    assert len(candidate_pairs(up, down, top=10, per_side=3)) == 9
    assert candidate_pairs(up, [], top=3) == []


# --- scoring and the winner ---------------------------------------------------------------------------

def test_a_finalists_total_is_the_sum_of_its_parts_and_none_when_a_part_failed_or_is_missing():
    assert Scored(Finalist(TUNED, {}), {"gate_up": 2.0, "down": 3.5}).total_us == 5.5
    assert Scored(Finalist(TUNED, {}), {"gate_up": 2.0, "down": None}).total_us is None
    assert Scored(Finalist(TUNED, {}), {}).total_us is None
    careful = {("gate_up", 8, config_key(cfg(16))): timed("gate_up", 8, cfg(16), 2.0),
               ("down", 8, config_key(cfg(16))): timed("down", 8, cfg(16), None, records.CRASH),
               ("down", 8, config_key(cfg(32))): timed("down", 8, cfg(32), 4.0)}
    scored = score([Finalist(TUNED, {"gate_up": cfg(16), "down": cfg(16)}),
                    Finalist(TUNED, {"gate_up": cfg(16), "down": cfg(32)}),
                    Finalist("default", {"gate_up": cfg(64), "down": cfg(32)})], 8, careful)
    assert [s.times for s in scored] == [{"gate_up": 2.0, "down": None}, {"gate_up": 2.0, "down": 4.0},
                                         {"gate_up": None, "down": 4.0}]
    assert score([Finalist(TUNED, {"gate_up": cfg(16)})], 1, careful)[0].times == {"gate_up": None}   # another M


def scored(source: str, total: float | None) -> Scored:
    return Scored(Finalist(source, {}), {"layer": total})


def test_the_fastest_correct_finalist_wins_and_a_tie_goes_to_the_baseline():
    assert winner([scored(TUNED, 9.0), scored("default", 10.0), scored("shipped", None)]).finalist.source == TUNED
    assert winner([scored(TUNED, 10.0), scored("default", 9.99)]).finalist.source == "default"
    assert winner([scored(TUNED, 10.0), scored("shipped", 10.0)]).finalist.source == "shipped"
    assert winner([scored("default", 10.0), scored(TUNED, 10.0)]).finalist.source == "default"
    assert winner([scored(TUNED, None), scored("default", None)]) is None
    assert winner([]) is None


def test_a_choice_reads_back_as_it_was_written():
    rows = [Scored(Finalist("shipped", {"gate_up": cfg(16), "down": cfg(16, 32)}), {"gate_up": 2.0, "down": 3.0}),
            Scored(Finalist("default", {"gate_up": cfg(64), "down": cfg(64)}), {"gate_up": 4.0, "down": None})]
    pair = Choice.pair(8, (cfg(16), cfg(16, 32)), (2.0, 3.0), "shipped", {"default": 6.0, "shipped": 5.0}, rows)
    assert pair.total_us == 5.0 and pair.gate_up_us == 2.0 and pair.down_us == 3.0
    d = pair.to_dict()
    assert d["total_us"] == 5.0 and d["source"] == "shipped" and d["baseline_us"] == {"default": 6.0, "shipped": 5.0}
    assert Choice.from_dict(d) == pair
    del d["source"]                    # written before choices named their source: the tuned config's
    assert Choice.from_dict(d).source == TUNED
    lc = KernelConfig.from_entry({"backend": "b", "tactic": [3, [1]]})
    layer = Choice.layer(8, lc, 4.0, 5.0, [Scored(Finalist(TUNED, {"layer": lc}), {"layer": 4.0})])
    assert layer.time_us == 4.0 and layer.auto_us == 5.0 and layer.to_dict()["auto_us"] == 5.0
    assert (layer.M, layer.source, layer.baseline_us) == (8, TUNED, {"auto": 5.0})
    assert Choice.from_dict(layer.to_dict()) == layer
    # what to_dict hands out is a copy: a caller editing it changes nothing of the choice
    for choice, parts in ((pair, ("gate_up", "down", "candidates")), (layer, ("config", "candidates"))):
        d = choice.to_dict()
        for part in parts:
            (d[part][0] if part == "candidates" else d[part])["x"] = "edited"
        assert choice.to_dict() != d and "edited" not in repr(choice)


# --- re-measurement and the selection of one problem ---------------------------------------------------

def test_each_config_is_re_measured_once_over_every_m_that_needs_it_and_a_known_one_not_again():
    a, b = cfg(16), cfg(32)
    c = cfg(64)
    finalists = {1: [Finalist(TUNED, {"gate_up": a, "down": b}), Finalist("default", {"gate_up": a, "down": a}),
                     Finalist("shipped", {"down": b, "gate_up": c})],      # its known part first, then one to measure
                 8: [Finalist(TUNED, {"gate_up": a, "down": b})]}
    careful = {("down", 1, config_key(b)): timed("down", 1, b, 1.0)}
    asked, stored = [], []

    def run_tasks(tasks, on_result):
        asked.extend(tasks)
        for t in tasks:
            on_result(t, [timed(t.gemm, M, t.config, 1.0) for M in t.Ms])
    def task(gemm, c, Ms):
        return SimpleNamespace(gemm=gemm, config=c, Ms=Ms)
    remeasure(finalists, careful, task, run_tasks, lambda gemm, m: stored.append(m))
    assert sorted((t.gemm, config_key(t.config), t.Ms) for t in asked) == sorted(
        [("gate_up", config_key(a), [1, 8]), ("down", config_key(a), [1]), ("down", config_key(b), [8]),
         ("gate_up", config_key(c), [1])])
    assert len(stored) == 5
    asked.clear()
    remeasure({1: [Finalist(TUNED, {"down": b})]}, careful, task, run_tasks, lambda *a: None)
    assert asked == []                 # nothing to re-measure: nothing run


@dataclass
class PairTuner:
    """What select_problem reads of a problem's tuner, with the re-measured times set per config."""
    search: dict                      # (gemm, M) -> [Measurement]
    careful_us: dict                  # (gemm, config key) -> us (absent: the re-measurement failed)
    baselines: dict
    use_shipped: bool = True
    unwritable_keys: tuple = ()
    Ms: list = field(default_factory=lambda: [8])
    careful: dict = field(default_factory=dict)
    tasks: list = field(default_factory=list)

    def __post_init__(self):
        self.settings = SimpleNamespace(use_shipped=self.use_shipped)
        self.device = "the GPU"
        self.asked_writable = []             # (gemm, device) the family was asked about

        def unwritable(c, gemm, device):
            self.asked_writable.append((gemm, device))
            return "no" if config_key(c) in self.unwritable_keys else None
        self.family = SimpleNamespace(unwritable=unwritable)

    def ok_measurements(self, gemm, M):
        return self.search.get((gemm, M), [])

    def task(self, gemm, c, Ms, tag=None, repeats=None):
        return SimpleNamespace(gemm=gemm, config=c, Ms=list(Ms), repeats=repeats, tag=tag)

    def run_tasks(self, tasks, on_result):
        self.tasks.extend(tasks)
        for t in tasks:
            us = self.careful_us.get((t.gemm, config_key(t.config)))
            on_result(t, [timed(t.gemm, M, t.config, us, records.OK if us else records.WRONG_RESULT) for M in t.Ms])

    def store_careful(self, gemm, m):
        self.careful[(gemm, m.M, config_key(m.config))] = m


def test_select_re_measures_the_top_pairs_and_sglangs_and_the_fastest_wins_with_its_baselines_beside_it():
    fast, slow, shipped, default = cfg(16, 32), cfg(16, 64), cfg(32, 128), cfg(64, 256)
    t = PairTuner(search={("gate_up", 8): [timed("gate_up", 8, fast, 1.0), timed("gate_up", 8, slow, 2.0)],
                          ("down", 8): [timed("down", 8, fast, 1.0), timed("down", 8, slow, 2.0)]},
                  # re-measured, the search's favourite pair is slower than another and than shipped
                  careful_us={("gate_up", config_key(fast)): 4.0, ("down", config_key(fast)): 4.0,
                              ("gate_up", config_key(slow)): 2.5, ("down", config_key(slow)): 2.5,
                              ("gate_up", config_key(shipped)): 3.0, ("down", config_key(shipped)): 3.0,
                              ("gate_up", config_key(default)): 9.0},        # default's down fails
                  baselines={8: {"shipped": {"gate_up": shipped, "down": shipped},
                                 "default": {"gate_up": default, "down": default}}})
    (choice,) = select_problem(t, top=4, careful_repeats=21).values()
    assert choice.M == 8 and choice.source == TUNED and choice.gate_up == slow and choice.down == slow
    assert choice.times == {"gate_up": 2.5, "down": 2.5}
    assert choice.baseline_us == {"shipped": 6.0, "default": None}
    assert {r.finalist.source for r in choice.candidates} == {TUNED, "shipped", "default"} and len(choice.candidates) == 6
    rows = choice.to_dict()["candidates"]
    assert {"source": "default", "gate_up": default.to_entry(), "down": default.to_entry(), "total_us": None,
            "gate_up_us": 9.0, "down_us": None} in rows
    assert {"source": TUNED, "gate_up": slow.to_entry(), "down": slow.to_entry(), "total_us": 5.0, "gate_up_us": 2.5,
            "down_us": 2.5} in rows
    assert select_problem(t, top=3, careful_repeats=21)[8].source == "shipped"    # that pair not among the top 3
    assert all(task.repeats == 21 and task.tag == "select" for task in t.tasks)
    assert set(t.asked_writable) == {("gate_up", t.device), ("down", t.device)}


@pytest.mark.parametrize("use_shipped, unwritable, sources", [
    (True, (), {TUNED, "default", "shipped"}),
    (False, (), {TUNED, "default"}),                 # --no-shipped: SGLang's file is not a finalist
    (True, ("shipped",), {TUNED, "default"}),        # a baseline the target releases cannot run is not either
])
def test_a_baseline_is_a_finalist_only_where_it_may_be_written(use_shipped, unwritable, sources):
    tuned, shipped, default = cfg(16), cfg(32), cfg(64)
    names = {"shipped": shipped, "default": default}
    t = PairTuner(search={("gate_up", 8): [timed("gate_up", 8, tuned, 5.0)], ("down", 8): [timed("down", 8, tuned, 5.0)]},
                  careful_us={(g, config_key(c)): us for c, us in ((tuned, 5.0), (shipped, 1.0), (default, 2.0))
                              for g in ("gate_up", "down")},
                  baselines={8: {n: {"gate_up": c, "down": c} for n, c in names.items()}}, use_shipped=use_shipped,
                  unwritable_keys=tuple(config_key(names[n]) for n in unwritable))
    (choice,) = select_problem(t, top=3, careful_repeats=5).values()
    assert {r.finalist.source for r in choice.candidates} == sources
    assert choice.source == ("shipped" if "shipped" in sources else "default")


def test_an_m_where_no_finalist_ran_correctly_has_no_choice_and_the_next_m_still_has_its_own():
    c = cfg(16)
    t = PairTuner(search={("gate_up", 8): [timed("gate_up", 8, c, 1.0)], ("down", 8): [timed("down", 8, c, 1.0)]},
                  careful_us={}, baselines={})
    assert select_problem(t, top=3, careful_repeats=5) == {}
    ok = cfg(32)
    t = PairTuner(search={(g, M): [timed(g, M, c if M == 1 else ok, 1.0)] for g in ("gate_up", "down") for M in (1, 8)},
                  careful_us={(g, config_key(ok)): 2.0 for g in ("gate_up", "down")}, baselines={}, Ms=[1, 8])
    assert {M: (ch.gate_up, ch.total_us) for M, ch in select_problem(t, top=3, careful_repeats=5).items()} == {8: (ok, 4.0)}


# --- the backend choice (autotune.search.sieve.BackendTuner), its tuner's storage and workers left out ----------

def layer(backend: str, tactic, M: int, us: float | None, status: str = records.OK, spread: float = 0.0):
    c = KernelConfig.from_entry({"backend": backend} if tactic is None else {"backend": backend, "tactic": tactic})
    return Measurement("p", "layer", M, c, status, time_us=us if status == records.OK else None, spread=spread)


def backend_tuner(measured: list, careful_us: dict, auto: str = "auto_b", names=("auto_b", "fast", "slow", "bad"),
                  top: int = 3, tunable=()):
    """A BackendTuner over set measurements: `careful_us` (config key -> us) answers every re-measurement."""
    from autotune.search.sieve import BackendTuner
    from autotune.contract.backend_family import LAYER

    t = BackendTuner.__new__(BackendTuner)
    t.Ms = sorted({m.M for m in measured})
    t.measured = {M: {config_key(m.config): m for m in measured if m.M == M} for M in t.Ms}
    t.names, t.top, t.careful, t.unavailable, t.device = tuple(names), top, {}, {}, None
    t.family = SimpleNamespace(sglang_auto=lambda device: auto,
                               runner=lambda b: SimpleNamespace(tunable=b in tunable))
    t.asked = []

    def remeasure(plan):
        for M, cands in plan.items():
            for f in cands:
                cfg = f.configs[LAYER]
                t.asked.append((M, config_key(cfg)))
                us = careful_us.get((config_key(cfg), M), careful_us.get(config_key(cfg)))
                us, versus = us if isinstance(us, tuple) else (us, None)       # (us, the default's beside it)
                m = layer(cfg["backend"], cfg.get("tactic"), M, us, records.OK if us else records.WRONG_RESULT)
                m.versus_us = versus
                t.careful[(LAYER, M, config_key(cfg))] = m
    t._remeasure = remeasure
    return t


def test_a_backend_wrong_at_any_m_is_out_at_every_m_and_a_bad_tactic_alone():
    t = backend_tuner([layer("fast", -1, 1, 1.0), layer("fast", -1, 8, None, records.WRONG_RESULT),
                       layer("fast", -1, 16, None, records.CRASH), layer("bad", None, 8, None, records.TIMEOUT),
                       layer("slow", 5, 1, None, records.WRONG_RESULT), layer("slow", 5, 8, None, records.CRASH),
                       layer("slow", -1, 1, 2.0), layer("auto_b", -1, 1, None, records.INVALID)], {})
    out = t.disqualified()
    assert {b: (m.M, m.status) for b, m in out.items()} == {"fast": (8, records.WRONG_RESULT), "bad": (8, records.TIMEOUT)}
    tactics = t.disqualified_tactics()
    assert {k: (m.M, m.status, m.config["tactic"]) for k, m in tactics.items()} == {
        config_key({"backend": "slow", "tactic": 5}): (1, records.WRONG_RESULT, 5)}


def test_the_backend_choice_re_measures_the_top_correct_and_auto_and_the_fastest_wins():
    cfg = lambda b, tac=-1: KernelConfig.from_entry({"backend": b, "tactic": tac})          # noqa: E731
    search = [layer("fast", -1, 8, 1.0), layer("slow", -1, 8, 3.0), layer("slow", 2, 8, 2.0),
              layer("auto_b", -1, 8, 4.0), layer("bad", -1, 8, 0.5), layer("bad", -1, 1, None, records.WRONG_RESULT),
              layer("fast", 7, 8, 0.1), layer("fast", 7, 1, None, records.CRASH)]
    careful = {config_key(cfg("fast")): 2.5, config_key(cfg("slow", 2)): 2.2, config_key(cfg("slow")): 2.0,
               config_key(cfg("auto_b")): 3.0}
    t = backend_tuner(search, careful)
    choices = t.select()
    # `bad` (wrong at M=1) and fast's tactic 7 (crashed at M=1) are not finalists; auto_b is, as itself
    assert sorted(k for M, k in t.asked if M == 8) == sorted(config_key(c) for c in (
        cfg("fast"), cfg("slow", 2), cfg("slow"), cfg("auto_b")))
    c8 = choices[8]
    assert c8.config == cfg("slow") and c8.time_us == 2.0 and c8.auto_us == 3.0
    assert {r.finalist.configs["layer"].key: r.total_us for r in c8.candidates} == careful
    assert choices[1].config == cfg("auto_b")      # nothing correct at M=1 in the search: auto alone, re-measured
    top2 = backend_tuner(search, careful, top=2)
    assert top2.select()[8].config == cfg("slow", 2)        # slow's -1 was third by search time
    assert choices[8].M == 8 and choices[8].baseline_us == {"auto": 3.0}
    tie = backend_tuner(search, {**careful, config_key(cfg("auto_b")): 2.0})
    assert tie.select()[8].config == cfg("auto_b")          # level with the fastest: SGLang's own pick stays
    # auto wrong somewhere: not a finalist, and nothing beside the winner
    t = backend_tuner(search + [layer("auto_b", -1, 1, None, records.WRONG_RESULT)], careful)
    assert t.select()[8].auto_us is None and config_key(cfg("auto_b")) not in {k for _, k in t.asked}


def test_a_tactic_is_chosen_per_backend_only_where_it_beats_its_default_beyond_the_noise():
    cfg = lambda tac: KernelConfig.from_entry({"backend": "fast", "tactic": tac})           # noqa: E731
    search = [layer("fast", -1, M, 10.0) for M in (1, 8)] + [layer("fast", t, M, 9.0) for t in (3, 4) for M in (1, 8)]
    search.append(layer("fast", 4, 1, None, records.WRONG_RESULT))     # tactic 4 wrong at M=1: out everywhere
    search = [m for m in search if not (m.config.get("tactic") == 4 and m.M == 1 and m.ok)]
    careful = {config_key(cfg(-1)): 10.0, config_key(cfg(3)): 9.0, config_key(cfg(4)): 5.0}
    t = backend_tuner(search, careful, tunable=("fast",))
    out = t.tactic_choices()["fast"]
    assert {M: (c.config, c.time_us, c.auto_us) for M, c in out.items()} == {1: (cfg(3), 9.0, 10.0), 8: (cfg(3), 9.0, 10.0)}
    careful[config_key(cfg(3))] = 9.95                    # within 1% of the default: the default stays
    t = backend_tuner(search, careful, tunable=("fast",))
    assert {M: c.config for M, c in t.tactic_choices()["fast"].items()} == {1: cfg(-1), 8: cfg(-1)}
    assert backend_tuner(search, careful).tactic_choices() == {}       # a backend without tactics has none


def test_a_tactic_is_judged_against_the_default_timed_beside_it_and_only_where_the_default_ran():
    cfg = lambda tac: KernelConfig.from_entry({"backend": "fast", "tactic": tac})           # noqa: E731
    search = [layer("fast", -1, M, 10.0) for M in (1, 8)] + [layer("fast", None, 16, 10.0)]
    search += [layer("fast", 3, M, 8.0) for M in (1, 8, 16, 32)] + [layer("fast", 4, M, 9.0) for M in (1, 8, 16, 32)]
    careful = {(config_key(cfg(-1)), 1): None, (config_key(cfg(-1)), 8): 10.0,      # -1 failed its re-measurement at M=1
               config_key(cfg(3)): (8.5, 8.0), config_key(cfg(4)): (9.0, 10.0)}    # (time, its default's beside it)
    t = backend_tuner(search, careful, tunable=("fast",), top=2)
    out = t.tactic_choices()["fast"]
    # M=1: its default failed; M=16: the default ran without a tactic key (no pin over itself, and no -1 to
    # stand beside); M=32: no default at all. At M=8 tactic 4 is 10% under the default beside it, tactic 3 6%
    # over it, though faster by the clock
    assert list(out) == [8]
    c = out[8]
    assert (c.M, c.config, c.time_us, c.baseline_us) == (8, cfg(4), 9.0, {"default": 10.0})
    assert {r.finalist.configs["layer"] for r in c.candidates} == {cfg(tac) for tac in (-1, 3, 4)}
    one = backend_tuner(search, careful, tunable=("fast",), top=1)      # the one finalist: 3, fastest by search
    assert one.tactic_choices()["fast"][8].config == cfg(-1)
    assert (8, config_key(cfg(4))) not in one.asked
