"""`autotune run`'s (and `export`'s) config-search step: for each config family (registry.CONFIGS), search each
problem, then the family's hooks (autotune.contract.protocol.ConfigFamily): select per M, check the picks as the
server runs them, write its files, and what goes beside them once they are in. The step keeps the loop, the
budget's share per problem and what the run says; what the files are is the family's."""
from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field

from autotune.errors import NothingDone, UsageError
from autotune.run.step import Step
from autotune.run.sinks import after_search


@dataclass
class ConfigSearch(Step):
    """The config families' plans. Its check (a run that writes): every file the export will write into
    the tuned folder is one autotune may overwrite."""
    plans: list = field(default_factory=list)
    wrote: bool = False
    problems_left: int = 0      # the problems not yet searched: they share what is left of --budget
    needs = ("request", "device", "settings", "sinks", "plan_only", "plans", "cache", "pool", "storage", "run_name",
             "folder")
    provides = ("clock",)

    def check(self, ctx) -> None:
        check_config_files(ctx, self.plans)

    def run(self, ctx) -> None:
        from autotune.contract import registry
        from autotune.run.plan import phase_name
        from autotune.search.context import Clock

        if not self.plans:
            return
        if hasattr(ctx.pool, "use_phase"):
            ctx.pool.use_phase(phase_name(registry.CONFIGS))
        ctx.clock = Clock(ctx.pool)       # a replay's budget counts the search's recorded device time, from here
        self.problems_left = sum(len(fp.problems) for fp in self.plans)
        for fp in self.plans:
            self.wrote |= self.search_family(ctx, fp)

    def search_family(self, ctx, fp) -> bool:
        """Search, select and export each problem of `fp`; True when a file was written for one of them."""
        from autotune.search.study import ProblemTuner

        family, record = fp.family, ctx.sinks.record
        wrote = False
        for p in fp.problems:
            t0 = time.monotonic()
            ctx.settings.ends_at = problem_end(ctx, self.problems_left)
            self.problems_left -= 1
            phases = Phases()
            with ctx.sinks.progress.bar(ctx.settings.trials * len(p.batch_sizes) * len(family.gemms), "trial",
                                        p.key) as bar:
                tuner = ProblemTuner(ctx, p, family, progress=bar)
                bar.update(sum(s.asked for s in tuner.slots.values()))
                phases.done("studies opened")
                tuner.measure_baselines()
                phases.done("baselines")
                tuner.search()
                phases.done("search")
            if ctx.settings.ends_at is not None and not any(sl.asks_here for sl in tuner.slots.values()):
                print(f"  --budget left no time to search {p.key}: the start and the baselines took "
                      f"{time.monotonic() - t0:.0f} s of it and the finalists' checks need the rest; its files hold the "
                      "faster of SGLang's own configs per batch size (a larger --budget searches)")
            wrote |= select_and_export(ctx, tuner, t0, phases)
            if record.path:
                after_search(ctx.sinks.summary, f"--record {record.path}", record.add, ctx.device, p,
                             (m for d in tuner.measured.values() for m in d.values()), careful=tuner.careful.values())
        if wrote:
            family.after_export(ctx.folder, functools.partial(after_search, ctx.sinks.summary))
        return wrote

    def nothing_done(self, ctx) -> Exception:
        """Why the run ends without a file of these families (the lines above say what each problem lacked)."""
        if ctx.sinks.summary.failures:
            return ctx.sinks.summary.incomplete_error()
        return NothingDone("no config of " + ", ".join(fp.name for fp in self.plans) + " ran correctly at any batch "
                           "size: nothing written (the lines above say why)")


# What a run does after its config searches beside the backend choice: the summary, closing the pool and the
# process's own exit (its CUDA context): 4-7 s on the H100.
FINISH_S = 6.0


def problem_end(ctx, problems_left: int) -> float | None:
    """On a GPU with --budget (the run's wall time from the process's start): when this problem's files must be
    written, the time left shared equally by the `problems_left`, less what the backend choice after them is
    estimated to take (autotune.run.scope). None elsewhere: a replay's budget is its recorded device seconds."""
    from autotune.search.context import process_started

    budget = ctx.settings.budget_s
    if budget is None or ctx.device.kind != "gpu":
        return None
    end = process_started() + budget - FINISH_S - backend_choice_s(ctx)
    return time.monotonic() + max(0.0, end - time.monotonic()) / max(1, problems_left)


