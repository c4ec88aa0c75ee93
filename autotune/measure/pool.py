"""Isolated measurement workers.

Each worker is a spawned process bound to one GPU. It builds a problem's inputs once, then for
each task (one config of one GEMM at several M) compiles (first launch), checks the output
against the float32 reference and times it. Compiles run in parallel across workers; timing
takes a per-GPU file lock so only one worker times on a GPU at a time. A compile error,
out-of-resources, wrong result or exception fails that measurement; a worker that dies
(SIGSEGV, SIGKILL, a CUDA error that poisons its context) or stops reporting progress for
`timeout_s` is replaced and the measurements it owed are failed with the reason. What a worker
does with one task at one M is autotune.measure.measurer.

A resource failure (CUDA out of memory, a busy device, a context lost to either) is the machine's
state, not the config's verdict: the pool measures it again on a worker with more room, retiring one
worker of that GPU and raising the others' memory limits, and never returns it to the caller. Where
even one worker on the GPU cannot measure it, the pool raises GpuMemoryExhausted: the run stops in
one line, and what was measured is in the storage for the resumed run.
"""
from __future__ import annotations

import collections
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

from autotune.measure import records
from autotune import stops
from autotune.errors import GpuMemoryExhausted
from autotune.measure.frames import stuck_at
from autotune.fileio.writing import write_bytes
from autotune.measure.measurer import Measurer
from autotune.measure.records import Measurement, failure
from autotune.measure.tasks import Settings, Task, received, send

# Resource failures of one measurement before the pool gives up on a GPU already down to one worker.
MAX_RESOURCE_ATTEMPTS = 3
# Built tasks kept waiting for each worker, with builders: enough that a worker finishing a task finds the
# next one compiled, few enough that the search's asks stay informed by what was just measured.
READY_PER_WORKER = 2


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
        from autotune.adapters.sglang_loader import in_context, sglang_context
        from autotune.problems.models import problem_from_dict

        measurer = Measurer(settings, _gpu_lock(lock_dir, gpu))
        measurer.limit_memory(settings.memory_limits.get(gpu))
        ctx = sglang_context()
    except BaseException as e:  # pragma: no cover - reported to the pool
        conn.send(("init_failed", f"{type(e).__name__}: {e}"))
        return
    warm_flag = os.path.join(lock_dir, "warm")
    if first:
        try:
            with in_context(ctx):
                for name, problems in settings.warmup:
                    measurer.family(name).warmup([problem_from_dict(p) for p in problems], on_cpu=settings.on_cpu)
        except BaseException as e:
            conn.send(("init_failed", f"warm-up: {type(e).__name__}: {e}"))
            return
        write_bytes(warm_flag, b"")
    while not os.path.exists(warm_flag):
        time.sleep(0.2)
    conn.send(("ready", os.getpid()))
    with in_context(ctx):
        for msg in received(conn):
            if isinstance(msg, tuple) and msg[0] == "limit":   # its share of the GPU changed (autotune.gpus.memory_plan)
                measurer.limit_memory(msg[1])
                continue
            if isinstance(msg, tuple) and msg[0] == "alone":   # the only measuring process on its GPU, or not
                measurer.alone = msg[1]
                continue
            task: Task = msg
            problem = problem_from_dict(task.problem)
            for M in task.Ms:
                conn.send(("progress", M))
                m, fatal = measurer.measure(task, problem, M)
                conn.send(("result", m.to_dict()))
                if fatal:
                    conn.send(("fatal", m.reason))
                    os._exit(3)
            conn.send(("done", task.id, measurer.trim(), measurer.held_s, measurer.compile_s))


