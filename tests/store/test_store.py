"""The store under both tuners, the policy's sampler wrapper and the one Choice, each on its own."""
from __future__ import annotations

import random

import optuna
import pytest
from optuna.distributions import IntDistribution

from autotune.contract.config import KernelConfig
from autotune.search.finalists import Choice, Finalist, Scored
from autotune.search.policy import PolicySampler
from autotune.measure.records import OK, Measurement, config_key
from autotune.store.storage import Store
from tests.fakes.main_job import storage_rows

DISTS = {"a": IntDistribution(0, 9), "b": IntDistribution(0, 9), "c": IntDistribution(0, 9)}


def _study_with_history(path):
    """A study of eight completed trials (past TPE's start-up), the same in every file."""
    study = optuna.create_study(storage=f"sqlite:///{path}", study_name="s", direction="minimize")
    rng = random.Random(0)
    for _ in range(8):
        p = {k: rng.randint(0, 9) for k in DISTS}
        study.add_trial(optuna.trial.create_trial(params=p, distributions=DISTS, value=sum(p.values()) + rng.random()))
    return study


def _tpe():
    return optuna.samplers.TPESampler(seed=5, multivariate=True, constant_liar=True, n_startup_trials=6)


@pytest.mark.parametrize("fixed", [{"a": 3}, {"a": 3, "b": 1, "c": 7}, {}])
def test_a_policy_ask_draws_and_stores_what_the_same_ask_from_optunas_queue_does(tmp_path, fixed):
    """The policy gives an ask's parameters through the sampler; the search used to queue them
    (enqueue_trial) and ask. Both must draw the other parameters alike (TPE's joint draw over the
    whole space) and leave the same rows (fixed_params, TPE's shared relative params), or a
    resumed run and the README main job's storage would change."""
    queued = _study_with_history(tmp_path / "queued.db")
    if fixed:
        queued.enqueue_trial(fixed)
    queued.sampler = _tpe()
    via_queue = queued.ask(DISTS)

    wrapped = _study_with_history(tmp_path / "wrapped.db")
    wrapped.sampler = PolicySampler(_tpe(), fixed)
    via_policy = wrapped.ask(DISTS)

    assert via_policy.params == via_queue.params
    assert {k: via_policy.params[k] for k in fixed} == fixed
    assert storage_rows(tmp_path / "wrapped.db") == storage_rows(tmp_path / "queued.db")


def test_a_queued_trial_beats_the_policy(tmp_path):
    """A trial waiting in the queue (a stopped run's, a dead worker's) is asked first with its own
    parameters and TPE's draw for the rest: the policy's decision for that ask is dropped, not
    mixed in."""
    asked = []
    for name, sampler in (("plain", _tpe()), ("policy", PolicySampler(_tpe(), {"a": 9, "b": 9}))):
        study = _study_with_history(tmp_path / f"{name}.db")
        study.enqueue_trial({"a": 1})
        study.sampler = sampler
        asked.append(study.ask(DISTS).params)
        assert study.trials[-1].system_attrs["fixed_params"] == {"a": 1}
    assert asked[1] == asked[0] and asked[1]["a"] == 1


def _m(M, backend, us):
    return Measurement("p", "layer", M, KernelConfig.from_entry({"backend": backend, "tactic": -1}), OK, time_us=us)


def test_the_store_reads_back_what_was_committed_and_requeues_an_interrupted_ask(tmp_path):
    """A second store on the storage (a resumed run) finds every committed measurement, careful
    re-measurement and baseline under the same keys, and an ask left RUNNING by a stopped,
    unshared run failed with its reason and its parameters queued again."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    dists = {"n": IntDistribution(0, 9)}
    first = Store(optuna.storages.RDBStorage(url), {("layer", 1): dists})
    study = first.open(("layer", 1), "study-1")
    first.commit(("layer", 1), _m(1, "x", 2.0), {"n": 1})
    first.commit_careful(("layer", 1), _m(1, "x", 2.5))
    first.commit_baseline(("layer", 1), _m(1, "y", 3.0), "default")
    stopped = study.ask(dists)          # asked, never told: the run was killed

    again = Store(optuna.storages.RDBStorage(url), {("layer", 1): dists})
    again.open(("layer", 1), "study-1")
    trials, requeued, _ = again.sync(("layer", 1), resume=True)
    assert again.measured == first.measured
    assert again.careful == first.careful
    assert [m.time_us for m in again.top(("layer", 1))] == [2.0, 3.0]
    assert requeued == {stopped.number}
    after = again.studies["layer", 1].trials
    assert after[stopped.number].state == optuna.trial.TrialState.FAIL
    assert after[-1].state == optuna.trial.TrialState.WAITING
    assert after[-1].system_attrs["fixed_params"] == stopped.params
    assert again.studies["layer", 1].user_attrs[f"fail_reason:{stopped.number}"].startswith("interrupted")
    assert config_key({"backend": "x", "tactic": -1}) in again.measured["layer", 1]


def test_one_choice_keeps_each_familys_file_shape():
    """Triton pairs and backend layers are one Choice; each writes the keys its files always had
    (provenance, backend_choice.json) and reads back equal."""
    bm16 = KernelConfig.from_entry({"BLOCK_SIZE_M": 16})
    pair = Choice.pair(8, (bm16, bm16), (3.0, 1.5), "shipped", {"default": 5.0},
                       [Scored(Finalist("default", {"gate_up": bm16, "down": bm16}), {"gate_up": 2.0, "down": None})])
    d = pair.to_dict()
    assert list(d) == ["M", "gate_up", "down", "gate_up_us", "down_us", "source", "baseline_us", "candidates",
                       "total_us"]
    assert d["total_us"] == 4.5 and Choice.from_dict(d) == pair
    b2 = KernelConfig.from_entry({"backend": "b", "tactic": 2})
    layer = Choice.layer(8, b2, 1.0, 1.25, [Scored(Finalist("tuned", {"layer": b2}), {"layer": 1.0})])
    d = layer.to_dict()
    assert d == {"M": 8, "config": {"backend": "b", "tactic": 2}, "time_us": 1.0, "auto_us": 1.25,
                 "candidates": [{"config": {"backend": "b", "tactic": 2}, "time_us": 1.0}]}
    assert d["candidates"][0]["config"] is not d["config"]
    assert Choice.from_dict(d) == layer and layer.auto_us == 1.25
