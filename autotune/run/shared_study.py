"""One study searched by many workers (`autotune worker`, any number of hosts on one storage), and its
selection and files written from the storage (`autotune export`)."""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from autotune.errors import Incomplete, NothingDone, UsageError
from autotune.run.common import after_search, load_warm_start, no_bar, triton_settings
from autotune.run.config_search import overlay, select_and_export, sku_names
from autotune.run.opening import open_device
from autotune.run.outputs import open_storage_claimed, outputs_then_storage, run_name


def search_shared(req) -> None:
    """Search the run's studies together with any number of other workers (any hosts) sharing
    the storage; stops when every study has its trials. Selection and files: `autotune export`."""
    from tqdm import tqdm

    from autotune.search.context import Clock, SearchContext
    from autotune.search.study import ProblemTuner

    budget = req.budget            # seconds (autotune.cli.inputs.seconds)
    warm = load_warm_start(req.warm_start)
    device, pool, cache, exp, plans, _ = open_device(req, ["triton_moe"])
    name = run_name(req, device)
    with pool:
        fp = plans[0]
        if not fp.problems:          # before the storage is opened: nothing changes in it
            raise UsageError("nothing to tune on this device: " + (fp.unsupported or "no problems"))
        storage = open_storage_claimed(req, device, name, shared=True)
        settings = triton_settings(req, budget, warm)
        clock = Clock(pool)
        for p in fp.problems:
            with tqdm(total=settings.trials * len(p.batch_sizes) * len(fp.family.gemms), unit="trial",
                      desc=p.key, file=sys.stderr, disable=no_bar(req), dynamic_ncols=True) as bar:
                tuner = ProblemTuner(SearchContext(storage, device, pool, settings, name, clock), p, fp.family,
                                     progress=bar)
                tuner.measure_baselines()
                tuner.search()
            print(f"{p.key}: {'complete' if tuner.complete() else 'stopped'}; this worker stored "
                  f"{tuner.stored_trials} trial measurements ({tuner.measured_now} device measurements)")


def export_shared(req) -> None:
    """Select per M (top candidates re-measured on this device or replay) and write the files,
    from a shared study. Refuses a study short of its trials unless --partial."""
    from autotune.search.context import Clock, SearchContext
    from autotune.search.study import ProblemTuner

    if req.out is None:
        req = dataclasses.replace(req, out="tuned_configs/replay" if req.replay else "tuned_configs")
    device, pool, cache, exp, plans, _ = open_device(req, ["triton_moe"])
    skus = sku_names(req, device)
    name = run_name(req, device)
    storage = outputs_then_storage(req, device, pool, plans, skus, name,
                                   read_first=lambda st: _studies_there(st, plans[0], name, req.partial))
    settings = triton_settings(req, None, load_warm_start(req.warm_start))
    clock = Clock(pool)
    wrote, summary = False, {}
    from autotune.folder.change import folder_change
    with pool, folder_change(Path(req.out) / device.file_name) as change:
        change.begin()
        for p in plans[0].problems:
            t0 = time.monotonic()
            tuner = ProblemTuner(SearchContext(storage, device, pool, settings, name, clock), p, plans[0].family)
            if not tuner.complete() and not req.partial:
                done = sum(min(s.asked, settings.trials) for s in tuner.slots.values())
                raise UsageError(f"{p.key}: study is partial ({done} of {settings.trials * len(tuner.slots)} "
                                 f"trials); nothing exported (--partial exports it anyway)")
            tuner.measure_baselines()
            wrote |= select_and_export(req, tuner, device, clock, t0, summary)
        if not wrote and not summary.get("incomplete"):
            raise NothingDone("no config ran correctly at any batch size in the study: nothing exported")
        if wrote:
            after_search(summary, "SGLang's shipped files and the SKU copies beside the tuned files", overlay,
                         req, device, plans[0].family, folder_step=True)
    if change.outcome:
        summary.setdefault("incomplete", []).append(change.outcome)
    if summary.get("incomplete"):
        raise Incomplete("; ".join(summary["incomplete"]))


def _studies_there(storage, plan, run: str, partial: bool) -> None:
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