@dataclass
class Pace:
    """How the pool kept the GPU busy (the run reports it): seconds the measuring processes held the GPU
    (inputs, reference, checked launch, timing), seconds they compiled (the GPU idle: a kernel no builder
    had made), seconds a measuring process sat idle while builders still compiled its next task, and the
    builders' own count and seconds. Wall seconds from the pool's start."""
    started: float = field(default_factory=time.monotonic)
    measurements: int = 0
    held_s: float = 0.0
    compile_wait_s: float = 0.0
    starved_s: float = 0.0
    waited_for_search_s: float = 0.0   # a measuring process idle while no build was under way: the search's asks
    layer_s: float = 0.0               # the run's own process timing and checking the layer (the GPU busy too)
    builds: int = 0
    build_s: float = 0.0
    builds_lost: int = 0

    def to_dict(self, since: float | None = None) -> dict:
        wall = time.monotonic() - (self.started if since is None else since)
        busy = self.held_s + self.layer_s
        return {"wall_s": round(wall, 1), "measurements": self.measurements, "gpu_held_s": round(busy, 1),
                "gpu_busy_share": round(busy / wall, 3) if wall > 0 else None, "layer_check_s": round(self.layer_s, 1),
                "waited_for_search_s": round(self.waited_for_search_s, 1),
                "measurements_per_s": round(self.measurements / wall, 2) if wall > 0 else None,
                "compile_wait_s": round(self.compile_wait_s, 1), "waited_for_builds_s": round(self.starved_s, 1),
                "builds": self.builds, "build_s": round(self.build_s, 1), "builds_lost": self.builds_lost}


@dataclass
class _Slot:
    gpu: int
    proc: object = None
    conn: object = None
    ready: bool = False
    task: Task | None = None
    behind: list = field(default_factory=list)  # (task, Ms) sent behind `task`: the worker goes on to them itself
    pending_Ms: list = field(default_factory=list)
    current_M: int | None = None
    results: list = field(default_factory=list)
    last_beat: float = 0.0
    fatal: str = ""
    retiring: bool = False    # leaves the pool once its task is done (the GPU's memory is short)
    held_s: float = 0.0       # the process's own totals at its last report (Pace counts the increments)
    compile_s: float = 0.0
    idle_since: float | None = None


