"""Backend choice: per problem and M the fastest backend that is correct at every M (the one backend
per server is autotune.search.server_choice's, over these tuners).

The spaces are small (a handful of backends), so every available backend is measured at every
M of the problem in one task (one JIT build, one set of inputs). A backend whose output is
wrong (NaN, Inf, zeros, off the reference) or whose run crashes or hangs at ANY M is
disqualified for the problem, with that evidence. Measurements live in Optuna studies (one per
problem and M, params backend + tactic), so a run resumes and optuna-dashboard shows them.
Inside a backend with tactics (FlashInfer's runners), the first task of the default (-1) also
lists the tactics FlashInfer's runner object offers at each M; every offered tactic is then
measured and checked at every M that offers it. A tactic wrong anywhere is disqualified alone
(the blocklist gets it); a backend only when its default fails.
"""
from __future__ import annotations

import json
import zlib

import optuna

from autotune.measure import records
from autotune.search.context import SearchContext
from autotune.search.finalists import TUNED, Choice, Finalist, remeasure, score, winner
from autotune.contract.backend_family import LAYER, backend_config
from autotune.contract.config import KernelConfig
from autotune.measure.timing import noise
from autotune.measure.records import Measurement
from autotune.store.storage import Store, backend_study_name
from autotune.search.server_choice import MIXES, ServerChoice, server_choice  # noqa: F401  (imported from here by the CLI, export)
from autotune.measure.tasks import Task, run_tasks

def tactic_id(tactic) -> int:
    """A tactic as the study's integer parameter (Optuna parameters are scalars): FlashInfer's
    integer tactics as they are, compound ones (cuDNN's (engine, knobs)) by a stable hash. The
    tactic itself is in the trial's measurement."""
    if isinstance(tactic, int):
        return tactic
    return 1_000_000 + zlib.crc32(json.dumps(tactic).encode()) % 1_000_000_000


def pins_over_default(tactic: Measurement | None, default: Measurement | None) -> bool:
    """Whether a tactic's re-measured time beats its backend's default (-1) by more than the
    noise (the larger spread, at least measure.MIN_EFFECT). A tactic timed beside its default
    (measure.duel) is judged against that default, with the spread of the per-round ratios as
    noise too: two timings taken apart differ by more than either's spread (on the H200 cuBLAS
    algo 0, the very kernel -1 runs, came out 1-3% faster in three of five pins)."""
    if tactic is None or default is None or not (tactic.ok and default.ok) or tactic.config.get("tactic", -1) == -1:
        return False
    if tactic.versus_us:
        return tactic.time_us * (1 + noise(tactic.spread, tactic.versus_spread or 0.0)) < tactic.versus_us
    return tactic.time_us * (1 + noise(tactic.spread, default.spread)) < default.time_us


