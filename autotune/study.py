"""Optuna glue: one study per (problem, GEMM, M), run together.

Why this shape (argued in docs/DESIGN.md):
- Compilation costs 30-100x one timing, and a compiled config can be timed at any M. So an
  asked config is also measured at the neighbouring batch sizes (`neighbours` on each side)
  and added to their studies as completed trials: every study learns from its neighbours'
  exploration, and the optimum, which moves smoothly with M, is found with fewer compiles.
- The two GEMMs are searched apart (a `_down` config may differ, and may use TMA), but SGLang
  runs both on one alignment, so they must share BLOCK_SIZE_M. Every third ask of a study
  pins BLOCK_SIZE_M to the other GEMM's current best, so both sides know the tiles the joint
  choice needs; `select` then picks per M the pair minimising gate_up + down.
- Each study is seeded with SGLang's default config and its shipped config (measured once as
  baselines), so the result can only improve on them.
- Rejected configs (shared memory, kernel rules) and failures are told as +inf, as Triton's
  autotuner scores out-of-resources: the sampler learns to avoid them at no device cost.
"""
from __future__ import annotations

import math
import random
import time
import zlib
from dataclasses import dataclass, field

import optuna

from . import records
from .records import Measurement, config_key
from .worker import Task, run_tasks

optuna.logging.set_verbosity(optuna.logging.WARNING)
ATTR = "measurement"


@dataclass
class TuneSettings:
    trials: int = 40                 # measured asks per (GEMM, M) study
    budget_s: float | None = None    # device seconds for the whole run
    neighbours: int = 1
    seed: int = 0
    startup: int = 6                 # random trials before TPE models a study
    top: int = 3                     # candidates re-measured before a winner is declared
    careful_repeats: int = 21
    max_evaluations: int | None = None   # stop asking after this many device measurements
    polish: float = 0.3              # last share of each study's trials: one-step moves around its top configs
    use_shipped: bool = True         # seed with SGLang's shipped config (benchmarks turn it off)


def study_name(family: str, device_name: str, problem_key: str, gemm: str, M: int) -> str:
    return f"{family}|{device_name}|{problem_key}|{gemm}|M={M}"


def distributions(space) -> dict:
    return {n: optuna.distributions.IntDistribution(0, len(v) - 1) for n, v in space.params.items()}


@dataclass
class Slot:
    gemm: str
    M: int
    study: object
    asked: int = 0           # measured asks so far (budget)
    asks_total: int = 0      # all asks, including rejected and duplicates (loop guard)
    inflight: int = 0        # asked configs submitted and not yet told
    exhausted: bool = False


@dataclass
class Clock:
    pool: object
    start: float = field(default_factory=time.monotonic)

    def device_s(self) -> float:
        charged = getattr(self.pool, "charged_s", None)
        return charged if charged is not None else time.monotonic() - self.start


