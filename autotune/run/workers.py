"""The measuring pool, a command's first step to run: worker processes on the GPU(s) the memory plan
sized (or on the CPU interpreter), their output in a log file. A replay's pool is its recording, opened
with the device; a dry run has none."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from autotune.errors import UsageError
from autotune.gpus.memory_plan import WORKERS_PER_GPU
from autotune.run.step import Step

# The first line of a worker log: workers append to a log that starts with it, never to a user's file.
LOG_HEADER = "# autotune worker log, started "


class Workers(Step):
    """Starts the pool (its first worker warms the JIT builds the plans need) and holds it for the
    command: it is closed when the command ends, however it ends."""
    needs = ("request", "device", "memory", "gpus", "options", "plans", "held")
    provides = ("pool",)

    def run(self, ctx) -> None:
        if ctx.pool is None:
            ctx.pool = start_pool(ctx)
        ctx.held.enter_context(ctx.pool)


def start_pool(ctx):
    from autotune.measure.pool import WorkerPool
    from autotune.measure.tasks import Settings

    req, memory = ctx.request, ctx.memory
    if memory is not None:
        slots, limits = memory.slots(memory.phases[0]), memory.limits(memory.phases[0])
    else:                                        # the CPU interpreter: host memory, not planned
        slots, limits = ctx.gpus, {}
        slots = slots[:1] * (req.workers or max(1, min((os.cpu_count() or 2) - 1, WORKERS_PER_GPU)))
    settings = Settings(on_cpu=ctx.device.kind == "cpu-interpreter", seed=req.seed, skew=req.skew,
                        routings=req.routings, options=ctx.options, log_path=worker_log(req), memory_limits=limits,
                        warmup=[(fp.name, [p.to_dict() for p in fp.problems]) for fp in ctx.plans if fp.problems])
    building = None
    if memory is not None and memory.phases[0].apart and memory.builders:
        from autotune.measure.builders import Building
        building = Building(memory.builders, ctx.device.sm)
    return WorkerPool(settings, len(slots), gpus=slots, timeout_s=req.timeout, memory_plan=memory, building=building)


def worker_log(req) -> str | None:
    """Workers' output (compiler dumps, library warnings) goes to a file, named once here;
    --log-level debug leaves it on the terminal."""
    if req.log_level == "debug":
        return None
    path = req.worker_log or os.path.join(
        tempfile.gettempdir(), f"autotune-workers-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    check_worker_log(path)
    if not Path(path).exists():
        Path(path).write_text(LOG_HEADER + time.strftime("%Y-%m-%d %H:%M:%S") + "\n")
    print(f"worker output (compiler messages, full errors): {path}")
    return path


def check_worker_log(path: str) -> None:
    """Said before any work, not by a dying worker: a folder, an unwritable place, or a file that is
    not one of our logs (unless --force)."""
    from autotune.fileio.writing import claim, text_starting

    p = Path(path)
    if p.is_dir() or not os.access(p.parent if not p.exists() else p, os.W_OK):
        raise UsageError(f"--worker-log {path}: not a writable file")
    claim(p, text_starting(LOG_HEADER), "--worker-log")
