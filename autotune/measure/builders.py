"""Compiling apart from measuring: CPU processes that build a task's kernels for the GPU's architecture into
Triton's on-disk cache before the task reaches the GPU's measuring process.

Why: a compile is CPU work (Triton's passes, ptxas), ~0.3-1 s per kernel variant, where timing one variant at
one batch size takes a few hundredths of a second. When every measuring process compiled its own candidates,
a GPU needed a dozen of them to stay busy, each with a CUDA context, its own copy of the weights and a share
of the GPU's memory that its largest batch outgrew; the GPU waited on compilers and memory anyway. Builders
hold no CUDA context (the GPU is hidden from them before torch loads), so they cost the GPU nothing, and the
measuring process (one per GPU by default) finds each kernel in Triton's cache at its first launch. As TVM
MetaSchedule's Builder and Runner, and Kernel Tuner's compile step, are apart.

A builder runs the family's own launch path (the family's `compile_apart`; a family whose kernels cannot be
built without the GPU, FlashInfer's JIT modules or cuDNN's plans, declares `compiles_apart = False` and is
never sent here). What a builder says is a forecast, never a verdict: a task whose build failed, crashed or
hung still goes to the measuring process, whose own launch decides (and a kernel the builder specialised
otherwise is compiled there, counted as the GPU's compile wait).
"""
from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from autotune.measure.tasks import Settings, Task, received, send


@dataclass(frozen=True)
class Building:
    """How a pool compiles apart: `processes` builders, for an sm_`sm` GPU."""
    processes: int
    sm: int


@dataclass
class Build:
    """What building one task gave: per batch size, the compile's seconds and its error ("" when it built)."""
    seconds: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    lost: str = ""            # the builder died or hung on it: nothing is known about its kernels


def _builder_main(conn, settings: Settings, sm: int, log_path: str | None) -> None:
    # before torch is imported: no CUDA context, however the family's code asks for the device
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.pop("TRITON_INTERPRET", None)
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    faulthandler.enable(all_threads=True)
    held = contextlib.ExitStack()
    families: dict = {}
    try:
        from autotune.contract.protocol import get_family
        from autotune.measure.measurer import failure_reason
        from autotune.problems.models import problem_from_dict
    except BaseException as e:  # pragma: no cover - reported to the pool
        conn.send(("init_failed", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", os.getpid()))
    with held:
        for task in received(conn):
            name = task.family or settings.family
            if name not in families:
                families[name] = get_family(name, **settings.options.get(name, {}))
                held.enter_context(families[name].compiling_for(sm))
            family, problem, build = families[name], problem_from_dict(task.problem), Build()
            for M in task.Ms:
                conn.send(("progress", M))
                t0 = time.perf_counter()
                try:
                    family.compile_apart(task.config, problem, task.gemm, M)
                except Exception as e:      # Triton's own compile error: the measuring process meets it again
                    build.errors[M] = failure_reason("compiling apart", e)
                build.seconds[M] = time.perf_counter() - t0
            conn.send(("built", task.id, build))


@dataclass
class _Builder:
    proc: object = None
    conn: object = None
    ready: bool = False
    task: Task | None = None
    last_beat: float = 0.0


class Builders:
    """`n` builder processes compiling for an sm_XY GPU; tasks queue until one is free. submit / poll / close, as
    the pools' verbs; poll returns (task, Build) for every task whose build ended, however it ended."""

    def __init__(self, settings: Settings, building: Building, timeout_s: float = 300.0):
        self.settings, self.sm, self.timeout_s = settings, building.sm, timeout_s
        n = building.processes
        self._ctx = mp.get_context("spawn")
        self._queue: list[Task] = []
        self.slots = [_Builder() for _ in range(max(1, n))]
        for b in self.slots:
            self._spawn(b)

    def _spawn(self, b: _Builder) -> None:
        parent, child = self._ctx.Pipe()
        b.proc = self._ctx.Process(target=_builder_main, args=(child, self.settings, self.sm, self.settings.log_path),
                                   daemon=True)
        b.proc.start()
        child.close()
        b.conn, b.ready, b.task, b.last_beat = parent, False, None, time.monotonic()

    def busy(self) -> int:
        return sum(1 for b in self.slots if b.task is not None) + len(self._queue)

    def submit(self, task: Task) -> None:
        self._queue.append(task)
        self._dispatch()

    def _dispatch(self) -> None:
        for b in self.slots:
            if not self._queue:
                return
            if b.ready and b.task is None:
                b.task, b.last_beat = self._queue.pop(0), time.monotonic()
                send(b.conn, b.task)

    def waitables(self) -> list:
        return [b.conn for b in self.slots if b.conn is not None]

    def poll(self, timeout: float = 0.0) -> list[tuple[Task, Build]]:
        if timeout:
            wait(self.waitables(), timeout=timeout)
        done: list = []
        now = time.monotonic()
        for b in self.slots:
            try:
                while b.conn.poll():
                    self._handle(b, b.conn.recv(), done)
            except (EOFError, OSError):
                self._lost(b, "the builder died", done)
                continue
            if not b.proc.is_alive():
                self._lost(b, f"the builder exited with code {b.proc.exitcode}", done)
            elif b.task is not None and now - b.last_beat > self.timeout_s:
                self._lost(b, f"no progress in {self.timeout_s:.0f} s", done)
            elif not b.ready and now - b.last_beat > max(self.timeout_s, 600.0):
                raise RuntimeError(f"a builder process did not start within {max(self.timeout_s, 600.0):.0f} s")
        self._dispatch()
        return done

    def _handle(self, b: _Builder, msg, done: list) -> None:
        b.last_beat = time.monotonic()
        if msg[0] == "ready":
            b.ready = True
        elif msg[0] == "init_failed":
            raise RuntimeError(f"a builder process cannot start: {msg[1]}")
        elif msg[0] == "built" and b.task is not None:
            done.append((b.task, msg[2]))
            b.task = None

    def _lost(self, b: _Builder, why: str, done: list) -> None:
        """A builder that died or hung is replaced; its task goes on to be measured (and compiled there)."""
        if b.task is not None:
            done.append((b.task, Build(lost=why)))
        self._kill(b)
        self._spawn(b)

    @staticmethod
    def _kill(b: _Builder) -> None:
        if b.proc is not None and b.proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(b.proc.pid, signal.SIGKILL)
        if b.proc is not None:
            b.proc.join(timeout=10)
        if b.conn is not None:
            b.conn.close()

    def close(self, wait_s: float = 2.0) -> None:
        """Every builder asked to end at once, then those still there after `wait_s` killed: a builder holds nothing
        that a kill loses (Triton writes its cache by renaming a whole file), and one after the other, each
        interpreter's exit (torch, Triton) took a second or two, half a minute for a machine's builders."""
        for b in self.slots:
            with contextlib.suppress(Exception):
                if b.proc.is_alive():
                    b.conn.send(None)
        end = time.monotonic() + wait_s
        for b in self.slots:
            b.proc.join(timeout=max(0.0, end - time.monotonic()))
            self._kill(b)
