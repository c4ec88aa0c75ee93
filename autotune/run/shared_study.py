"""One study searched by many workers (`autotune worker`, any number of hosts on one storage), and its
selection and files written from the storage (`autotune export`)."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from autotune.errors import NothingDone, UsageError
from autotune.run.config_search import check_config_files, select_and_export
from autotune.run.step import Step
from autotune.run.sinks import after_search


class SharedSearch(Step):
    """`autotune worker`: search the run's studies together with any number of other workers (any
    hosts) sharing the storage; stops when every study has its trials. Selection and files: `export`.
    Its check: something to tune here."""
    needs = ("device", "settings", "sinks", "plans", "pool", "storage", "run_name")
    provides = ("clock",)

    def check(self, ctx) -> None:
        fp = ctx.plans[0]
        if not fp.problems:          # before the storage is opened: nothing changes in it
            raise UsageError("nothing to tune on this device: " + (fp.unsupported or "no problems"))

    def run(self, ctx) -> None:
        from autotune.search.context import Clock
        from autotune.search.study import ProblemTuner

        fp, settings = ctx.plans[0], ctx.settings
        ctx.clock = Clock(ctx.pool)
        for p in fp.problems:
            with ctx.sinks.progress.bar(settings.trials * len(p.batch_sizes) * len(fp.family.gemms), "trial",
                                        p.key) as bar:
                tuner = ProblemTuner(ctx, p, fp.family, progress=bar)
                tuner.measure_baselines()
                tuner.search()
            print(f"{p.key}: {'complete' if tuner.complete() else 'stopped'}; this worker stored "
                  f"{tuner.stored_trials} trial measurements ({tuner.measured_now} device measurements)")


@dataclass
class ExportStudy(Step):
    """`autotune export`: select per M (top candidates re-measured on this device or replay) and write
    the files, from a shared study. Refuses a study short of its trials unless --partial. Its check:
    something to tune, every file it writes ours to overwrite; what it reads
    in the storage is checked as the storage is opened, before the claim (`studies_there`)."""
    needs = ("request", "device", "settings", "sinks", "plan_only", "plans", "pool", "storage", "run_name", "folder")
    provides = ("clock",)
    partial: bool = False

    def check(self, ctx) -> None:
        from autotune.run.plan import refuse_nothing_to_tune

        refuse_nothing_to_tune(ctx.plans)
        check_config_files(ctx, ctx.plans)

    def run(self, ctx) -> None:
        from autotune.search.context import Clock
        from autotune.search.study import ProblemTuner

        plan, settings, summary = ctx.plans[0], ctx.settings, ctx.sinks.summary
        ctx.clock = Clock(ctx.pool)
        wrote = False
        for p in plan.problems:
            t0 = time.monotonic()
            tuner = ProblemTuner(ctx, p, plan.family)
            if not tuner.complete() and not self.partial:
                done = sum(min(s.asked, settings.trials) for s in tuner.slots.values())
                raise UsageError(f"{p.key}: study is partial ({done} of {settings.trials * len(tuner.slots)} "
                                 f"trials); nothing exported (--partial exports it anyway)")
            tuner.measure_baselines()
            wrote |= select_and_export(ctx, tuner, t0)
        if not wrote and not summary.failures:
            raise NothingDone("no config ran correctly at any batch size in the study: nothing exported")
        if wrote:
            plan.family.after_export(ctx.folder, functools.partial(after_search, summary))


def studies_there(storage, plan, run: str, partial: bool) -> None:
    """Every study export would read is in the storage, checked before any is opened (opening creates
    a missing one): a problem the run never measured is said, not exported from empty studies."""
    import optuna

    from autotune.store.storage import config_study_name

    have = set(optuna.get_all_study_names(storage))
    if f"autotune-run|{run}" not in have:
        return                  # the claim says which runs the storage holds
    for p in plan.problems:
        names = [config_study_name(plan.family.name, run, p.key, g, M) for g in plan.family.gemms for M in p.batch_sizes]
        missing = [n for n in names if n not in have]
        if len(missing) == len(names):
            raise UsageError(f"{p.key}: run '{run}' holds no studies of it; nothing exported (its workers measure it: "
                             "`autotune worker` with the same --study, model and --tp)")
        if missing and not partial:
            raise UsageError(f"{p.key}: run '{run}' holds {len(names) - len(missing)} of its {len(names)} studies; "
                             "nothing exported (--partial exports it anyway)")

