"""The search loop of a Triton-config family: one study per (problem, GEMM, M), run together. What the
studies hold is the store's (autotune.store.storage.Store); what each ask must take beside TPE's draw is
the policy's (autotune.search.policy); this module decides which study asks next and where its config is
measured.

Why this shape (argued in docs/DESIGN.md):
- Compilation costs 30-100x one timing, and a compiled config can be timed at any M. So an
  asked config is also measured at the neighbouring batch sizes (`neighbours` on each side)
  and added to their studies as completed trials: every study learns from its neighbours'
  exploration, and the optimum, which moves smoothly with M, is found with fewer compiles.
- A family's GEMMs are searched apart (the fused MoE's down config may differ from gate_up's, and
  may use TMA), but where they run on one alignment they must share the family's coupled parameter.
  Every third ask of a study pins it to the other GEMM's current best (autotune.search.policy), so
  both sides know the tiles the joint choice needs; the family's `select` then picks per M the pair
  with the least summed time.
- Each study is seeded with SGLang's default config and its shipped config (measured once as
  baselines), so the result can only improve on them.
- Rejected configs (shared memory, kernel rules) and failures are told as +inf, as Triton's
  autotuner scores out-of-resources: the sampler learns to avoid them at no device cost.
"""
from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass

import optuna

from autotune.measure import records
from autotune import stops
from autotune.errors import GpuMemoryExhausted
from autotune.contract.config import KernelConfig
from autotune.measure.records import Measurement
from autotune.search.policy import SearchPolicy, trailing_duplicates
from autotune.store.storage import ATTR, Store, config_study_name, fail_reason
from autotune.measure.tasks import Task, run_tasks
from autotune.search.context import Clock, SearchContext, TuneSettings
from autotune.search.warm_start import fit


# Before the run has measured anything: seconds a measurement takes on a GPU (the H100's measuring process:
# inputs, check and timing of one config at one batch size), and what writing a problem's files takes.
FIRST_GUESS_S = 0.08
FILES_S = 3.0


def distributions(space) -> dict:
    return {n: optuna.distributions.IntDistribution(0, len(v) - 1) for n, v in space.params.items()}


@dataclass
class Slot:
    gemm: str
    M: int
    study: object
    asked: int = 0           # measured asks so far, by every process sharing the study (budget)
    asks: int = 0            # all asks in the storage, rejected and duplicates included: seeds the
                             # sampler, so a resumed run asks what an uninterrupted one would have
    asks_here: int = 0       # asks by this process (loop guard)
    inflight: int = 0        # asked configs submitted and not yet told
    running_all: int = 0     # asked trials RUNNING in the storage, any process (shared studies)
    dups: int = 0            # re-proposed known configs since the last measured ask (from storage)
    exhausted: bool = False


