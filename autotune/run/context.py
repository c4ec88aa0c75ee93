"""What every step of a command that measures works on (`run`, `worker`, `export`, `record`): one RunContext,
each of its fields filled by the command as it makes the context (COMMAND), by the opening of the device
(autotune.run.opening.PROVIDES), or by the one step that declares it provides it (autotune.run.step: a step
declares what it needs and provides, and the command checks their order before any step runs).

What the steps leave beside their work (--record, the --json summary, progress bars, report tables)
goes to the sinks the context carries (autotune.run.sinks), never to the writers directly.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.errors import UsageError
from autotune.run.requests import TuneRequest
from autotune.run.sinks import Sinks
from autotune.search.context import SearchContext, TuneSettings

if TYPE_CHECKING:
    from autotune.folder.tuned import TunedFolder
    from autotune.gpus.memory_plan import MemoryPlan
    from autotune.measure.records import Cache
    from autotune.problems.models import Expansion
    from autotune.run.plan import FamilyPlan


@dataclass
class RunContext(SearchContext):
    """The search's context (storage, device, pool, settings, run name, clock: autotune.search.context) and the
    rest of the run. Who fills each field: the command (COMMAND), the opening (autotune.run.opening.PROVIDES:
    the device, what was replayed, the plans, the memory plan, the run name; a replay's pool), or the step that
    provides it (Workers the pool, ClaimStorage the storage, HoldFolder the folder, the searches the clock)."""
    request: TuneRequest | None = None    # the command's request: RunRequest, WorkerRequest, ...
    sinks: Sinks | None = None
    plan_only: bool = False       # a dry run: planned and checked, nothing written or measured
    kernels: tuple[str, ...] = ()                 # the families asked for, in --kernels order
    cache: Cache | None = None                    # the replayed recording, if any
    gpus: list[int] = field(default_factory=list)      # the GPU indices the pool's workers use
    expansion: Expansion | None = None            # the fused-MoE problems of the selection
    plans: list[FamilyPlan] = field(default_factory=list)     # one per requested family
    memory: MemoryPlan | None = None              # the GPU memory plan, None off a GPU
    options: dict[str, dict] = field(default_factory=dict)   # family -> what its protocol object is built with
    folder: TunedFolder | None = None             # the tuned folder: its paths, provenance, change
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)   # pool, locks, the change


# What a command fills as it makes the context, before the opening and any step.
COMMAND = ("request", "settings", "sinks", "plan_only", "kernels", "held")


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
