"""What a measuring pool is asked: the run's worker settings, one task (one config of one GEMM at
a list of M), and the loop that runs tasks through any pool (autotune.measure.pool's processes or
autotune.measure.replay's recording: the same submit / idle / poll verbs)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from autotune import stops
from autotune.contract.config import KernelConfig


@dataclass
class Settings:
    family: str = ""              # of tasks that name none ("": the registry's default config family)
    options: dict = field(default_factory=dict)   # family name -> constructor options
    on_cpu: bool = False          # Triton's interpreter (TRITON_INTERPRET=1), wall-clock timing
    seed: int = 0
    skew: float = 0.0
    routings: int = 10
    repeats: int = 7
    # (family, problem dicts) of the run: the first worker builds the JIT kernels they need
    # (alignment, quantization, FlashInfer modules) before the others start, so N processes do
    # not race N nvcc builds.
    warmup: list = field(default_factory=list)
    # Where workers' stdout and stderr go (file descriptors, so compiler dumps from C++ too):
    # never the user's terminal. None leaves them alone.
    log_path: str | None = None
    # GPU index -> bytes each worker there may hold in torch's allocator (its share of the memory plan,
    # autotune.gpus.memory_plan); none: no limit (the CPU, tests).
    memory_limits: dict = field(default_factory=dict)


@dataclass
class Task:
    problem: dict                 # Problem.to_dict()
    problem_key: str
    gemm: str
    config: KernelConfig
    Ms: list
    repeats: int | None = None    # overrides Settings.repeats (careful re-measurements)
    family: str = ""              # kernel family; "" = Settings.family
    id: int = 0
    tag: object = None            # orchestrator bookkeeping, never sent
    tactics: bool = False         # also list the tactics the backend offers at each M
    # A config timed alternately beside this one in one hold of the GPU lock (measure.duel): a
    # tactic's careful re-measurement beside its backend's default, so the pin compares one state.
    versus: KernelConfig | None = None

    def __post_init__(self):
        for name in ("config", "versus"):
            if not isinstance(getattr(self, name), KernelConfig | None) or self.config is None:
                raise TypeError(f"a task's {name} is a KernelConfig, got {type(getattr(self, name)).__name__}")


def send(conn, task: Task, Ms: list | None = None) -> None:
    """`task` (at `Ms` where given: a retry's batch sizes still owed) down a worker's or builder's pipe, without
    its `tag`: the orchestrator's bookkeeping (a study's slot, a trial) stays in the orchestrator."""
    out = task if Ms is None or Ms == task.Ms else dataclasses.replace(task, Ms=list(Ms))
    tag, out.tag = out.tag, None
    try:
        conn.send(out)
    finally:
        out.tag = tag


def received(conn):
    """What the orchestrator sends a worker or builder, one message at a time, until it says stop (None) or
    its end of the pipe is gone."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        yield msg


def run_tasks(pool, tasks: list, on_result, stop=lambda: False) -> list:
    """Submit `tasks` to `pool` (a WorkerPool or a ReplayPool) as workers free up and call
    on_result(task, measurements) for each finished one. Once stop() is true nothing new is
    submitted; tasks in flight still land. Returns the tasks never submitted."""
    queue = list(tasks)
    with stops.deferred():      # a stop lands in the pool's wait, not inside on_result's storage writes
        while (queue and not stop()) or pool.busy():
            while queue and pool.idle() and not stop():
                pool.submit(queue.pop(0))
            for task, ms in pool.poll(timeout=0.2):
                on_result(task, ms)
    return queue