class ProblemTuner:
    """Search, baselines and the measurement index of one problem."""

    def __init__(self, storage, problem, family, device, pool, settings: TuneSettings, progress=None,
                 clock: Clock | None = None, study_device: str | None = None):
        self.problem, self.family, self.device, self.pool = problem, family, device, pool
        self.settings = settings
        self.progress = progress
        self.clock = clock or Clock(pool)
        self.rng = random.Random(settings.seed)
        self.Ms = list(problem.batch_sizes)
        self.spaces = {g: family.space(problem, g, device) for g in family.gemms}
        self.dists = {g: distributions(s) for g, s in self.spaces.items()}
        # (gemm, M) -> config_key -> Measurement ; in-flight keys are held apart
        self.measured: dict = {(g, M): {} for g in family.gemms for M in self.Ms}
        self.pending: set = set()
        self.baselines: dict = {}    # M -> {"default": {gemm: config}, "shipped": ...}
        self.careful: dict = {}      # (gemm, M, config_key) -> careful re-measurement (selection)
        self.failed = 0
        self.measured_now = 0        # device measurements made by this invocation
        self.slots: dict = {}
        for g in family.gemms:
            for M in self.Ms:
                name = study_name(family.name, study_device or device.file_name, problem.key, g, M)
                sampler = optuna.samplers.TPESampler(
                    seed=(settings.seed * 1000003 + zlib.crc32(f"{g}/{M}".encode())) % 2**31, multivariate=True,
                    constant_liar=True, n_startup_trials=settings.startup)
                study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                            direction="minimize", load_if_exists=True)
                self.slots[g, M] = Slot(g, M, study)
                self._load(self.slots[g, M])

    # -- the measurement index, rebuilt from storage so a resumed run re-measures nothing --------
    def _load(self, slot: Slot) -> None:
        for t in slot.study.get_trials(deepcopy=False):
            if t.state == optuna.trial.TrialState.RUNNING:
                # One `autotune run` owns a study at a time: a RUNNING trial is an interrupted one.
                slot.study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                continue
            if t.state != optuna.trial.TrialState.COMPLETE or ATTR not in t.user_attrs:
                continue
            m = Measurement.from_dict(t.user_attrs[ATTR])
            self.measured[slot.gemm, slot.M][config_key(m.config)] = m
            if t.user_attrs.get("asked") and m.status != records.INVALID:
                slot.asked += 1
        for name, value in slot.study.user_attrs.items():
            if name.startswith("baseline:"):
                m = Measurement.from_dict(value)
                self.measured[slot.gemm, slot.M].setdefault(config_key(m.config), m)
            elif name.startswith("careful:"):
                m = Measurement.from_dict(value)
                self.careful[slot.gemm, slot.M, config_key(m.config)] = m

    def store_careful(self, gemm: str, m: Measurement) -> None:
        self.measured_now += 1
        self.careful[gemm, m.M, config_key(m.config)] = m
        self.slots[gemm, m.M].study.set_user_attr(f"careful:{config_key(m.config)}", m.to_dict())

    def known(self, gemm: str, M: int, config: dict) -> Measurement | None:
        return self.measured[gemm, M].get(config_key(config))

    def ok_measurements(self, gemm: str, M: int) -> list[Measurement]:
        return [m for m in self.measured[gemm, M].values() if m.ok]

    def best(self, gemm: str, M: int) -> Measurement | None:
        oks = self.ok_measurements(gemm, M)
        return min(oks, key=lambda m: m.time_us) if oks else None

    # -- running tasks through the pool -------------------------------------------------------
    def run_tasks(self, tasks: list[Task], on_result) -> None:
        run_tasks(self.pool, tasks, on_result)

    def _task(self, gemm: str, config: dict, Ms: list[int], tag=None, repeats=None) -> Task:
        return Task(self.problem.to_dict(), self.problem.key, gemm, records.canonical(config), list(Ms),
                    repeats=repeats, tag=tag)

    # -- baselines --------------------------------------------------------------------------------
    def measure_baselines(self) -> None:
        """SGLang's default and shipped configs at every M, both GEMMs (stored once)."""
        todo: dict = {}
        for M in self.Ms:
            self.baselines[M] = self.family.baselines(self.problem, M, self.device)
            for name, per_gemm in self.baselines[M].items():
                if name == "shipped" and not self.settings.use_shipped:
                    continue
                for gemm, cfg in per_gemm.items():
                    if self.known(gemm, M, cfg) is None:
                        todo.setdefault((gemm, config_key(cfg)), (cfg, []))[1].append((M, name))
        tasks = [self._task(g, cfg, [M for M, _ in uses], tag=("baseline", uses)) for (g, _), (cfg, uses) in todo.items()]

        def done(task, ms):
            names = dict(task.tag[1])
            for m in ms:
                self._store_baseline(task.gemm, m, names[m.M])
        self.run_tasks(tasks, done)

    def _store_baseline(self, gemm: str, m: Measurement, name: str) -> None:
        self.measured_now += 1
        slot = self.slots[gemm, m.M]
        self.measured[gemm, m.M][config_key(m.config)] = m
        slot.study.set_user_attr(f"baseline:{name}", m.to_dict())
        if not m.ok:
            self.failed += 1

    # -- search -------------------------------------------------------------------------------------
    def search(self) -> None:
        s = self.settings
        self._seed_studies()
        order = [self.slots[g, M] for M in self.Ms for g in self.family.gemms]
        while True:
            if self._out_of_budget():
                break
            live = [sl for sl in order if sl.asked + self._inflight(sl) < s.trials and not sl.exhausted]
            if not live and not self.pool.busy():
                break
            while live and self.pool.idle():
                if self._out_of_budget():
                    break
                slot = min(live, key=lambda sl: (sl.asked + self._inflight(sl), order.index(sl)))
                asked = self._ask(slot)
                if asked is None:
                    slot.exhausted = True
                    live.remove(slot)
                    continue
                trial, config = asked
                Ms = [slot.M] + [M for M in self._neighbours(slot.M) if self.known(slot.gemm, M, config) is None
                                 and (slot.gemm, M, config_key(config)) not in self.pending]
                for M in Ms:
                    self.pending.add((slot.gemm, M, config_key(config)))
                slot.inflight += 1
                self.pool.submit(self._task(slot.gemm, config, Ms, tag=("trial", slot, trial)))
                live = [sl for sl in order if sl.asked + self._inflight(sl) < s.trials and not sl.exhausted]
            for task, ms in self.pool.poll(timeout=0.2):
                self._told(task, ms)
        # Let in-flight tasks land so nothing measured is lost.
        while self.pool.busy():
            for task, ms in self.pool.poll(timeout=0.2):
                self._told(task, ms)

    def _out_of_budget(self) -> bool:
        s = self.settings
        if s.budget_s is not None and self.clock.device_s() >= s.budget_s:
            return True
        return s.max_evaluations is not None and self.evaluations() + len(self.pending) >= s.max_evaluations

    def _inflight(self, slot: Slot) -> int:
        """Asks of this study still being measured (neighbour measurements do not count)."""
        return slot.inflight

    def _neighbours(self, M: int) -> list[int]:
        i = self.Ms.index(M)
        k = self.settings.neighbours
        return [self.Ms[j] for j in range(max(0, i - k), min(len(self.Ms), i + k + 1)) if j != i]

    def _seed_studies(self) -> None:
        """Enqueue the baselines that lie in the space (SGLang's shipped tiles usually do)."""
        for (gemm, M), slot in self.slots.items():
            if slot.asked:
                continue
            space = self.spaces[gemm]
            for name, per_gemm in self.baselines.get(M, {}).items():
                idx = space.indices_of(per_gemm[gemm])
                if idx is not None:
                    slot.study.enqueue_trial(idx, skip_if_exists=True)

    def _ask(self, slot: Slot):
        """A config to measure at slot.M, or None when the study's space is used up."""
        space, dists, study = self.spaces[slot.gemm], self.dists[slot.gemm], slot.study
        partner = [g for g in self.family.gemms if g != slot.gemm]
        if partner and slot.asked >= self.settings.startup and slot.asks_total % 3 == 2:
            pb = self.best(partner[0], slot.M)
            if pb is not None and pb.config.get("BLOCK_SIZE_M") in space.params["BLOCK_SIZE_M"]:
                study.enqueue_trial({"BLOCK_SIZE_M": space.params["BLOCK_SIZE_M"].index(pb.config["BLOCK_SIZE_M"])})
        if slot.asked >= self.settings.trials * (1 - self.settings.polish) and self.ok_measurements(slot.gemm, slot.M):
            # Polish: the optima are narrow (on the H200 at M=1 three of 2570 gate_up configs lie
            # within 2% of the best), so finish with coordinate moves around the top configs.
            fresh = self._fresh_config(slot)
            if fresh is not None:
                study.enqueue_trial(space.indices_of(fresh))
        dups = 0
        while slot.asks_total < 50 * self.settings.trials + 200:
            slot.asks_total += 1
            trial = study.ask(dists)
            config = space.config_at(trial.params)
            reason = self.family.check(config, self.problem, slot.gemm, self.device)
            if reason:
                m = records.failure(self.problem.key, slot.gemm, slot.M, config, records.INVALID, reason)
                trial.set_user_attr(ATTR, m.to_dict())
                study.tell(trial, math.inf)
                continue
            ck = config_key(config)
            known = self.measured[slot.gemm, slot.M].get(ck)
            if known is not None or (slot.gemm, slot.M, ck) in self.pending:
                # Re-proposed: answer from what is known at no device cost.
                value = known.time_us if known is not None and known.ok else math.inf
                study.tell(trial, value)
                dups += 1
                if dups >= 4:
                    fresh = self._fresh_config(slot)
                    if fresh is None:
                        return None
                    study.enqueue_trial(space.indices_of(fresh))
                    dups = 0
                continue
            return trial, config
        return None

    def _fresh_config(self, slot: Slot) -> dict | None:
        """An unmeasured valid config: a one-step neighbour of a top config, else any."""
        space = self.spaces[slot.gemm]
        seen = self.measured[slot.gemm, slot.M]
        valid = lambda c: (config_key(c) not in seen and (slot.gemm, slot.M, config_key(c)) not in self.pending  # noqa: E731
                           and self.family.check(c, self.problem, slot.gemm, self.device) is None)
        tops = sorted(self.ok_measurements(slot.gemm, slot.M), key=lambda m: m.time_us)[:3]
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
        if near:
            return self.rng.choice(near)
        rest = [c for c in space.configs() if valid(c)]
        return self.rng.choice(rest) if rest else None

    def _told(self, task: Task, ms: list[Measurement]) -> None:
        kind, slot, trial = task.tag
        slot.inflight -= 1
        for m in ms:
            self.pending.discard((task.gemm, m.M, config_key(task.config)))
            self.measured_now += 1
            value = m.time_us if m.ok else math.inf
            if not m.ok:
                self.failed += 1
            self.measured[task.gemm, m.M][config_key(m.config)] = m
            if m.M == slot.M:
                trial.set_user_attr(ATTR, m.to_dict())
                trial.set_user_attr("asked", True)
                slot.study.tell(trial, value)
                slot.asked += 1
            else:
                target = self.slots[task.gemm, m.M]
                idx = self.spaces[task.gemm].indices_of(m.config)
                target.study.add_trial(optuna.trial.create_trial(
                    params=idx, distributions=self.dists[task.gemm], value=value,
                    user_attrs={ATTR: m.to_dict(), "shared_from": slot.M}))
        if self.progress is not None:
            self.progress.update(1)
            b = self.best(slot.gemm, slot.M)
            text = f"{slot.gemm} M={slot.M}" + (f" best {b.time_us:.1f} us" if b else "")
            self.progress.set_postfix_str(text + (f", failed {self.failed}" if self.failed else ""), refresh=False)

    # -- numbers for reports --------------------------------------------------------------------------
    def evaluations(self) -> int:
        """Configs measured on the device (rejected-before-launch ones excluded)."""
        return sum(1 for d in self.measured.values() for m in d.values() if m.status != records.INVALID)

    def trials_at(self, M: int) -> tuple[int, int]:
        """(measurements, failures) at M over both GEMMs, rejected-before-launch excluded."""
        ms = [m for g in self.family.gemms for m in self.measured[g, M].values() if m.status != records.INVALID]
        return len(ms), sum(1 for m in ms if not m.ok)
