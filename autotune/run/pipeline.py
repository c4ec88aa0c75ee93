"""The commands that measure, each a list of steps over one context (autotune.run.context): the request
read into the context (its settings and sinks), the device and plans opened, every step's check, then
every step's run, then the sinks finished. The steps import nothing from here.

    run:    Workers, SayScope, HoldFolder, ClaimStorage, RunLock, SayPlan, ConfigSearch, BackendChoice
    worker: Workers, ClaimStorage (shared), SharedSearch
    export: Workers, HoldFolder, ClaimStorage (reading an existing run), ExportStudy

The tuned folder is held before the storage is claimed: a command refused because another one writes
into the same folder leaves the storage as it found it (a fresh one is not even made).
    record: Workers, RecordGrid (checked before the device is opened: none of its checks needs it)
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.errors import Incomplete, UsageError
from autotune.contract import registry
from autotune.run import opening
from autotune.run.claim import ClaimStorage
from autotune.run.context import COMMAND, RunContext, search_settings
from autotune.run.outputs import HoldFolder
from autotune.run.requests import ExportRequest, RecordRequest, RunRequest, RunResult, WorkerRequest
from autotune.run.sinks import Sinks, after_search
from autotune.run.step import check_order
from autotune.run.workers import Workers


def run(req: RunRequest) -> RunResult:
    """Plan every requested family on the device, check every step, then run each (the pool, the
    storage, the tuned folder, each family's config search or backend choice); the --json summary last."""
    kernels = run_request(req)
    req = with_out(req, req.only_drifted)
    ctx = RunContext(request=req, settings=search_settings(req, req.budget), plan_only=req.dry_run,
                     sinks=Sinks.of(req, json=req.json, record=req.record), kernels=tuple(kernels))
    opening.open_device(ctx, kernels, target=req.target_device, drifted=req.only_drifted, skip=req.skip_backends)
    if req.only_drifted and not any(fp.problems or fp.skipped for fp in ctx.plans):
        print(f"nothing drifted in {req.only_drifted}: every file fits this machine and SGLang "
              f"{', '.join(opening.targets(req))}; nothing to re-tune")
        return RunResult()
    summary = ctx.sinks.summary
    if ctx.memory is not None:
        summary.data["memory_plan"] = ctx.memory.to_dict()
    families = family_steps(ctx, req)
    steps = [*run_steps(), *families]
    with ctx.held:
        check(ctx, steps)
        if ctx.plan_only:
            from autotune.run.scope import say_dry_run
            say_dry_run(ctx)
            return RunResult()
        for step in steps:
            step.run(ctx)
        planned = [s for s in families if s.plans]
        if planned and not any(s.wrote for s in planned):   # the last one says why (backends: their tables)
            raise planned[-1].nothing_done(ctx)
        if ctx.memory is not None:
            pool = ctx.pool
            summary.data["memory_plan"].update(measured_peak_bytes=pool.peak_bytes,
                                               resource_retries=pool.resource_retries, workers_retired=pool.retired)
            say_pace(ctx)
    if ctx.folder.outcome:
        print(ctx.folder.outcome)
        summary.incomplete(ctx.folder.outcome)
    after_search(summary, f"--json {summary.path}", summary.write, ctx)
    if summary.failures:
        raise summary.incomplete_error()
    return RunResult(summary.data, str(ctx.folder.given))


def say_pace(ctx) -> None:
    """The run's pace on a GPU, printed and in --json: measurements per second, the GPU's busy share, what it
    waited for, and the budget against the wall time so far (from the process's start)."""
    from autotune.run.report import pace_lines
    from autotune.search.context import process_started

    pace = ctx.pool.pace.to_dict(since=process_started())
    ctx.sinks.summary.data["pace"] = {**pace, "budget_s": ctx.settings.budget_s, "pool": ctx.pool.pace.to_dict()}
    for line in pace_lines(pace, ctx.settings.budget_s):
        print(line)


def run_steps() -> list:
    """`autotune run`'s steps before the families', in the order they run."""
    from autotune.run.claim import RunLock
    from autotune.run.plan import SayPlan
    from autotune.run.scope import SayScope

    return [Workers(), SayScope(), HoldFolder(), ClaimStorage(), RunLock(), SayPlan()]


def family_steps(ctx, req: RunRequest) -> list:
    """The families' steps, each over its plans (empty where none was asked for or fits here): the
    config search, then the backend choice."""
    from autotune.run.backend_choice import BackendChoice
    from autotune.run.config_search import ConfigSearch
    from autotune.run.plan import by_step

    by = by_step(ctx.plans)
    return [ConfigSearch(by.get(registry.CONFIGS, [])),
            BackendChoice(by.get(registry.BACKENDS, []), mix=req.mix, checkpoint=req.checkpoint)]


def check(ctx, steps) -> None:
    """Every precondition, before anything runs: the steps' order (each has what it needs from the command, the
    opening or a step before it: autotune.run.step.check_order), the sinks' files (--record, --json), then each
    step's in the order they run."""
    check_order(steps, (*COMMAND, *opening.PROVIDES))
    ctx.sinks.check(ctx)
    for step in steps:
        step.check(ctx)


def run_request(req: RunRequest) -> list[str]:
    """`run`'s flags that contradict each other or name what the run does not do; the families
    --kernels names."""
    from autotune.run.plan import PlanError, parse_kernels

    if req.target_device and not req.dry_run:
        raise UsageError("--target-device plans a run for a GPU model: it needs --dry-run (a run measures on the "
                         "GPU it finds, or replays --replay)")
    if req.target_device and req.replay:
        raise UsageError("--target-device and --replay both name the device: give one")
    try:
        kernels = parse_kernels(req.kernels)
    except PlanError as e:
        raise UsageError(str(e))
    check_for_kernels(req, kernels)
    return kernels


def with_out(req, drifted: str | None = None):
    """`req` with its --out: given, else the folder --only-drifted re-tunes, else tuned_configs (replayed
    results never land beside configs measured on a GPU)."""
    if req.out is None and drifted:
        return dataclasses.replace(req, out=str(Path(drifted).resolve().parent))   # back where they were
    if req.out is None:
        return dataclasses.replace(req, out="tuned_configs/replay" if req.replay else "tuned_configs")
    return req


def check_for_kernels(req: RunRequest, kernels: list[str]) -> None:
    """The settings of one family need it among the run's kernels: without it they were ignored in
    silence (a search space never read, server_args.yaml naming another family's runner)."""
    retuned = registry.default()       # the family a warm start and --only-drifted re-tune
    readers = {"--search-space": [n for n in registry.names() if "space_path" in registry.get(n).options],
               "--warm-start": [retuned], "--only-drifted": [retuned]}
    for flag, value in (("--search-space", req.search_space), ("--warm-start", req.warm_start),
                        ("--only-drifted", req.only_drifted)):
        if value is not None and not set(readers[flag]) & set(kernels):
            raise UsageError(f"{flag} is read by {', '.join(readers[flag])}, which --kernels {req.kernels} does not "
                             f"run: add it to --kernels or leave {flag} out")
    if req.checkpoint is not None and req.checkpoint not in kernels:
        raise UsageError(f"--checkpoint {req.checkpoint} names a family --kernels {req.kernels} does not run: add it "
                         "to --kernels or leave --checkpoint out")


def worker(req: WorkerRequest) -> None:
    """Search the run's studies together with other workers sharing the storage."""
    from autotune.run.shared_study import SharedSearch

    ctx = RunContext(request=req, settings=search_settings(req, req.budget), sinks=Sinks.of(req))
    opening.open_device(ctx)
    steps = [Workers(), ClaimStorage(heartbeat_s=req.heartbeat), SharedSearch()]
    with ctx.held:
        check(ctx, steps)
        for step in steps:
            step.run(ctx)


def export(req: ExportRequest) -> None:
    """Select and write the files from a shared study."""
    from autotune.run.shared_study import ExportStudy, studies_there

    req = with_out(req)
    ctx = RunContext(request=req, settings=search_settings(req, None), sinks=Sinks.of(req))
    opening.open_device(ctx)
    reads = lambda storage: studies_there(storage, ctx.plans[0], ctx.run_name, req.partial)  # noqa: E731
    steps = [Workers(), HoldFolder(), ClaimStorage(reads=reads), ExportStudy(req.partial)]
    with ctx.held:
        check(ctx, steps)
        for step in steps:
            step.run(ctx)
    summary = ctx.sinks.summary
    if ctx.folder.outcome:
        summary.incomplete(ctx.folder.outcome)
    if summary.failures:
        raise Incomplete("; ".join(summary.failures))


def record(req: RecordRequest) -> None:
    """Measure the whole grid into a measurement cache."""
    from autotune.run.grid_record import RecordGrid

    if req.replay:
        raise UsageError("record measures on a GPU; --replay makes no sense here")
    ctx = RunContext(request=req, sinks=Sinks.of(req))
    steps = [Workers(), RecordGrid(req.cache, req.shard)]
    check(ctx, steps)       # no check here needs the device: a user's --cache is said on any machine, GPU or not
    opening.open_device(ctx)
    with ctx.held:
        for step in steps:
            step.run(ctx)
