"""The typed requests of the commands that measure (`run`, `worker`, `export`, `record`) and what `run`
returns. A request's fields are its command's flags by name, with the same defaults; what the commands
share is TuneRequest's, what one command alone reads is its own request's."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TuneRequest:
    """What the commands that measure share: what to tune, where and how to measure it, the search."""
    # what to tune
    shapes: str | None = None
    model: str | None = None
    model_config: str | None = None
    tp: tuple = (1, 2, 4, 8)
    ep: tuple = (1,)
    dtype: str | None = None
    batch_sizes: tuple | None = None
    search_space: str | None = None
    sglang_version: str | None = None
    # where it is measured
    replay: str | None = None
    replay_realtime: float = 0.0
    gpus: str = "0"
    workers: int | None = None
    builders: int | None = None
    routings: int = 10
    seed: int = 0
    skew: float = 0.0
    timeout: float = 300.0
    worker_log: str | None = None
    log_level: str = "info"
    quiet: bool = False
    # the search and where it is stored
    storage: str | None = None
    study: str | None = None
    trials: int | None = None
    neighbours: int = 1
    no_shipped: bool = False
    warm_start: str | None = None
    budget: float | None = None
    # what is written
    out: str | None = None
    device_name: tuple | None = None


@dataclass
class RunRequest(TuneRequest):
    kernels: str = "all"
    mix: str = "decode"
    skip_backends: str | None = None
    checkpoint: str | None = None
    json: str | None = None
    record: str | None = None
    only_drifted: str | None = None
    target_device: str | None = None
    dry_run: bool = False


@dataclass
class RunResult:
    summary: dict = field(default_factory=dict)   # what --json writes (less the device and folder)
    out: str | None = None                        # the folder the files went to (None: nothing written)


@dataclass
class WorkerRequest(TuneRequest):
    heartbeat: float = 10


@dataclass
class ExportRequest(TuneRequest):
    partial: bool = False


@dataclass
class RecordRequest(TuneRequest):
    cache: str = ""
    shard: tuple | None = None