class ProblemTuner:
    """Search, baselines and the measurement index of one problem."""

    def __init__(self, ctx: SearchContext, problem, family, progress=None):
        """`ctx`: where it stores and measures, its settings and clock; `progress`: a bar (tqdm's
        update and set_postfix_str) told of each measured trial."""
        device, storage = ctx.device, ctx.storage
        self.problem, self.family, self.device, self.pool = problem, family, device, ctx.pool
        self.settings = ctx.settings or TuneSettings()
        self.progress = progress
        self.clock = ctx.clock or Clock(ctx.pool)
        self.Ms = list(problem.batch_sizes)
        self.spaces = {g: family.space(problem, g, device) for g in family.gemms}
        self.dists = {g: distributions(s) for g, s in self.spaces.items()}
        self.store = Store(storage, {(g, M): self.dists[g] for g in family.gemms for M in self.Ms})
        self.measured = self.store.measured     # (gemm, M) -> config_key -> Measurement
        self.careful = self.store.careful       # (gemm, M, config_key) -> careful re-measurement
        self.pending: set = set()    # (gemm, M, config_key) in flight, held apart from the index
        self.baselines: dict = {}    # M -> {"default": {gemm: config}, "shipped": ...}
        self.failed = 0
        self.warm_queued = 0         # warm-start configs queued by this invocation
        self.measured_now = 0        # device measurements made by this invocation
        self.stored_trials = 0       # measurements this process stored as trials (asked or shared)
        self.storage = storage
        self.shared = self.store.shared
        self.policy = SearchPolicy(self)
        self._last_sync = 0.0
        self.ask_s = 0.0             # this process's seconds asking the studies (the sampler) during the search
        self.tell_s = 0.0            # and storing what was measured
        self.slots: dict = {}
        for g in family.gemms:
            for M in self.Ms:
                name = config_study_name(family.name, ctx.study_device(), problem.key, g, M)
                study = self.store.open((g, M), name)
                self.slots[g, M] = Slot(g, M, study)
                if "ladders" not in study.user_attrs:
                    # Params are ladder positions (the sampler then sees 64 as next to 32 and 128);
                    # the ladders decode them, and each trial's "config" attribute shows the sizes.
                    study.set_user_attr("ladders", {k: list(v) for k, v in self.spaces[g].params.items()})
                self._sync(self.slots[g, M], resume=True)

    def _sync(self, slot: Slot, resume: bool = False) -> None:
        """The study's counts for the search, from the storage (the store indexes what is new)."""
        trials, requeued, newly_asked = self.store.sync((slot.gemm, slot.M), resume)
        slot.asked += newly_asked
        # Asked trials only: a queued (WAITING) one is not asked yet, and counting it would seed a
        # resumed run's sampler differently from the uninterrupted run's.
        own = [t for t in trials if "shared_from" not in t.user_attrs and t.number not in requeued]
        slot.asks = sum(1 for t in own if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING))
        slot.running_all = sum(1 for t in trials if "shared_from" not in t.user_attrs
                               and t.state == optuna.trial.TrialState.RUNNING)
        slot.dups = trailing_duplicates(trials)

    def _sync_all(self, every_s: float = 1.0) -> None:
        if self.shared and time.monotonic() - self._last_sync > every_s:
            for slot in self.slots.values():
                self._sync(slot)
            self._last_sync = time.monotonic()

    def seed_of(self, slot: Slot, salt: str = "") -> int:
        """A seed from the study's state: what the sampler proposes depends on the trials in the
        storage only, not on how long this process has been running."""
        return zlib.crc32(f"{self.settings.seed}/{slot.gemm}/{slot.M}/{slot.asks}/{salt}".encode()) % 2**31

    def store_careful(self, gemm: str, m: Measurement) -> None:
        self.measured_now += 1
        self.store.commit_careful((gemm, m.M), m)

    def known(self, gemm: str, M: int, config: KernelConfig) -> Measurement | None:
        return self.store.known((gemm, M), config)

    def ok_measurements(self, gemm: str, M: int) -> list[Measurement]:
        """Measured configs that may be written now: a study measured for other SGLang targets (a
        resumed run, a shared study) can hold configs this run's targets cannot load."""
        return [m for m in self.measured[gemm, M].values()
                if m.ok and self.family.unwritable(m.config, gemm, self.device) is None]

    def best(self, gemm: str, M: int) -> Measurement | None:
        oks = self.ok_measurements(gemm, M)
        return min(oks, key=lambda m: m.time_us) if oks else None

    # -- running tasks through the pool -------------------------------------------------------
    def run_tasks(self, tasks: list[Task], on_result) -> None:
        run_tasks(self.pool, tasks, on_result)

    def task(self, gemm: str, config: KernelConfig, Ms: list[int], tag=None, repeats=None) -> Task:
        # Workers build the family by name, or by `spec` ("module:Class") where no package declares it.
        return Task(self.problem.to_dict(), self.problem.key, gemm, config, list(Ms),
                    repeats=repeats, tag=tag, family=getattr(self.family, "spec", self.family.name))

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
                        todo.setdefault((gemm, cfg), (cfg, []))[1].append((M, name))
        tasks = [self.task(g, cfg, [M for M, _ in uses], tag=("baseline", uses)) for (g, _), (cfg, uses) in todo.items()]

        def done(task, ms):
            names = dict(task.tag[1])
            for m in ms:
                self._store_baseline(task.gemm, m, names[m.M])
        self.run_tasks(tasks, done)

    def _store_baseline(self, gemm: str, m: Measurement, name: str) -> None:
        self.measured_now += 1
        self.store.commit_baseline((gemm, m.M), m, name)
        if not m.ok:
            self.failed += 1

    # -- search -------------------------------------------------------------------------------------
    def search(self) -> None:
        try:
            with self.store.heartbeats(), stops.deferred():
                self._search()
        except KeyboardInterrupt:     # SIGINT, or SIGTERM (docker stop) turned into one by the CLI
            with stops.deferred():
                self.store.requeue_running("interrupted (the run was stopped); re-queued")
            raise
        except GpuMemoryExhausted:    # the machine, not a config: what was being measured is asked again
            with stops.deferred():
                self.store.requeue_running("the GPU ran out of memory; re-queued")
            raise

    def _search(self) -> None:
        self._seed_studies()
        order = [self.slots[g, M] for M in self.Ms for g in self.family.gemms]
        while True:
            self._sync_all()
            if self._out_of_budget():
                break
            live = [sl for sl in order if self._open(sl)]
            if not live and not self.pool.busy():
                if self.shared and any(sl.running_all for sl in order):
                    # Other processes' trials are still running: they complete, or their process
                    # died and they are re-queued once stale, and then someone must measure them.
                    with stops.wait():
                        time.sleep(0.5)
                    continue
                break
            while live and self.pool.idle():
                if self._out_of_budget():
                    break
                slot = min(live, key=lambda sl: (sl.asked + self._inflight(sl), order.index(sl)))
                t0 = time.perf_counter()
                asked = self._ask(slot)
                self.ask_s += time.perf_counter() - t0
                if asked is None:
                    slot.exhausted = True
                    live.remove(slot)
                    continue
                trial, config = asked
                Ms = [slot.M] + [M for M in self._neighbours(slot.M) if self.known(slot.gemm, M, config) is None
                                 and (slot.gemm, M, config.key) not in self.pending]
                for M in Ms:
                    self.pending.add((slot.gemm, M, config.key))
                slot.inflight += 1
                self.store.measuring((slot.gemm, slot.M), trial)
                self.pool.submit(self.task(slot.gemm, config, Ms, tag=("trial", slot, trial)))
                live = [sl for sl in order if self._open(sl)]
            self._tell(self.pool.poll(timeout=0.2))
        # Let in-flight tasks land so nothing measured is lost.
        while self.pool.busy():
            self._tell(self.pool.poll(timeout=0.2))
        if self.shared:
            self._close_queues()

    def _close_queues(self) -> None:
        """Shared studies: trials queued for the next ask (a dead worker's retry) that nobody
        needs once the budget is met end as FAIL with that reason."""
        for slot in self.slots.values():
            self._sync(slot)
            if not self._open(slot):
                self.store.close_queue((slot.gemm, slot.M))

    def _open(self, slot: Slot) -> bool:
        """Does this study still need asks? Shared: other processes' running trials count too."""
        if slot.exhausted:
            return False
        busy = max(slot.running_all, self._inflight(slot)) if self.shared else self._inflight(slot)
        return slot.asked + busy < self.settings.trials

    def _over_budget(self, slot: Slot, trial) -> bool:
        """Shared studies: did other workers fill the budget with lower-numbered trials while we
        asked? Then this trial is failed with that reason instead of measured (exact budgets)."""
        if not self.shared:
            return False
        earlier = [t for t in slot.study.get_trials(deepcopy=False) if t.number < trial.number
                   and "shared_from" not in t.user_attrs
                   and (t.state == optuna.trial.TrialState.RUNNING or t.user_attrs.get("asked"))]
        return len(earlier) >= self.settings.trials

    def _out_of_budget(self) -> bool:
        s = self.settings
        if s.ends_at is not None and self.clock.now() + self.after_search_s() >= s.ends_at:
            return True
        if s.ends_at is None and s.budget_s is not None and self.clock.device_s() >= s.budget_s:
            return True
        return s.max_evaluations is not None and self.evaluations() + len(self.pending) >= s.max_evaluations

    def after_search_s(self) -> float:
        """Seconds this problem still needs once its search stops asking: the tasks in flight, the family's
        finalists (re-measured, then timed as SGLang runs them: the family's `after_search_cost`) and its
        files, at the pace this run measured so far (autotune.measure.pool.Pace)."""
        per = self.pool.seconds_per_measurement() or FIRST_GUESS_S
        workers = max(1, self.pool.measuring())
        in_flight = self.pool.busy() * (1 + 2 * self.settings.neighbours) * per / workers
        cost = getattr(self.family, "after_search_cost", None)
        rest = cost(self.problem, self.device, per, workers) if cost is not None else 0.0
        return in_flight + rest + FILES_S

    def _inflight(self, slot: Slot) -> int:
        """Asks of this study still being measured (neighbour measurements do not count)."""
        return slot.inflight

    def _neighbours(self, M: int) -> list[int]:
        i = self.Ms.index(M)
        k = self.settings.neighbours
        return [self.Ms[j] for j in range(max(0, i - k), min(len(self.Ms), i + k + 1)) if j != i]

    def _seed_studies(self) -> None:
        """Enqueue the baselines that lie in the space (SGLang's shipped tiles usually do), then a
        warm start's configs that this device and the target releases admit."""
        self.warm_queued = 0
        for (gemm, M), slot in self.slots.items():
            if slot.asks:
                continue
            space = self.spaces[gemm]
            for name, per_gemm in self.baselines.get(M, {}).items():
                idx = space.indices_of(per_gemm[gemm])
                if idx is not None:
                    self.store.enqueue((gemm, M), idx)
            for cfg in (self.settings.warm_start.configs(self.problem, gemm, M)
                        if self.settings.warm_start is not None else ()):
                cfg = fit(cfg, space)
                if (cfg is not None and self.family.check(cfg, self.problem, gemm, self.device) is None
                        and self.family.unwritable(cfg, gemm, self.device) is None):
                    self.store.enqueue((gemm, M), space.indices_of(cfg))
                    self.warm_queued += 1

    def _ask(self, slot: Slot):
        """A config to measure at slot.M, or None when the study's space is used up.

        Every ask is decided from the storage alone (what is queued, how many asks and
        re-proposals it holds) with a sampler seeded by that count, so a run killed at any point
        and resumed asks exactly what the uninterrupted run would have."""
        space, dists, study = self.spaces[slot.gemm], self.dists[slot.gemm], slot.study
        if self.shared:
            self._sync(slot)          # fails and re-queues a dead process's trial first
        while slot.asks_here < 50 * self.settings.trials + 200:
            slot.asks_here += 1
            sampler = self.policy.sampler(slot, self.seed_of(slot), self.settings.startup)
            if sampler is None:
                return None
            study.sampler = sampler
            slot.asks += 1
            trial = study.ask(dists)
            config = space.config_at(trial.params)
            trial.set_user_attr("config", space.entry_at(trial.params))     # tile sizes, for people reading the study
            reason = self.family.check(config, self.problem, slot.gemm, self.device)
            if reason:
                m = records.failure(self.problem.key, slot.gemm, slot.M, config, records.INVALID, reason)
                trial.set_user_attr(ATTR, m.to_dict())
                study.tell(trial, math.inf)
                continue
            if self._over_budget(slot, trial):
                fail_reason(study, trial.number, "budget already met by other workers")
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                slot.exhausted = True
                return None
            ck = config.key
            known = self.measured[slot.gemm, slot.M].get(ck)
            if known is not None or (slot.gemm, slot.M, ck) in self.pending:
                # Re-proposed: answer from what is known at no device cost.
                study.tell(trial, known.time_us if known is not None and known.ok else math.inf)
                slot.dups += 1
                continue
            slot.dups = 0
            return trial, config
        return None

    def _tell(self, done) -> None:
        t0 = time.perf_counter()
        for task, ms in done:
            self._told(task, ms)
        self.tell_s += time.perf_counter() - t0

    def _told(self, task: Task, ms: list[Measurement]) -> None:
        kind, slot, trial = task.tag
        slot.inflight -= 1
        # Neighbours first, the asked trial last: a process killed in between re-asks the same
        # config on resume and finds the neighbour measurements already there.
        for m in sorted(ms, key=lambda m: m.M == slot.M):
            self.pending.discard((task.gemm, m.M, task.config.key))
            self.measured_now += 1
            if not m.ok:
                self.failed += 1
            self.stored_trials += 1
            if m.M != slot.M:
                self._add(self.slots[task.gemm, m.M], m, {"shared_from": slot.M})
            elif self.store.commit_told((slot.gemm, slot.M), trial, m):
                slot.asked += 1
            else:
                # Another process declared this trial dead (missed heartbeats) and re-queued it;
                # the measurement is kept as its own trial, the re-queued copy will find it.
                self._add(slot, m, {"late_for": trial.number})
        self.store.running.pop(trial._trial_id, None)     # after the tell: a stop before it re-queues the trial
        if self.progress is not None:
            self.progress.update(1)
            b = self.best(slot.gemm, slot.M)
            text = f"{slot.gemm} M={slot.M}" + (f" best {b.time_us:.1f} us" if b else "")
            self.progress.set_postfix_str(text + (f", failed {self.failed}" if self.failed else ""), refresh=False)

    def _add(self, slot: Slot, m: Measurement, attrs: dict) -> None:
        idx = self.spaces[slot.gemm].indices_of(m.config)
        self.store.commit((slot.gemm, slot.M), m, idx, {"config": self.spaces[slot.gemm].entry_at(idx),
                                                      "shared_from": attrs.get("shared_from", slot.M), **attrs})

    def complete(self) -> bool:
        """Every study reached its trial budget (or ran out of configs)."""
        return all(s.asked >= self.settings.trials or s.exhausted for s in self.slots.values())

    # -- numbers for reports --------------------------------------------------------------------------
    def evaluations(self) -> int:
        """Configs measured on the device (rejected-before-launch ones excluded)."""
        return sum(1 for d in self.measured.values() for m in d.values() if m.status != records.INVALID)

    def trials_at(self, M: int) -> tuple[int, int]:
        """(measurements, failures) at M over both GEMMs, rejected-before-launch excluded."""
        ms = [m for g in self.family.gemms for m in self.measured[g, M].values() if m.status != records.INVALID]
        return len(ms), sum(1 for m in ms if not m.ok)
