"""Isolated measurement workers.

Each worker is a spawned process bound to one GPU. It builds a problem's inputs once, then for
each task (one config of one GEMM at several M) compiles (first launch), checks the output
against the float32 reference and times it. Compiles run in parallel across workers; timing
takes a per-GPU file lock so only one worker times on a GPU at a time. A compile error,
out-of-resources, wrong result or exception fails that measurement; a worker that dies
(SIGSEGV, SIGKILL, a CUDA error that poisons its context) or stops reporting progress for
`timeout_s` is replaced and the measurements it owed are failed with the reason. What a worker
does with one task at one M is autotune.measurer.
"""
from __future__ import annotations

import faulthandler
import itertools
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from . import records, stops
from .frames import stuck_at
from .fsutil import write_bytes
from .measurer import Measurer
from .records import Measurement, failure
from .tasks import Settings, Task


def _gpu_lock(lock_dir: str, gpu: int):
    fd = os.open(os.path.join(lock_dir, f"gpu{gpu}.lock"), os.O_CREAT | os.O_RDWR, 0o644)
    return fd


def _to_log(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _stack_file(lock_dir: str, pid: int) -> str:
    return os.path.join(lock_dir, f"stack-{pid}.txt")


def _worker_main(conn, gpu: int, lock_dir: str, settings: Settings, first: bool = False) -> None:
    if settings.log_path:
        _to_log(settings.log_path)
    # where it was when it crashed, or when the pool aborts it for hanging (SIGABRT): faulthandler
    # writes the stack from inside C code too, then lets the signal end the process
    stack_out = open(_stack_file(lock_dir, os.getpid()), "w")
    faulthandler.enable(file=stack_out, all_threads=True)
    if settings.on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    try:
        from .kernels.sglang_loader import sglang_context
        from .models import problem_from_dict
        from sglang.srt import runtime_context as rc

        measurer = Measurer(settings, _gpu_lock(lock_dir, gpu))
        ctx = sglang_context()
    except BaseException as e:  # pragma: no cover - reported to the pool
        conn.send(("init_failed", f"{type(e).__name__}: {e}"))
        return
    warm_flag = os.path.join(lock_dir, "warm")
    if first:
        try:
            with rc.use_context(ctx):
                for name, problems in settings.warmup:
                    measurer.family(name).warmup([problem_from_dict(p) for p in problems], on_cpu=settings.on_cpu)
        except BaseException as e:
            conn.send(("init_failed", f"warm-up: {type(e).__name__}: {e}"))
            return
        write_bytes(warm_flag, b"")
    while not os.path.exists(warm_flag):
        time.sleep(0.2)
    conn.send(("ready", os.getpid()))
    with rc.use_context(ctx):
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg is None:
                return
            task: Task = msg
            problem = problem_from_dict(task.problem)
            for M in task.Ms:
                conn.send(("progress", M))
                m, fatal = measurer.measure(task, problem, M)
                conn.send(("result", m.to_dict()))
                if fatal:
                    conn.send(("fatal", m.reason))
                    os._exit(3)
            conn.send(("done", task.id))


@dataclass
class _Slot:
    gpu: int
    proc: object = None
    conn: object = None
    ready: bool = False
    task: Task | None = None
    pending_Ms: list = field(default_factory=list)
    current_M: int | None = None
    results: list = field(default_factory=list)
    last_beat: float = 0.0
    fatal: str = ""


class WorkerPool:
    """submit() tasks to idle workers, poll() for finished ones; failures come back as records."""

    def __init__(self, settings: Settings, n_workers: int, gpus=(0,), timeout_s: float = 300.0,
                 init_timeout_s: float = 600.0):
        self.settings = settings
        self.timeout_s = timeout_s
        self.init_timeout_s = init_timeout_s
        self._ctx = mp.get_context("spawn")
        self._lock_dir = tempfile.mkdtemp(prefix="autotune-locks-")
        self._ids = itertools.count(1)
        self._init_failures = 0
        self.replaced = 0
        self.slots = [_Slot(gpu=gpus[i % len(gpus)]) for i in range(max(1, n_workers))]
        for s in self.slots:
            self._spawn(s)

    # -- process management ----------------------------------------------------------------
    def _spawn(self, slot: _Slot) -> None:
        parent, child = self._ctx.Pipe()
        first = not os.path.exists(os.path.join(self._lock_dir, "warm")) and slot is self.slots[0]
        slot.proc = self._ctx.Process(target=_worker_main, args=(child, slot.gpu, self._lock_dir, self.settings, first),
                                      daemon=True)
        slot.proc.start()
        child.close()
        slot.conn, slot.ready, slot.task, slot.last_beat, slot.fatal = parent, False, None, time.monotonic(), ""

    def _kill(self, slot: _Slot) -> None:
        if slot.proc is not None and slot.proc.is_alive():
            try:
                os.kill(slot.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if slot.proc is not None:
            slot.proc.join(timeout=10)
        if slot.conn is not None:
            slot.conn.close()

    def close(self) -> None:
        for s in self.slots:
            try:
                if s.proc is not None and s.proc.is_alive() and s.task is None and s.ready:
                    s.conn.send(None)
                    s.proc.join(timeout=5)
            except Exception:
                pass
            self._kill(s)
        shutil.rmtree(self._lock_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- tasks -------------------------------------------------------------------------------
    def idle(self) -> int:
        return sum(1 for s in self.slots if s.ready and s.task is None)

    def busy(self) -> int:
        return sum(1 for s in self.slots if s.task is not None)

    def submit(self, task: Task) -> None:
        slot = next(s for s in self.slots if s.ready and s.task is None)
        task.id = next(self._ids)
        slot.task, slot.pending_Ms, slot.results = task, list(task.Ms), []
        slot.current_M, slot.last_beat = None, time.monotonic()
        tag, task.tag = task.tag, None
        try:
            slot.conn.send(task)
        finally:
            task.tag = tag

    def poll(self, timeout: float = 0.1) -> list[tuple[Task, list[Measurement]]]:
        """Finished tasks (with one record per M each), waiting at most `timeout` seconds."""
        done: list = []
        waitables = [s.conn for s in self.slots if s.conn is not None]
        with stops.wait():          # the one place a stop lands while tuning (autotune.stops)
            if waitables:
                wait(waitables, timeout=timeout)
        now = time.monotonic()
        for s in self.slots:
            try:
                while s.conn.poll():
                    self._handle(s, s.conn.recv(), done)
            except (EOFError, OSError):
                self._died(s, done)
                continue
            if s.proc is not None and not s.proc.is_alive():
                self._died(s, done)
            elif s.task is not None and now - s.last_beat > self.timeout_s:
                where = self._where_stuck(s)
                self._fail_task(s, records.TIMEOUT, f"no progress for {self.timeout_s:.0f} s (hang"
                                + (f"; stuck in {where}" if where else "") + "); worker killed", done)
            elif not s.ready and now - s.last_beat > self.init_timeout_s:
                self._kill(s)
                raise RuntimeError(f"measurement worker did not start within {self.init_timeout_s:.0f} s")
        return done

    def _where_stuck(self, s: _Slot, wait_s: float = 5.0) -> str:
        """Abort a hung worker (SIGABRT: faulthandler dumps its stack, then it exits) and say its
        innermost own frame; '' if it cannot answer (a process stuck in the driver takes no signal:
        _kill's SIGKILL follows)."""
        try:
            os.kill(s.proc.pid, signal.SIGABRT)
        except ProcessLookupError:
            return ""
        s.proc.join(timeout=wait_s)      # its exit means the dump is complete
        return self._where(s, f"no progress for {self.timeout_s:.0f} s")

    def _where(self, s: _Slot, what: str) -> str:
        """The frame a worker's faulthandler dump names ('' without one); the whole dump goes to the log."""
        dump = _read(_stack_file(self._lock_dir, s.proc.pid)) if s.proc is not None else ""
        if dump and self.settings.log_path:
            with open(self.settings.log_path, "a") as log:
                log.write(f"[{what}] worker {s.proc.pid}:\n{dump}")
        return stuck_at(dump)

    def _handle(self, s: _Slot, msg, done: list) -> None:
        kind = msg[0]
        s.last_beat = time.monotonic()
        if kind == "ready":
            s.ready = True
            self._init_failures = 0
        elif kind == "init_failed":
            self._init_failures += 1
            if self._init_failures >= 3:
                raise RuntimeError(f"measurement worker cannot start: {msg[1]}")
        elif kind == "progress":
            s.current_M = msg[1]
        elif kind == "result":
            m = Measurement.from_dict(msg[1])
            s.results.append(m)
            if m.M in s.pending_Ms:
                s.pending_Ms.remove(m.M)
        elif kind == "fatal":
            s.fatal = msg[1]
        elif kind == "done" and s.task is not None:
            done.append((s.task, s.results))
            s.task, s.results, s.pending_Ms = None, [], []

    def _died(self, s: _Slot, done: list) -> None:
        if s.proc is not None:
            s.proc.join(timeout=5)   # its pipe closes a moment before the exit status is known
        code = s.proc.exitcode if s.proc is not None else None
        if code is not None and code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
            where = self._where(s, f"killed by {sig}")
            why = f"worker killed by {sig}" + (f" in {where}" if where else "")
        else:
            why = f"worker exited with code {code}"
        if s.fatal:
            why = f"CUDA context lost ({s.fatal}); {why}"
        if s.task is not None:
            self._fail_task(s, records.CRASH, why, done)
        else:
            self._kill(s)
            self._spawn(s)

    def _fail_task(self, s: _Slot, status: str, why: str, done: list) -> None:
        task = s.task
        at = f" at M={s.current_M}" if s.current_M is not None else ""
        for M in s.pending_Ms:
            s.results.append(failure(task.problem_key, task.gemm, M, task.config, status, why + at))
        done.append((task, s.results))
        self._kill(s)
        self.replaced += 1
        self._spawn(s)
