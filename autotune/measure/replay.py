"""The replay device: a recorded measurement cache answering like the worker pool.

It is the one stand-in for a GPU. It implements the same submit/idle/poll verbs as
`worker.WorkerPool`, returns the recorded measurement for each (problem, GEMM, M, config),
a NOT_RECORDED failure where the cache has none, and charges every answer its recorded
device seconds (compile time spread over the recording's parallel compilers + timing), so a
replayed run reports the GPU time it would have cost. Everything it produces is labelled
"replay" by the caller (device.kind).
"""
from __future__ import annotations

import itertools
import time
from collections import deque

from autotune.measure import records
from autotune import stops
from autotune.gpus.device import DeviceInfo
from autotune.measure.records import Cache, Measurement, failure
from autotune.measure.tasks import Task


class ReplayPool:
    """`workers` answers may be outstanding at once, as with that many measurement processes
    (the search then asks that many configs before it hears back); default 1, sequential."""

    def __init__(self, cache: Cache, parallel_compiles: int | None = None, workers: int = 1,
                 realtime: float = 0.0):
        self.cache = cache
        self.workers = workers
        # realtime > 0: an answer arrives after `realtime` x its recorded device seconds, as a GPU's
        # would (reliability tests kill processes mid-trial).
        self.realtime = realtime
        self.parallel = parallel_compiles or int(cache.notes.get("compile_workers", 15))
        self.charged_s = 0.0
        self.answered = 0
        self.replaced = 0
        self._done: deque = deque()
        self._ids = itertools.count(1)

    @property
    def device(self) -> DeviceInfo:
        d = DeviceInfo.from_dict(self.cache.device)
        return DeviceInfo(**{**d.__dict__, "kind": "replay"})

    def idle(self) -> int:
        return max(0, self.workers - len(self._done))

    def busy(self) -> int:
        return len(self._done)

    def measuring(self) -> int:
        return self.workers

    def seconds_per_measurement(self) -> float | None:
        """The recording's device seconds per answer so far."""
        return self.charged_s / self.answered if self.answered else None

    def submit(self, task: Task) -> None:
        task.id = next(self._ids)
        out = []
        for M in task.Ms:
            m = self.cache.get(task.problem_key, task.gemm, M, task.config, careful=bool(task.repeats))
            if m is not None and records.is_resource_failure(m):
                m = None        # the recording's GPU was short of memory there: no verdict on the config
            if m is None:
                m = failure(task.problem_key, task.gemm, M, task.config, records.NOT_RECORDED,
                            "no measurement of this config at this M in the replay cache")
            else:
                m = Measurement.from_dict(m.to_dict())
                self.charged_s += m.bench_s + m.compile_s / self.parallel
            self.answered += 1
            out.append(m)
        cost = sum(m.bench_s + m.compile_s / self.parallel for m in out)
        self._done.append((time.monotonic() + self.realtime * cost, task, out))

    def poll(self, timeout: float = 0.0) -> list:
        with stops.wait():          # where a stop lands, as in the workers' pool
            if self.realtime and self._done:
                first = min(due for due, _, _ in self._done)
                time.sleep(max(0.0, min(timeout, first - time.monotonic())))
        now = time.monotonic()
        done = [(task, out) for due, task, out in self._done if due <= now]
        self._done = deque(d for d in self._done if d[0] > now)
        return done

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
