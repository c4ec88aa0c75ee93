"""What every step of a command that measures works on (`run`, `worker`, `export`, `record`), and the
shape of a step.

A command is a list of steps over one RunContext. Each step owns its preconditions, `check(ctx)`, and
its work, `run(ctx)`; the command (autotune.run.pipeline) calls every step's check, then every step's
run. A check reads and refuses (UsageError, one line) and changes nothing: no file, no storage row, no
process. So a run refused for any reason has changed nothing, and a run that passed its checks is
refused by nothing it could have known before measuring.

What the steps leave beside their work (--record, the --json summary, progress bars, report tables)
goes to the sinks the context carries (autotune.run.sinks), never to the writers directly.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from autotune.errors import UsageError
from autotune.run.requests import TuneRequest
from autotune.run.sinks import Sinks
from autotune.search.context import SearchContext, TuneSettings


@dataclass
class RunContext(SearchContext):
    """The search's context (storage, device, pool, settings, run name, clock) and the rest of the run:
    the request, the sinks, and what opening the device found. Filled as the command goes: the device,
    plans and memory plan by the opening; the pool, storage and folder change by the steps that own them."""
    request: TuneRequest | None = None    # the command's request: RunRequest, WorkerRequest, ...
    sinks: Sinks | None = None
    plan_only: bool = False       # a dry run: planned and checked, nothing written or measured
    kernels: tuple = ()           # the families asked for, in --kernels order
    cache: object = None          # the replayed recording (autotune.measure.records.Cache), if any
    gpus: list = field(default_factory=list)      # the GPU indices the pool's workers use
    expansion: object = None      # the fused-MoE problems of the selection (autotune.problems.models.Expansion)
    plans: list = field(default_factory=list)     # autotune.run.plan.FamilyPlan per requested family
    memory: object = None         # the GPU memory plan (autotune.gpus.memory_plan), None off a GPU
    options: dict = field(default_factory=dict)   # family -> what its protocol object is built with
    folder: object = None         # the tuned folder (autotune.folder.tuned.TunedFolder): its paths, provenance, change
    problems_left: int = 0        # the config searches' problems not yet searched (they share what is left of --budget)
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)   # pool, locks, the change

class Step:
    """One step of a command. `check`: its preconditions, before any step runs, changing nothing;
    `run`: its work. Both do nothing unless the step says otherwise."""

    def check(self, ctx: RunContext) -> None:
        pass

    def run(self, ctx: RunContext) -> None:
        pass


def search_settings(req, budget) -> TuneSettings:
    """The Triton-config search's settings from a request, its --warm-start source read once, before
    anything is opened (None: none)."""
    return TuneSettings(trials=req.trials or 40, budget_s=budget, seed=req.seed, neighbours=req.neighbours,
                        use_shipped=not req.no_shipped, warm_start=load_warm_start(req.warm_start))


def load_warm_start(path):
    """--warm-start's source, read once by the command before anything is measured (None: none); its
    configs are those of the config family the commands that name none work on."""
    if not path:
        return None
    from autotune.contract import registry
    from autotune.search.warm_start import WarmStartError, load
    try:
        warm = load(path, registry.get(registry.default()).cls)
    except WarmStartError as e:
        raise UsageError(str(e)) from None
    print(f"warm start: {warm.describe()}")
    return warm