def backend_choice_s(ctx) -> float:
    """The scope's estimate of the backend families' device time in this run (0 where there are none)."""
    from autotune.contract import registry
    from autotune.problems.selection import selection
    from autotune.run.scope import scope

    plans = [fp for fp in ctx.plans if registry.get(fp.name).step == registry.BACKENDS and fp.problems]
    if not plans:
        return 0.0
    req = ctx.request
    est = scope(plans, selection(req).tps, req.trials or 40, req.neighbours, None, ctx.cache, ctx.device).device_s
    return est or 0.5 * (ctx.settings.budget_s or 0.0)


def check_config_files(ctx, plans) -> None:
    from autotune.errors import ExportError

    if ctx.plan_only:
        return
    try:
        for fp in plans:
            fp.family.export_targets(ctx.folder, fp.problems)
    except ExportError as e:
        raise UsageError(str(e)) from None


class Phases:
    """Where a problem's wall time went (the run says it, and --json keeps it): seconds per step, in order."""

    def __init__(self):
        self.seconds: dict = {}
        self._last = time.monotonic()

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(now - self._last, 1)
        self._last = now

    def line(self, tuner) -> str:
        return ("  time: " + ", ".join(f"{k} {v:.0f} s" for k, v in self.seconds.items())
                + f" (this process's asks {tuner.ask_s:.0f} s and stores {tuner.tell_s:.0f} s during the search)")


def select_and_export(ctx, tuner, t0, phases=None) -> bool:
    """Select each M's finalist, check the picks as the server runs them and write the problem's files (the
    family's `select`, `confirm` and `export`); False (nothing written) where no finalist, baselines included,
    ran correctly at any M: a file of `{}` would replace SGLang's shipped one."""
    from autotune.run.report import problem_table, table_records

    p, family, device = tuner.problem, tuner.family, ctx.device
    clock, summary = ctx.clock, ctx.sinks.summary
    phases = phases or Phases()
    choices = family.select(tuner, tuner.settings.top, tuner.settings.careful_repeats)
    phases.done("selection")
    if not choices:
        print(f"\n{p.key}: no config ran correctly at any batch size, SGLang's default and shipped ones "
              "included: no file written for it")
        return False
    checked = family.confirm(tuner, choices, functools.partial(after_search, summary))
    phases.done(checked.step)
    run = problem_run(ctx, tuner, t0, checked)
    written = after_search(summary, f"writing the files of {p.key}", family.export, ctx.folder, p, choices, run,
                           writes=ctx.folder)
    phases.done("files")
    if written is None:
        return False
    written["files"] = [ctx.folder.real(f) for f in written["files"]]
    print(f"\n{p.key} ({'replay' if device.is_replay else device.name}): {tuner.evaluations()} configs measured "
          f"({tuner.measured_now} device measurements by this run, careful re-measurements of the finalists "
          f"included), device time {clock.device_s():.0f} s")
    table = problem_table(choices, run.trials, checked.columns)
    ctx.sinks.report.table(table)
    timed = {"time_s": {**phases.seconds, "asks": round(tuner.ask_s, 1), "stores": round(tuner.tell_s, 1)}} \
        if device.kind == "gpu" else {}            # a replay's seconds are the CPU's: they say nothing of a GPU run
    summary.add(family.name, {"problem": p.key, "per_M": table_records(table), "files": written["files"],
                              "kept": written["kept"], "evaluations": tuner.evaluations(),
                              "measured_this_run": tuner.measured_now, **timed})
    if timed:
        print(phases.line(tuner))
    for M, why in written["kept"].items():
        print(f"  M={M}: kept the existing config ({why})")
    print("  wrote " + "\n  wrote ".join(written["files"]))
    for M in written["missing"]:
        why = family.why_unselected(tuner, M)
        print(f"  M={M}: no key written: {why} (SGLang takes the nearest batch size's key)")
        summary.incomplete(f"{p.key} has no key for M={M} ({why})")
    return True


def problem_run(ctx, tuner, t0: float, checked):
    """What the run did for the problem, as the family's export records it beside its files."""
    from autotune.contract.protocol import ProblemRun
    from autotune.store.storage import safe_url

    req = ctx.request
    return ProblemRun(command="autotune " + " ".join(sys.argv[1:]), trials_per_study=tuner.settings.trials,
                      evaluations=tuner.evaluations(), measured_this_run=tuner.measured_now,
                      complete=tuner.complete(), device_seconds=round(ctx.clock.device_s(), 1),
                      wall_seconds=round(time.monotonic() - t0, 1),
                      storage=safe_url(req.storage or "sqlite:///autotune.db"), warm_start=req.warm_start,
                      warm_start_configs=tuner.warm_queued,
                      trials={M: tuner.trials_at(M) for M in tuner.problem.batch_sizes}, checked=checked)
