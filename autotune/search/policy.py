"""The search policy around TPE, as a sampler wrapper (the shape of Optuna's PartialFixedSampler):
before each ask it decides which parameters the ask must take, and the sampler hands those out
instead of TPE's draws.

- Coupling: where a family's GEMMs must share a parameter (its `coupled`: both run on one alignment),
  every third ask of a study past start-up pins it to the other GEMM's current best (both sides then
  know the tiles the joint choice needs).
- Polish: the optima are narrow (on the H200 at M=1 three of 2570 gate_up configs lie within 2% of
  the best), so the last `polish` share of a study's asks are one-step moves around its top configs.
- Stuck-breaker: four re-proposals of known configs in a row move the sampler on the same way, and
  end the study when no unmeasured valid config is left.

A decision is written as the trial's `fixed_params` system attribute, as Optuna's own queue writes
it, so a stop inside the ask re-queues what the ask had to be (storage.requeue), and the rows the
storage holds are those of an ask that took the same parameters from the queue.
"""
from __future__ import annotations

import random

import optuna

from autotune.contract.config import KernelConfig
from autotune.store.storage import ATTR

FIXED = "fixed_params"     # Optuna's name for an ask's given parameters (Study.enqueue_trial)
STUCK = 4                  # re-proposals in a row that move the sampler on


class PolicySampler(optuna.samplers.BaseSampler):
    """`base` for one ask, with `fixed` (name -> ladder index) given instead of drawn. TPE's joint
    draw runs over the full space as it does for a queued trial with some parameters given, so the
    other parameters come out the same; a fully given ask draws nothing."""

    def __init__(self, base, fixed: dict | None = None):
        self._base, self._fixed = base, dict(fixed or {})

    def reseed_rng(self) -> None:
        self._base.reseed_rng()

    def infer_relative_search_space(self, study, trial):
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        given = {n: v for n, v in self._fixed.items() if n in search_space}
        if search_space and set(search_space) <= set(given):
            return given
        return {**self._base.sample_relative(study, trial, search_space), **given}

    def sample_independent(self, study, trial, param_name, param_distribution):
        if param_name in self._fixed:
            return self._fixed[param_name]
        return self._base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self._base.before_trial(study, trial)
        if FIXED in trial.system_attrs:
            self._fixed = {}      # another worker queued a trial meanwhile: it was popped, it decides
        elif self._fixed:
            study._storage.set_trial_system_attr(trial._trial_id, FIXED, self._fixed)

    def after_trial(self, study, trial, state, values) -> None:
        self._base.after_trial(study, trial, state, values)


def trailing_duplicates(trials) -> int:
    """Re-proposals of known configs told since the study's last measured ask, counted from the
    storage so a resumed run moves on to a fresh config exactly when an uninterrupted one would.
    A told re-proposal is the study's only own COMPLETE trial without a measurement attached
    (a rejected config carries its `invalid` record, a measured one its measurement)."""
    n = 0
    for t in reversed(trials):
        if t.state != optuna.trial.TrialState.COMPLETE or "shared_from" in t.user_attrs:
            continue
        if t.user_attrs.get("asked"):
            break
        if ATTR not in t.user_attrs:
            n += 1
    return n


class SearchPolicy:
    """Decides each ask of one problem's studies from what the tuner knows (its store, what is in
    flight); `sampler` is the ask's sampler, or None when the study's space is used up."""

    def __init__(self, tuner):
        self.tuner = tuner
        self._why_not: dict = {}     # (gemm, config) -> the family's check (one problem, one device: it never changes)

    def sampler(self, slot, seed: int, startup: int):
        fixed = self.next_params(slot)
        if fixed is False:
            return None
        base = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup)
        return PolicySampler(base, fixed)

    def next_params(self, slot):
        """The parameters the next ask must take (None: TPE's draw; False: nothing left to ask).
        Nothing is given on top of a queued trial (an interrupted trial re-asked on resume, a dead
        process's re-queued trial, a seed): the queue is popped first and the path must not fork."""
        t = self.tuner
        space, s = t.spaces[slot.gemm], t.settings
        if t.store.has_queued((slot.gemm, slot.M)):
            return None
        partner = [g for g in t.family.gemms if g != slot.gemm]
        coupled = getattr(t.family, "coupled", None)
        if coupled and partner and slot.asked >= s.startup and slot.asks % 3 == 2:
            pb = t.best(partner[0], slot.M)
            if pb is not None and pb.config.get(coupled) in space.params[coupled]:
                return {coupled: space.params[coupled].index(pb.config[coupled])}
        polishing = slot.asked >= s.trials * (1 - s.polish) and t.ok_measurements(slot.gemm, slot.M)
        if polishing or slot.dups >= STUCK:
            fresh = self.fresh_config(slot)
            if fresh is not None:
                slot.dups = 0
                return space.indices_of(fresh)
            if slot.dups >= STUCK:
                return False
        return None

    def fresh_config(self, slot) -> KernelConfig | None:
        """An unmeasured valid config: a one-step neighbour of a top config, else any."""
        t = self.tuner
        space = t.spaces[slot.gemm]
        seen = t.measured[slot.gemm, slot.M]
        valid = lambda c: (c.key not in seen and (slot.gemm, slot.M, c.key) not in t.pending  # noqa: E731
                           and self._check(slot.gemm, c) is None)
        tops = sorted(t.ok_measurements(slot.gemm, slot.M), key=lambda m: m.time_us)[:3]
        near = []
        for m in tops:
            idx = space.indices_of(m.config)
            if idx is None:
                continue
            for name, ladder in space.params.items():
                for step in (-1, 1):
                    j = idx[name] + step
                    if 0 <= j < len(ladder):
                        c = space.config_at({**idx, name: j})
                        if valid(c):
                            near.append(c)
        rng = random.Random(t.seed_of(slot, "fresh"))
        if near:
            return rng.choice(near)
        rest = [c for c in space.configs() if valid(c)]
        return rng.choice(rest) if rest else None

    def _check(self, gemm: str, config: KernelConfig) -> str | None:
        t = self.tuner
        if (gemm, config) not in self._why_not:
            self._why_not[gemm, config] = t.family.check(config, t.problem, gemm, t.device)
        return self._why_not[gemm, config]
