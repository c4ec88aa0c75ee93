"""One worker's measuring of one config at one M: inputs kept per (problem, GEMM, M), the per-GPU
lock around every piece of GPU work, the check against the reference, the timing (primed, or a
duel beside another config), and what a failure is (its status, whether the CUDA context survives).
"""
from __future__ import annotations

import contextlib
import fcntl
import re
import sys
import time

from autotune.measure import records
from autotune.measure.frames import raised_at
from autotune.measure.timing import DUEL_ROUNDS, duel
from autotune.contract.registry import default as default_family
from autotune.measure.records import Measurement, failure
from autotune.measure.tasks import Settings, Task

# Share of a worker's memory limit its kept inputs may fill (the rest: the family's weights are counted in
# it too, and what a reference or a timing allocates for a moment).
KEEP = 0.7
# Share of the limit a task may count on before inputs are built (the allocator's rounding and
# fragmentation take the rest).
ROOM = 0.9
# Messages of a CUDA error after which the process's context cannot be trusted.
_FATAL_CUDA = ("illegal memory access", "misaligned address", "unspecified launch failure",
               "illegal instruction", "device-side assert", "an illegal", "CUDA error: unknown error")


def classify(exc: BaseException) -> tuple[str, bool]:
    """(status, fatal) for an exception raised by a launch."""
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if isinstance(exc, ImportError):
        return records.UNAVAILABLE, False
    if name == "OutOfMemoryError":    # torch's allocator refused before anything ran: the context is intact
        return records.RESOURCE, False
    if name == "Refused":          # autotune.adapters.sglang_layer: SGLang's own check said no
        return records.REFUSED, False
    if name == "OutOfResources" or "out of resource" in text.lower():
        return records.OUT_OF_RESOURCES, False
    if ("CompilationError" in name or "CompileTimeAssertionFailure" in name
            or type(exc).__module__.startswith("triton.compiler") or "PassManager::run failed" in text):
        return records.COMPILE_ERROR, False
    if records.is_resource_reason(text):   # CUDA's own out-of-memory or a busy device: start afresh
        return records.RESOURCE, True
    if any(s.lower() in text.lower() for s in _FATAL_CUDA):
        return records.RUNTIME_ERROR, True
    return records.RUNTIME_ERROR, False


def failure_reason(stage: str, exc: BaseException) -> str:
    """One line for the record; the whole text (an MLIR error is many lines) goes to the log."""
    name = type(exc).__name__
    where = "" if classify(exc)[0] != records.RUNTIME_ERROR else raised_at(exc)
    at = f" (raised at {where})" if where else ""
    print(f"[{stage}] {name}: {exc}{at}", file=sys.stderr, flush=True)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return f"{stage}: {name}{at}"
    text = lines[0]
    if re.fullmatch(r"at \d+:\d+:", text) and len(lines) > 1:
        text = f"{lines[-1]} ({text[:-1]})"     # Triton: location, source excerpt, message last
    more = " [full text in the worker log]" if len(lines) > 1 else ""
    return f"{stage}: {name}: {text[:240]}{at}{more}"