class BackendTuner:
    def __init__(self, ctx: SearchContext, problem, family, progress=None, careful_repeats: int = 21, top: int = 3):
        """`ctx`: where it stores and measures (its settings and clock are the Triton search's only)."""
        device = ctx.device
        self.problem, self.family, self.device, self.pool = problem, family, device, ctx.pool
        self.progress, self.careful_repeats, self.top = progress, careful_repeats, top
        self.Ms = list(problem.batch_sizes)
        self.names = tuple(family.space(problem, "layer", device).params["backend"])
        # Every declared backend, sorted: what may run differs between machines and runs
        # (--skip-backends, packages), and Optuna refuses a study whose value sets change.
        declared = tuple(sorted({a.backend.name for a in family.availability(device)} | set(self.names)))
        self.dists = {"backend": optuna.distributions.CategoricalDistribution(declared or ("none",)),
                      "tactic": optuna.distributions.IntDistribution(-1, 2_000_000_000)}
        # The exhaustive strategy over the store: every backend (and tactic) at every M, no sampler.
        self.store = Store(ctx.storage, {(LAYER, M): self.dists for M in self.Ms})
        for M in self.Ms:
            self.store.open((LAYER, M), backend_study_name(family.name, ctx.study_device(), problem.key, M))
            self.store.sync((LAYER, M))
        self.studies = {M: self.store.studies[LAYER, M] for M in self.Ms}
        self.measured = {M: self.store.measured[LAYER, M] for M in self.Ms}   # M -> config.key -> Measurement
        self.careful = self.store.careful       # (LAYER, M, config.key) -> careful re-measurement
        self.unavailable: dict = {}     # (M, config key) -> measurement that could not import its code
        self.measured_now = 0

    # -- measuring ---------------------------------------------------------------------------------
    def configs(self) -> list[KernelConfig]:
        return [backend_config(b) for b in self.names]

    def _tunable(self, backend: str) -> bool:
        runner = getattr(self.family, "runner", None)     # families without runner objects: no tactics
        return bool(runner is not None and getattr(runner(backend), "tunable", False))

    def tactic_configs(self) -> dict[str, tuple[KernelConfig, list[int]]]:
        """config key -> (config, the Ms whose default run listed it) for every tactic other than
        -1 that a backend's runner offered (a tactic may be valid at some M buckets only)."""
        bad = self.disqualified()
        out: dict = {}
        for M in self.Ms:
            for m in self.measured[M].values():
                b = m.config["backend"]
                if m.config.get("tactic", -1) != -1 or not m.ok or b in bad or not m.tactics:
                    continue
                for t in m.tactics:
                    if t != -1:
                        cfg = backend_config(b, t)
                        out.setdefault(cfg.key, (cfg, []))[1].append(M)
        return out

    def _task(self, config: KernelConfig, Ms: list[int], repeats=None, tactics: bool = False, versus=None) -> Task:
        # Workers import the family by `spec` ("module:Class") where no package declares it.
        return Task(self.problem.to_dict(), self.problem.key, "layer", config, list(Ms), repeats=repeats,
                    family=getattr(self.family, "spec", self.family.name), tactics=tactics, versus=versus)

    def measure(self) -> None:
        """The default of every backend (listing its tactics), then every tactic offered."""
        tasks = []
        for cfg in self.configs():
            Ms = [M for M in self.Ms if cfg.key not in self.measured[M]]
            if Ms:
                tasks.append(self._task(cfg, Ms, tactics=self._tunable(cfg["backend"])))
        self._run(tasks)
        tasks = []
        for key, (cfg, offered) in self.tactic_configs().items():
            Ms = [M for M in offered if key not in self.measured[M]]
            if Ms:
                tasks.append(self._task(cfg, Ms))
        self._run_more(tasks)
        # tactics of independent parts (cutlass_fused_moe's [gemm1, gemm2]): each part's best, together
        self._run_more([self._task(cfg, [M for M in Ms if key not in self.measured[M]])
                        for key, (cfg, Ms) in self.combined_tactics().items()
                        if any(key not in self.measured[M] for M in Ms)])

    def _run_more(self, tasks: list) -> None:
        if tasks and self.progress is not None:    # the bar counted backends; now their tactics too
            self.progress.total = (self.progress.total or 0) + len(tasks)
            self.progress.refresh()
        self._run(tasks)

    def _axes(self, backend: str) -> int:
        runner = getattr(self.family, "runner", None)
        return int(getattr(runner(backend), "tactic_axes", 0) or 0) if runner is not None else 0

    def combined_tactics(self) -> dict[str, tuple[KernelConfig, list[int]]]:
        """config key -> (config, Ms): for a backend whose tactics have independent parts, per M the
        fastest correct one-part tactic of each part, together (a part with none stays -1)."""
        bad, bad_tactics = self.disqualified(), self.disqualified_tactics()
        out: dict = {}
        for M in self.Ms:
            best: dict = {}       # (backend, part) -> (time, value)
            for m in self.measured[M].values():
                b, t = m.config["backend"], m.config.get("tactic", -1)
                if (not m.ok or b in bad or m.config.key in bad_tactics or not isinstance(t, list)
                        or len(t) != self._axes(b)):
                    continue
                varied = [i for i, v in enumerate(t) if v != -1]
                if len(varied) == 1 and ((b, varied[0]) not in best or m.time_us < best[b, varied[0]][0]):
                    best[b, varied[0]] = (m.time_us, t[varied[0]])
            for b in sorted({b for b, _ in best}):
                parts = [best[b, i][1] if (b, i) in best else -1 for i in range(self._axes(b))]
                if sum(v != -1 for v in parts) >= 2:          # one part alone was measured already
                    cfg = backend_config(b, parts)
                    out.setdefault(cfg.key, (cfg, []))[1].append(M)
        return out

    def _run(self, tasks: list) -> None:
        def done(task, ms):
            for m in ms:
                self.measured_now += 1
                if self._set_aside(m):
                    continue
                self.store.commit((LAYER, m.M), m, {"backend": m.config["backend"],
                                                    "tactic": tactic_id(m.config.get("tactic", -1))})
            if self.progress is not None:
                self.progress.update(1)
        run_tasks(self.pool, tasks, done)

    # -- the correctness gate --------------------------------------------------------------------------
    def _failures(self):
        for M in self.Ms:
            for m in self.measured[M].values():
                if m.status not in (records.OK, records.INVALID, records.NOT_RECORDED):
                    yield m

    def disqualified(self) -> dict[str, Measurement]:
        """backend -> the first failed run of its default (lowest M): wrong, crashed or hung anywhere."""
        out: dict = {}
        for m in self._failures():
            if m.config.get("tactic", -1) == -1:
                out.setdefault(m.config["backend"], m)
        return out

    def disqualified_tactics(self) -> dict[str, Measurement]:
        """config key -> the first failed run (lowest M) of a tactic other than -1: a tactic wrong,
        crashed, hung or replaced by FlashInfer's default at any M is out at every M."""
        out: dict = {}
        for m in self._failures():
            if m.config.get("tactic", -1) != -1:
                out.setdefault(m.config.key, m)
        return out

    # -- selection -------------------------------------------------------------------------------------
    def select(self) -> dict[int, Choice]:
        """Per M: the top few correct backends and SGLang's auto, re-measured; the fastest wins
        (autotune.search.finalists, the selection step the Triton configs go through too)."""
        bad, bad_tactics = self.disqualified(), self.disqualified_tactics()
        auto = self.family.sglang_auto(self.device)
        auto_cfg = backend_config(auto)
        plan: dict = {}
        for M in self.Ms:
            oks = sorted((m for m in self.measured[M].values() if m.ok and m.config["backend"] not in bad
                          and m.config.key not in bad_tactics), key=lambda m: m.time_us)
            cands = [Finalist(TUNED, {LAYER: m.config}) for m in oks[: self.top] if m.config != auto_cfg]
            if (auto in self.names and auto not in bad and (M, auto_cfg.key) not in self.unavailable):
                cands.append(Finalist("auto", {LAYER: auto_cfg}))
            plan[M] = cands

        self._remeasure(plan)
        return self._choose(plan, auto_cfg)

    def tactic_choices(self) -> dict[str, dict[int, Choice]]:
        """backend -> M -> its best correct tactic, re-measured beside its own default (-1) as
        `select` re-measures: what FlashInfer's cache pins for that backend wherever SGLang runs it,
        whichever backend wins the M overall. A tactic wins only by beating -1 beyond the noise
        (`pins_over_default`): a gain inside it does not carry to another process (on the H200 a
        1.5% pick came out 1.4% slower than -1 in a fresh process), and every pin is a
        non-default code path in production for no measurable gain."""
        bad, bad_tactics = self.disqualified(), self.disqualified_tactics()
        plans: dict = {}
        for b in self.names:
            if b in bad or not self._tunable(b):
                continue
            default = backend_config(b)
            for M in self.Ms:
                d = self.measured[M].get(default.key)
                tactics = sorted((m for m in self.measured[M].values()
                                  if m.ok and m.config["backend"] == b and m.config.get("tactic", -1) != -1
                                  and m.config.key not in bad_tactics), key=lambda m: m.time_us)
                if d is not None and d.ok and tactics:
                    plans.setdefault(b, {})[M] = [Finalist("default", {LAYER: default})] + [
                        Finalist(TUNED, {LAYER: m.config}) for m in tactics[: self.top]]
        together: dict = {}
        for plan in plans.values():
            for M, cands in plan.items():
                together.setdefault(M, []).extend(cands)
        self._remeasure(together)
        out = {}
        for b, plan in plans.items():
            default = backend_config(b)
            out[b] = {}
            for M, c in self._choose(plan, default).items():
                d = self.careful.get((LAYER, M, default.key))
                if d is None or not d.ok:
                    continue
                # The tactic furthest below the default it was timed beside (its time if unpaired).
                timed = [m for f in plan[M] if f.source == TUNED
                         and (m := self.careful.get((LAYER, M, f.configs[LAYER].key))) is not None and m.ok]
                best = min(timed, key=lambda m: m.time_us / (m.versus_us or d.time_us), default=None)
                out[b][M] = (Choice.layer(M, best.config, best.time_us, best.versus_us or d.time_us, c.candidates, "default")
                             if pins_over_default(best, d) else
                             Choice.layer(M, default, d.time_us, d.time_us, c.candidates, "default"))
        return out

    def _remeasure(self, plan: dict) -> None:
        def store(gemm, m):
            self.measured_now += 1
            if self._set_aside(m):
                return
            self.store.commit_careful((LAYER, m.M), m)
        def task(gemm, cfg, Ms):     # a tactic is re-timed beside its backend's default (measure.duel)
            versus = None if cfg.get("tactic", -1) == -1 else backend_config(cfg["backend"])
            return self._task(cfg, Ms, repeats=self.careful_repeats, versus=versus)
        remeasure(plan, self.careful, task,
                  lambda tasks, done: run_tasks(self.pool, tasks, done), store)

    def _choose(self, plan: dict, baseline_cfg: KernelConfig) -> dict[int, Choice]:
        """Per M the fastest re-measured finalist, with the baseline's (auto's, or -1's) time beside it."""
        choices = {}
        for M, cands in plan.items():
            scored = [s for s in score(cands, M, self.careful) if s.total_us is not None]
            win = winner(scored)
            if win is None:
                continue
            base = self.careful.get((LAYER, M, baseline_cfg.key))
            choices[M] = Choice.layer(M, win.finalist.configs[LAYER], win.total_us,
                                base.time_us if base and base.ok else None,
                                scored)
        return choices

    def _set_aside(self, m: Measurement) -> bool:
        """A launch that could not import its code is kept out of the study (a re-run retries it)."""
        if m.status != records.UNAVAILABLE:
            return False
        self.unavailable[m.M, m.config.key] = m
        return True

    def unavailable_backends(self) -> dict[str, Measurement]:
        """backend -> its first (lowest M) launch that could not import what it needs."""
        out: dict = {}
        for (M, _), m in sorted(self.unavailable.items(), key=lambda kv: kv[0][0]):
            out.setdefault(m.config["backend"], m)
        return out

    def skipped_here(self) -> dict[str, str]:
        """backend -> why it has no time on this machine or cache, though the table allows it."""
        out = {}
        for b in self.names:
            ms = [self.measured[M].get(backend_config(b).key) for M in self.Ms]
            if all(m is not None and m.status == records.NOT_RECORDED for m in ms):
                out[b] = "not in the replay cache"
        for b, m in self.unavailable_backends().items():
            out.setdefault(b, f"unavailable on this machine ({m.reason}); not stored, a re-run retries it")
        return out

    def _default_of(self, backend: str, M: int) -> Measurement | None:
        cfg = backend_config(backend)
        m = self.careful.get((LAYER, M, cfg.key)) or self.measured[M].get(cfg.key)
        return m if m is not None and m.ok else None

    def time_of(self, backend: str, M: int) -> float | None:
        """Best known time of a backend at M (careful re-measurement if any), None if not ok."""
        m = self._default_of(backend, M)
        return m.time_us if m is not None else None

    def spread_of(self, backend: str, M: int) -> float:
        """The spread of that timing (0 when there is none)."""
        m = self._default_of(backend, M)
        return m.spread if m is not None else 0.0