class WorkerPool:
    """submit() tasks to idle workers, poll() for finished ones; failures come back as records."""

    def __init__(self, settings: Settings, n_workers: int, gpus=(0,), timeout_s: float = 300.0,
                 init_timeout_s: float = 600.0, memory_plan=None, building=None):
        """`gpus`: the GPU of each worker in turn (a memory plan's slots). `memory_plan`: the plan the
        pool was sized by (autotune.gpus.memory_plan); with it, a GPU short of memory loses workers and the
        others on it get that worker's share. `building` (autotune.measure.builders.Building): CPU processes that
        compile the tasks of families that compile apart for the GPU's architecture before a worker measures them."""
        self.settings = settings
        self.timeout_s = timeout_s
        self.init_timeout_s = init_timeout_s
        self.memory_plan = memory_plan
        self._phase = memory_plan.phases[0] if memory_plan is not None else None
        self._cut: dict = {}          # GPU -> workers a shortage of memory took from it
        self._ctx = mp.get_context("spawn")
        self._lock_dir = tempfile.mkdtemp(prefix="autotune-locks-")
        self._ids = itertools.count(1)
        self._init_failures = 0
        self.replaced = 0
        self.retired = 0              # workers the pool let go for want of GPU memory
        self.resource_retries = 0     # measurements measured again after a resource failure
        self.peak_bytes = 0           # the largest GPU memory a worker reported holding
        self._retries: list = []      # (task, Ms) to measure again, ahead of new tasks
        self._partial: dict = {}      # task id -> its measurements that need no retry
        self._attempts: dict = {}     # (task id, M) -> resource failures so far
        self.slots = [_Slot(gpu=gpus[i % len(gpus)]) for i in range(max(1, n_workers))]
        self.pace = Pace()
        self._queue: list = []        # (task, Ms) waiting for a worker: built, or needing no build
        self._recent = collections.deque(maxlen=64)   # GPU seconds per measurement of the last tasks
        self._apart: dict = {}        # family name -> does it compile apart (its declaration)
        self.builders = None
        if building is not None:
            from autotune.measure.builders import Builders
            self.builders = Builders(settings, building, timeout_s=timeout_s)
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
        slot.held_s = slot.compile_s = 0.0      # a new process reports its totals from 0
        slot.idle_since = None

    def _kill(self, slot: _Slot) -> None:
        self._put_back_behind(slot)
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
        """Every process asked to end at once (then joined, a worker 5 s at most, then killed): one after the other,
        their interpreters' exits added up to seconds each."""
        if self.builders is not None:
            self.builders.close()
        for s in self.slots:
            try:
                if s.proc is not None and s.proc.is_alive() and s.task is None and s.ready:
                    s.conn.send(None)
            except Exception:
                pass
        end = time.monotonic() + 5.0
        for s in self.slots:
            if s.proc is not None:
                s.proc.join(timeout=max(0.0, end - time.monotonic()))
            self._kill(s)
        shutil.rmtree(self._lock_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- tasks -------------------------------------------------------------------------------
    def _free(self) -> list:
        return [s for s in self.slots if s.ready and s.task is None and not s.retiring]

    def _takes_behind(self) -> list:
        """Workers that take built tasks behind the one they measure, READY_PER_WORKER at most: they wait in the
        worker's pipe, so the worker goes on while this process asks and stores for the search (on one measuring
        process a GPU, those seconds left the GPU idle between tasks: 1054 measurements in a 150 s run on the
        H100 without, 1661 with one task behind)."""
        if self.builders is None:
            return []
        return [s for s in self.slots if s.ready and s.task is not None and len(s.behind) < READY_PER_WORKER
                and not s.retiring and not s.fatal]

    def idle(self) -> int:
        """Tasks the pool takes now. Without builders: workers free (retries of resource failures go first).
        With builders: as many as keep every builder busy and READY_PER_WORKER built tasks waiting for each
        worker, so a worker never waits for a compile; more would only have the search ask blind."""
        if self.builders is None:
            return max(0, len(self._free()) - len(self._retries) - len(self._queue))
        workers = sum(1 for s in self.slots if not s.retiring)
        room = len(self.builders.slots) + READY_PER_WORKER * workers
        return max(0, room - self.builders.busy() - len(self._queue) - len(self._retries)
                   - sum((s.task is not None) + len(s.behind) for s in self.slots))

    def busy(self) -> int:
        return (sum((s.task is not None) + len(s.behind) for s in self.slots) + len(self._retries) + len(self._queue)
                + (self.builders.busy() if self.builders is not None else 0))

    def measuring(self) -> int:
        """Measuring processes the pool keeps now."""
        return sum(1 for s in self.slots if not s.retiring)

    def seconds_per_measurement(self) -> float | None:
        """Seconds a measuring process holds the GPU per measurement, the median over the last tasks (None before a
        few were made): a batch size's first measurement also builds its inputs and float32 reference, which the
        next ones do not repeat, so a mean over the run would forecast every later measurement at its price."""
        import statistics

        return statistics.median(self._recent) if len(self._recent) >= 5 else None

    def submit(self, task: Task) -> None:
        task.id = next(self._ids)
        if self.builders is not None and self._compiles_apart(task):
            self.builders.submit(task)
        else:
            self._queue.append((task, list(task.Ms)))
            self._dispatch()

    def _compiles_apart(self, task: Task) -> bool:
        name = task.family or self.settings.family
        if name not in self._apart:
            from autotune.contract.protocol import family_class
            self._apart[name] = bool(getattr(family_class(name), "compiles_apart", False))
        return self._apart[name]

    def _dispatch(self) -> None:
        """Resource-failure retries first, then the queue, onto free workers."""
        while self._retries and self._free():
            task, Ms = self._retries.pop(0)
            self._send(self._free()[0], task, Ms)
        while self._queue and self._free():
            task, Ms = self._queue.pop(0)
            self._send(self._free()[0], task, Ms)
        while self._queue and self._takes_behind():
            task, Ms = self._queue.pop(0)
            self._send(min(self._takes_behind(), key=lambda s: len(s.behind)), task, Ms)

    def _send(self, slot: _Slot, task: Task, Ms: list) -> None:
        """Hand `task` at `Ms` to `slot` (a retry sends the same task with the Ms still owed): to measure now, or
        behind the task it measures."""
        if slot.task is not None:
            slot.behind.append((task, list(Ms)))
        else:
            self._start(slot, task, Ms)
            self._count_idle(slot)
        send(slot.conn, task, Ms)

    @staticmethod
    def _start(slot: _Slot, task: Task, Ms: list) -> None:
        """`task` at `Ms` is the one `slot`'s worker measures now (its messages are this task's)."""
        slot.task, slot.pending_Ms, slot.results = task, list(Ms), []
        slot.current_M, slot.last_beat = None, time.monotonic()

    def _put_back_behind(self, slot: _Slot) -> None:
        """The tasks waiting behind a worker that died or was killed never started: they go first in the queue."""
        self._queue[0:0], slot.behind = slot.behind, []

    def poll(self, timeout: float = 0.1) -> list[tuple[Task, list[Measurement]]]:
        """Finished tasks (with one record per M each), waiting at most `timeout` seconds."""
        done: list = []
        waitables = [s.conn for s in self.slots if s.conn is not None]
        if self.builders is not None:
            waitables += self.builders.waitables()
        with stops.wait():          # the one place a stop lands while tuning (autotune.stops)
            if waitables:
                wait(waitables, timeout=timeout)
        if self.builders is not None:
            for task, build in self.builders.poll():
                self._built(task, build)
        now = time.monotonic()
        for s in list(self.slots):
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
        for s in [s for s in self.slots if s.retiring and s.task is None]:
            self._retire(s)
        self._dispatch()
        return done

    def _built(self, task: Task, build) -> None:
        """A builder is done with `task` (however it ended): it queues for a worker, whose launch decides."""
        self.pace.builds += len(build.seconds)
        self.pace.build_s += sum(build.seconds.values())
        self.pace.builds_lost += bool(build.lost)
        self._queue.append((task, list(task.Ms)))

    def _count_idle(self, slot: _Slot) -> None:
        """A worker's idle time that ends now: waiting for builds where builders still held work, else for the
        search to ask."""
        if slot.idle_since is not None:
            if self._was_building:
                self.pace.starved_s += time.monotonic() - slot.idle_since
            else:
                self.pace.waited_for_search_s += time.monotonic() - slot.idle_since
        slot.idle_since = None

    @property
    def _was_building(self) -> bool:
        return self.builders is not None and self.builders.busy() > 0

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
            s.idle_since = time.monotonic()
            self._init_failures = 0
            limit = self.settings.memory_limits.get(s.gpu)
            if limit is not None:     # the share may have changed since the pool started (a phase, a retired worker)
                s.conn.send(("limit", limit))
                s.conn.send(("alone", len(self._live(s.gpu)) == 1))
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
            _, _, peak, held_s, compile_s = msg      # the worker's totals so far: the task's share is the increase
            self.peak_bytes = max(self.peak_bytes, peak)
            self.pace.held_s += held_s - s.held_s
            self.pace.compile_wait_s += compile_s - s.compile_s
            if s.results:
                self._recent.append((held_s - s.held_s) / len(s.results))
            s.held_s, s.compile_s = held_s, compile_s
            task, results = s.task, s.results
            s.task, s.results, s.pending_Ms = None, [], []
            if s.behind:     # the worker has already begun the next one
                self._start(s, *s.behind.pop(0))
            else:
                s.idle_since = time.monotonic()
            self.pace.measurements += len(results)
            self._complete(task, results, s.gpu, done)

    def _complete(self, task: Task, results: list, gpu: int, done: list) -> None:
        """A task's measurements go back once none is a resource failure; those are measured again,
        on a GPU with one worker fewer (GpuMemoryExhausted where it is down to one)."""
        kept = self._partial.pop(task.id, []) + [m for m in results if m.status != records.RESOURCE]
        again = [m for m in results if m.status == records.RESOURCE]
        if not again:
            done.append((task, sorted(kept, key=lambda m: task.Ms.index(m.M) if m.M in task.Ms else 0)))
            return
        self._partial[task.id] = kept
        self.resource_retries += len(again)
        tries = 0
        for m in again:
            self._attempts[task.id, m.M] = tries = max(tries, self._attempts.get((task.id, m.M), 0) + 1)
        if not self._shrink(gpu, again[0].reason) and tries >= MAX_RESOURCE_ATTEMPTS:
            raise GpuMemoryExhausted(
                f"{task.problem_key} {task.gemm} M={again[0].M}: {again[0].reason} ({tries} tries, GPU {gpu} down to "
                "one worker): the GPU has too little free memory for this problem; free the GPU or lower "
                "AUTOTUNE_GPU_MEMORY's share of other work, then run the same command again (nothing measured is "
                "lost: the storage holds it)")
        self._retries.append((task, [m.M for m in again]))

    def _shrink(self, gpu: int, why: str) -> bool:
        """One worker fewer on `gpu` (an idle one at once, else the next to finish), the others' memory
        limit raised to the freed share; False where it has one worker left."""
        on_gpu = [s for s in self.slots if s.gpu == gpu and not s.retiring]
        if len(on_gpu) <= 1:
            return False
        victim = min(on_gpu, key=lambda s: (s.task is not None, s.ready))
        victim.retiring = True
        self.retired += 1
        self._cut[gpu] = self._cut.get(gpu, 0) + 1       # later phases start with one fewer here too
        self._share_out(gpu)
        if self.memory_plan is not None:
            from autotune.gpus.memory_plan import gib
            print(f"GPU {gpu} is short of memory ({why[:120]}): {len(on_gpu)} workers -> {len(on_gpu) - 1}, "
                  f"each may hold {gib(self.settings.memory_limits[gpu])} of tensors; the measurement is taken "
                  "again", flush=True)
        return True

    def use_phase(self, name: str) -> None:
        """The run enters a step of the memory plan (autotune.gpus.memory_plan.Phase): each GPU gets that step's
        workers (fewer by those a shortage of memory took before), each with its share of the GPU."""
        plan = self.memory_plan
        if plan is None or plan.phase(name) is None:
            return
        self._phase = plan.phase(name)
        if self.builders is not None and not self._phase.apart and not self.builders.busy():
            self.builders.close()        # a phase whose kernels compile in the workers: the CPUs are theirs
            self.builders = None
        for i, g in enumerate(plan.gpus):
            want = max(1, plan.workers[name][i] - self._cut.get(g.index, 0))
            live = self._live(g.index)
            for s in sorted(live, key=lambda s: (s.task is not None, s.ready))[:max(0, len(live) - want)]:
                s.retiring = True          # idle ones leave at the next poll, busy ones when done
            for _ in range(want - len(live)):
                self.slots.append(_Slot(gpu=g.index))
                self._spawn(self.slots[-1])
            self._share_out(g.index)

    def _live(self, gpu: int) -> list:
        return [s for s in self.slots if s.gpu == gpu and not s.retiring]

    def main_fraction(self) -> float | None:
        """The run's own process's share of the first GPU in the current phase (None: no plan)."""
        if self._phase is None:
            return None
        return self.memory_plan.main_fraction(self._phase, len(self._live(self.memory_plan.gpus[0].index)))

    def _share_out(self, gpu: int) -> None:
        """Each live worker on `gpu` gets the equal share of its budget in the current phase."""
        plan, phase = self.memory_plan, self._phase
        if plan is None or phase is None:
            return
        from autotune.gpus.memory_plan import CONTEXT_BYTES

        live = self._live(gpu)
        i = [g.index for g in plan.gpus].index(gpu)
        limit = plan.share(i, phase, workers=len(live)) - CONTEXT_BYTES
        self.settings.memory_limits[gpu] = limit
        for s in live:
            if s.ready:
                s.conn.send(("limit", limit))
                s.conn.send(("alone", len(live) == 1))

    def _retire(self, s: _Slot) -> None:
        try:
            s.conn.send(None)
            s.proc.join(timeout=5)
        except Exception:
            pass
        self._kill(s)
        self.slots.remove(s)

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
            self._fail_task(s, records.RESOURCE if records.is_resource_reason(s.fatal) else records.CRASH, why, done)
        else:
            self._kill(s)
            if s.retiring:
                self.slots.remove(s)
            else:
                self._spawn(s)

    def _fail_task(self, s: _Slot, status: str, why: str, done: list) -> None:
        task = s.task
        at = f" at M={s.current_M}" if s.current_M is not None else ""
        for M in s.pending_Ms:
            s.results.append(failure(task.problem_key, task.gemm, M, task.config, status, why + at))
        results, s.task = s.results, None
        self._kill(s)
        self.replaced += 1
        if s.retiring:
            self.slots.remove(s)
        else:
            self._spawn(s)
        self._complete(task, results, s.gpu, done)
