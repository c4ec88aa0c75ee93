"""What a search takes from the command that runs it, in one value (as TVM MetaSchedule's TuneContext):
where its studies are stored and under which run name, the device and the pool it measures on, the
clock its budget reads and the Triton-config search's settings. The command's own context
(autotune.run.context.RunContext) is one of these with the rest of the run beside it."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.gpus.device import DeviceInfo

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from autotune.measure.pool import WorkerPool
    from autotune.measure.replay import ReplayPool
    from autotune.search.warm_start import WarmStart


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
    warm_start: WarmStart | None = None   # another study's best configs first
    # On a GPU, --budget is the run's wall time: the time.monotonic() by which this problem's files must be
    # written. Its search stops asking once what it has yet to do after the search (the tasks in flight, the
    # finalists' re-measurements, the layer check, the files: ProblemTuner.after_search_s) would pass it.
    # None: no such end (budget_s, the search's device seconds, bounds a replay instead).
    ends_at: float | None = None


def process_started() -> float:
    """time.monotonic() of this process's start (Linux: /proc), so a budget counts the interpreter's start and
    the imports too, as `time autotune run ...` does; elsewhere the time of the first call."""
    import os

    global _STARTED
    if _STARTED is None:
        try:
            with open(f"/proc/{os.getpid()}/stat") as f:
                ticks = int(f.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/uptime") as f:
                uptime = float(f.read().split()[0])
            _STARTED = time.monotonic() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError, IndexError):
            _STARTED = time.monotonic()
    return _STARTED


_STARTED: float | None = None


@dataclass
class Clock:
    pool: WorkerPool | ReplayPool
    start: float = field(default_factory=time.monotonic)

    def device_s(self) -> float:
        charged = getattr(self.pool, "charged_s", None)
        return charged if charged is not None else time.monotonic() - self.start

    def now(self) -> float:
        """What TuneSettings.ends_at is compared with: time.monotonic() (a test's clock may run on recorded seconds)."""
        return time.monotonic()


@dataclass
class SearchContext:
    storage: BaseStorage | None = None   # the Optuna storage the studies live in
    device: DeviceInfo | None = None     # measured on (or replayed)
    pool: WorkerPool | ReplayPool | None = None   # the measuring pool: workers on the GPU(s), or the replay
    settings: TuneSettings | None = None
    run_name: str | None = None      # the studies' run name (None: the device's file name)
    clock: Clock | None = None       # None: each tuner starts its own on the pool

    def study_device(self) -> str:
        """The run name studies are named after."""
        return self.run_name or self.device.file_name