class Measurer:
    """One worker's measuring: inputs kept per (problem, GEMM, M), the GPU lock, the protocol.

    Every piece of GPU work (building inputs, the reference, the checked launch, timing) runs
    under the per-GPU lock; only compilation runs outside it. Kernels of other workers would
    otherwise share the GPU with a timed replay (seen on the H200: 40% inflated timings at
    large M while 15 workers per GPU checked and built inputs).
    """

    def __init__(self, settings: Settings, lock_fd: int):
        import torch

        from autotune.measure.timing import check_output, time_cpu, time_gpu

        self.settings, self.lock_fd = settings, lock_fd
        self.torch, self.check_output, self.time_cpu, self.time_gpu = torch, check_output, time_cpu, time_gpu
        self.inputs: dict = {}       # (family, problem, GEMM, M) -> inputs, least recently used first
        self.families: dict = {}
        self.limit: int | None = None     # bytes torch's allocator may hold in this process (None: no limit)
        # What the run reports of its own pace (autotune.measure.pool.Pace): seconds this process held the
        # GPU (inputs, reference, checked launch, timing) and seconds it spent compiling (the GPU idle).
        self.held_s = 0.0
        self.compile_s = 0.0
        # The only measuring process on its GPU (the pool says so): no other process's kernel comes between
        # its timings, so it primes once, as a server's process is in its steady state (autotune.measure.timing).
        self.alone = False
        self._last_timed = float("-inf")

    def family(self, name: str):
        if name not in self.families:
            from autotune.contract.protocol import get_family
            fam = get_family(name, **self.settings.options.get(name, {}))
            if self.families:   # one family at a time: each keeps its problem's weights for every M
                self.families.clear()
                self.inputs = {k: v for k, v in self.inputs.items() if k[0] == fam.name}
                self._release()
            self.families[name] = fam
        return self.families[name]

    # -- GPU memory: this worker's share of the run's plan (autotune.gpus.memory_plan) -----------------
    def limit_memory(self, limit: int | None) -> None:
        """Hold torch's allocator in this process to `limit` bytes: past it an allocation here fails as
        out-of-memory (a resource failure the pool retries), never another process's."""
        if limit is None or self.settings.on_cpu:
            return
        from autotune.gpus.memory_plan import limit_process

        self.limit = int(limit)
        limit_process(self.limit / self.torch.cuda.get_device_properties(0).total_memory)

    def trim(self) -> int:
        """After a task: the least recently used batch sizes' inputs dropped while the allocator holds
        more than KEEP of the limit (the family's weights stay); returns the peak bytes held so far."""
        if self.settings.on_cpu:
            return 0
        cuda = self.torch.cuda
        dropped = False
        while self.limit is not None and len(self.inputs) > 1 and cuda.memory_allocated() > KEEP * self.limit:
            del self.inputs[next(iter(self.inputs))]
            dropped = True
        if dropped:
            self._release()
        return int(cuda.max_memory_reserved())

    def make_room(self, family, problem, gemm: str, M: int) -> int:
        """Before a batch size's inputs are built: the least recently used ones dropped until what this
        task needs (the family's `task_bytes`: its inputs, outputs, reference and their transients) fits
        under the worker's limit beside what stays. Without it the kept inputs of earlier batch sizes
        push a large batch over the limit, an out-of-memory of the worker's own making. Returns how many
        were dropped."""
        need = getattr(family, "task_bytes", None)
        if self.limit is None or need is None or self.settings.on_cpu:
            return 0
        need = need(problem, gemm, M, self.settings.routings)
        dropped = 0
        while self.inputs and self._allocated() + need > ROOM * self.limit:
            del self.inputs[next(iter(self.inputs))]
            dropped += 1
        if dropped:
            self._release()
        return dropped

    def _allocated(self) -> int:
        return int(self.torch.cuda.memory_allocated())

    def _release(self) -> None:
        if not self.settings.on_cpu:
            import gc

            gc.collect()
            self.torch.cuda.empty_cache()

    @contextlib.contextmanager
    def gpu(self):
        if self.settings.on_cpu:   # the interpreter's wall-clock numbers need no exclusivity
            yield
            return
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.torch.cuda.synchronize()
            self.held_s += time.perf_counter() - t0
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def _inputs(self, family, problem, gemm: str, M: int):
        key = (family.name, problem.key, gemm, M)
        if key not in self.inputs:
            # One problem at a time: drop other problems' tensors before allocating.
            for k in [k for k in self.inputs if k[:2] != key[:2]]:
                del self.inputs[k]
            s = self.settings
            self.make_room(family, problem, gemm, M)
            self.inputs[key] = family.make_inputs(problem, gemm, M, seed=s.seed, skew=s.skew,
                                                  routings=s.routings, on_cpu=s.on_cpu)
        self.inputs[key] = self.inputs.pop(key)      # most recently used last (trim drops from the front)
        return self.inputs[key]

    def _time(self, family, launch, repeats: int, prime: bool):
        if self.settings.on_cpu:      # the interpreter's timings: wall clock, or the family's own clock
            return self.time_cpu(launch, self.settings.routings, repeats=min(repeats, 3),
                                 clock=getattr(family, "clock", None) or time.perf_counter)
        from autotune.measure.timing import HOT_GAP_S, WARMUP_HOT_MS, WARMUP_MS

        # a lone measuring process that timed a moment ago finds the GPU's clocks where its last timing left them
        hot = self.alone and time.monotonic() - self._last_timed < HOT_GAP_S
        t = self.time_gpu(launch, self.settings.routings, repeats=repeats, prime=prime,
                          warmup_ms=WARMUP_HOT_MS if hot else WARMUP_MS)
        self._last_timed = time.monotonic()
        return t

    def _checked_launch(self, family, cfg, inputs, ref, problem) -> tuple[bool, str, float]:
        """One launch of `cfg` into an output poisoned with NaN first, checked against `ref`."""
        if getattr(inputs, "C", None) is not None:   # families that own their output buffer
            inputs.C.fill_(float("nan"))
        out = family.run(cfg, inputs, 0)
        if not self.settings.on_cpu:
            self.torch.cuda.synchronize()
        return self.check_output(out, ref, family.tolerance(problem, self.settings.on_cpu))

    def _checked_versus(self, family, task: Task, inputs, ref, problem):
        """The launch of task.versus, if it runs and its output is right here (else the timing goes
        unpaired: the config measured is not blamed for its baseline)."""
        if task.versus is None:
            return None
        try:
            if not self._checked_launch(family, task.versus, inputs, ref, problem)[0]:
                return None
        except Exception as e:
            failure_reason("the baseline of a paired timing", e)     # to the worker log
            return None
        return lambda i: family.run(task.versus, inputs, i)

    def measure(self, task: Task, problem, M: int) -> tuple[Measurement, bool]:
        """(record, fatal): fatal means this process's CUDA context can no longer be trusted."""
        cfg, pk, gemm, s = task.config, task.problem_key, task.gemm, self.settings
        family = self.family(task.family or s.family or default_family())

        def failed(status, why, **kw):
            return failure(pk, gemm, M, cfg, status, why, **kw)

        stage = "building inputs"
        try:
            with self.gpu():
                inputs = self._inputs(family, problem, gemm, M)
                prepare = getattr(family, "prepare", None)   # optional in the protocol
                if prepare is not None:
                    prepare(cfg, inputs)
            stage = "compiling"
            t0 = time.perf_counter()
            family.compile(cfg, inputs)
            compile_s = time.perf_counter() - t0
            self.compile_s += compile_s
        except BaseException as e:
            status, fatal = classify(e)
            return failed(status, failure_reason(stage, e)), fatal
        stage = "first launch"
        try:
            with self.gpu():
                ref = family.reference(inputs, cfg)
                t0 = time.perf_counter()
                ok, reason, err = self._checked_launch(family, cfg, inputs, ref, problem)
                compile_s += time.perf_counter() - t0
                if not ok:
                    return failed(records.WRONG_RESULT, reason, error=err, compile_s=compile_s), False
                stage = "timing"
                launch = lambda i: family.run(cfg, inputs, i)  # noqa: E731
                repeats = task.repeats or s.repeats
                versus = self._checked_versus(family, task, inputs, ref, problem)
                if versus is None:   # primed: other workers' kernels come between this worker's timings
                    t, paired = self._time(family, launch, repeats, prime=not self.alone), (None, None)
                else:
                    first = iter([True])    # one hold of the lock: priming once keeps both sides in one state
                    t, *paired = duel(lambda fn: self._time(family, fn, max(3, repeats // DUEL_ROUNDS),
                                                            next(first, False)), launch, versus)
        except BaseException as e:
            status, fatal = classify(e)
            return failed(status, failure_reason(stage, e), compile_s=compile_s), fatal
        m = Measurement(pk, gemm, M, cfg, records.OK, "", t.median_us, t.spread, err,
                        compile_s, t.bench_s, t.samples, versus_us=paired[0], versus_spread=paired[1])
        if task.tactics:
            try:
                with self.gpu():
                    m.tactics = list(family.tactics(cfg, inputs))
            except Exception as e:     # the default still ran: only the search inside it is lost
                m.reason = failure_reason("listing tactics", e)
                m.tactics = []
        return m, False
