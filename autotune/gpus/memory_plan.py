"""GPU memory as a planned resource: how many measuring workers a GPU holds, said before anything runs.

Every worker is a process with its own CUDA context, its problem's weights and the inputs, outputs and
float32 references it keeps per batch size; the run's own process also runs GPU work (the layer check of
the picks). Sizing the pool from cores alone filled an 80 GB H100 with 15 workers of Qwen3.5-397B and
crashed the run. So, before the pool starts:

- each family predicts one worker's footprint per problem from shapes and dtypes (`footprint`), and the
  Triton MoE family the run's own layer check (`main_footprint`);
- per GPU, workers = the least of cores - 1, WORKERS_PER_GPU and what fits in the GPU's free memory (or
  AUTOTUNE_GPU_MEMORY, a cap that makes the tool plan for a smaller card) after the run's own need and a
  margin; a `--workers` that does not fit is lowered, with one line;
- each process is held to its share (torch's per-process memory fraction), so a worker that needs more
  than planned fails its own measurement with out-of-memory (a resource failure the pool retries with
  fewer, larger workers: autotune.measure.pool), never another process's.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from autotune.gpus.catalog import GiB, MiB

# Measuring processes a GPU: past it they queue for the GPU's timing lock and only add CUDA contexts
# (15 compile in parallel while one times).
WORKERS_PER_GPU = 15
# A process's CUDA context with torch, Triton and cuBLAS loaded (lazy module loading), outside torch's
# allocator: not limited by the memory fraction, so counted apart.
CONTEXT_BYTES = 768 * MiB
# What the plan leaves free on each GPU: the allocator's fragmentation and the driver's own.
MARGIN_SHARE, MARGIN_MIN = 0.05, 1 * GiB
# L2 flush buffer every timing writes before each replay (autotune.measure.timing).
FLUSH_BYTES = 256 * MiB
CAP_ENV = "AUTOTUNE_GPU_MEMORY"
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


class GpuMemoryError(ValueError):
    """A memory cap that cannot be read, or a problem no worker can hold (one line, exit 2)."""


def gib(n: int | float) -> str:
    return f"{n / GiB:.1f} GiB"


def parse_size(text: str, what: str = CAP_ENV) -> int:
    """'32GiB', '96GB', '80G', '512MiB' -> bytes. A bare number is refused: bytes or GiB, nobody can tell."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*", str(text))
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if unit is None:
        raise GpuMemoryError(f"{what}={text!r:.40} is not a size: write it with a unit, e.g. 32GiB, 96GB or 512MiB")
    size = int(float(m.group(1)) * unit)
    if not (256 * MiB <= size <= 2**50):
        raise GpuMemoryError(f"{what}={text!r:.40}: a GPU memory between 256MiB and 1PiB")
    return size


def memory_cap() -> int | None:
    text = os.environ.get(CAP_ENV, "").strip()
    return parse_size(text) if text else None


@dataclass(frozen=True)
class Footprint:
    """Bytes one process holds on the GPU for one problem, by part (the CUDA context apart)."""
    what: str
    parts: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return CONTEXT_BYTES + sum(self.parts.values())

    def describe(self) -> str:
        return ", ".join(f"{k} {gib(v)}" for k, v in self.parts.items() if v) + f", CUDA context {gib(CONTEXT_BYTES)}"


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as the plan sees it: the driver's total and free bytes, and the cap if any."""
    index: int
    total: int
    free: int
    cap: int | None = None

    @property
    def usable(self) -> int:
        return min(self.free, self.cap) if self.cap else self.free

    @property
    def margin(self) -> int:
        return max(MARGIN_MIN, int(MARGIN_SHARE * min(self.total, self.cap or self.total)))


def read_gpus(indices, cap: int | None = None) -> list[GpuMemory]:
    """Each GPU's total and free memory, from the driver (NVML, so the run's own process makes no CUDA
    context on GPUs it will not use), else from torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out = []
            for i in indices:
                info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
                out.append(GpuMemory(i, int(info.total), int(info.free), cap))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        import torch

        return [GpuMemory(i, *reversed([int(x) for x in torch.cuda.mem_get_info(i)]), cap) for i in indices]


@dataclass(frozen=True)
class Phase:
    """One step of the run as the GPU sees it: the largest worker footprint among its problems, and the
    run's own GPU work meanwhile (the Triton MoE family's layer check; None for the backend choice).
    `apart`: its families compile apart from the GPU (autotune.measure.builders): one measuring process a
    GPU keeps it busy, the builders compile."""
    name: str
    per_worker: Footprint
    main: Footprint | None = None
    apart: bool = False


@dataclass(frozen=True)
class MemoryPlan:
    gpus: tuple                   # GpuMemory per GPU the pool uses (the first one also holds the run's process)
    phases: tuple                 # Phase per step of the run, in order
    workers: dict                 # phase name -> workers per GPU in that phase
    limited_by: dict              # phase name -> what set its count: "memory", "cores", "--workers", "15 a GPU"
    cores: int | None = None      # None: planned for a machine whose cores are not known here
    lowered_from: int | None = None
    builders: int = 0             # CPU processes compiling apart for the phases that do (0: none does)

    def phase(self, name: str) -> Phase | None:
        return next((ph for ph in self.phases if ph.name == name), None)

    def budget(self, i: int, phase: Phase) -> int:
        """Bytes the workers on the i-th GPU may hold together in `phase`: its usable memory less the
        margin and, on the first GPU, the run's own need."""
        g = self.gpus[i]
        main = phase.main.total if phase.main is not None and i == 0 else 0
        return max(0, g.usable - g.margin - main)

    def fits(self, i: int, phase: Phase) -> int:
        return self.budget(i, phase) // phase.per_worker.total

    def share(self, i: int, phase: Phase, workers: int) -> int:
        """Bytes each of `workers` workers on the i-th GPU may hold in `phase` (its context included)."""
        return self.budget(i, phase) // workers if workers else 0

    def limits(self, phase: Phase) -> dict:
        """GPU index -> bytes each worker there may hold in torch's allocator in `phase`."""
        return {g.index: self.share(i, phase, self.workers[phase.name][i]) - CONTEXT_BYTES
                for i, g in enumerate(self.gpus)}

    def main_fraction(self, phase: Phase, workers: int) -> float:
        """The run's own process in `phase`, beside `workers` workers on the first GPU: what they leave,
        less the margin."""
        g = self.gpus[0]
        rest = g.usable - g.margin - workers * self.share(0, phase, workers) - CONTEXT_BYTES
        return max(0.01, min(1.0, rest / g.total))

    def slots(self, phase: Phase) -> list[int]:
        """The GPU (index in the machine) of each worker in `phase`, round robin over the GPUs."""
        out, left = [], list(self.workers[phase.name])
        while any(left):
            for i, n in enumerate(left):
                if n:
                    out.append(self.gpus[i].index)
                    left[i] -= 1
        return out

    def lines(self, gpu_name: str) -> list[str]:
        g = self.gpus[0]
        where = f"{gpu_name}, {len(self.gpus)} GPUs" if len(self.gpus) > 1 else gpu_name
        cap = f", planned as {gib(g.cap)} ({CAP_ENV})" if g.cap else ""
        cores = (f"cores allow {max(1, self.cores - 1)}" if self.cores is not None
                 else "at most cores - 1 of the machine that runs it")
        out = [f"GPU memory plan ({where}): {gib(g.total)}, {gib(g.free)} free on GPU {g.index}{cap}; margin "
               f"{gib(g.margin)}; {cores}, at most {WORKERS_PER_GPU} a GPU"]
        for ph in self.phases:
            n = self.workers[ph.name]
            out.append(f"  {ph.name}: {sum(n)} worker{'s' if sum(n) != 1 else ''}"
                       + (f" ({'+'.join(map(str, n))} over the GPUs)" if len(n) > 1 else "")
                       + f" (set by {self.limited_by[ph.name]}) of {gib(ph.per_worker.total)} for "
                       f"{ph.per_worker.what} ({ph.per_worker.describe()})"
                       + (f"; this process {gib(ph.main.total)} for {ph.main.what}" if ph.main is not None else ""))
        if any(ph.apart for ph in self.phases):
            out.append(f"  compiling: {self.builders} builder processes on the CPU (no CUDA context), for the phases "
                       "that compile apart" if self.builders else
                       "  compiling: builder processes on the CPU (cores - 2 of the machine that runs it)")
        if self.lowered_from is not None:
            out.append(f"--workers {self.lowered_from} does not fit the GPU memory: lowered to "
                       + ", ".join(f"{sum(self.workers[ph.name])} ({ph.name})" for ph in self.phases))
        return out

    def to_dict(self) -> dict:
        def fp(f):
            return None if f is None else {"what": f.what, "bytes": f.total,
                                           "parts": {**f.parts, "cuda_context": CONTEXT_BYTES}}
        return {"gpus": [{"index": g.index, "total_bytes": g.total, "free_bytes": g.free, "cap_bytes": g.cap,
                          "margin_bytes": g.margin} for g in self.gpus],
                "phases": [{"name": ph.name, "per_worker": fp(ph.per_worker), "main_process": fp(ph.main),
                            "workers": list(self.workers[ph.name]), "limited_by": self.limited_by[ph.name]}
                           for ph in self.phases],
                "cores": self.cores, "lowered_from": self.lowered_from, "builders": self.builders}


def plan_pool(gpus: list[GpuMemory], phases: list[Phase], *, cores: int | None, requested: int | None,
              builders: int | None = None) -> MemoryPlan:
    """Workers per GPU in each phase: the least of cores - 1 (over all GPUs), WORKERS_PER_GPU and what fits
    each GPU's budget; a `requested` count that fits is taken as it is, one that does not is lowered. A phase
    whose families compile apart takes one worker a GPU; the builders (`builders`, default every core but one
    and the workers') compile for it."""
    probe = MemoryPlan(tuple(gpus), tuple(phases), {}, {})
    by_cores = max(1, cores - 1) if cores is not None else None
    workers, limited, lowered = {}, {}, None
    for ph in phases:
        fit = [min(WORKERS_PER_GPU, probe.fits(i, ph)) for i in range(len(gpus))]
        if not any(fit):
            raise DoesNotFit(f"{ph.name}: {too_big(ph.per_worker, ph.main, gpus)}")
        want = requested if requested is not None else min(x for x in (sum(fit), by_cores) if x is not None)
        if ph.apart and requested is None:
            want = sum(1 for f in fit if f)
            limited[ph.name] = "compiling apart: one measuring process a GPU, builders compile"
        elif requested is not None:
            limited[ph.name] = "--workers"
        elif by_cores is not None and by_cores < sum(fit):
            limited[ph.name] = "cores"
        elif all(f == WORKERS_PER_GPU for f in fit):
            limited[ph.name] = f"{WORKERS_PER_GPU} a GPU"
        else:
            limited[ph.name] = "memory"
        if want > sum(fit):
            lowered, want, limited[ph.name] = want, sum(fit), "memory"
        n = [0] * len(gpus)
        while sum(n) < want:            # spread evenly over the GPUs that have room
            i = min((i for i in range(len(gpus)) if n[i] < fit[i]), key=lambda i: (n[i], i))
            n[i] += 1
        workers[ph.name] = tuple(n)
    apart = [sum(workers[ph.name]) for ph in phases if ph.apart]
    if apart and builders is None:
        builders = max(1, cores - 1 - max(apart)) if cores is not None else 0
    return MemoryPlan(tuple(gpus), tuple(phases), workers, limited, cores, lowered, builders if apart else 0)


class DoesNotFit(GpuMemoryError):
    pass


def too_big(own: Footprint, main: Footprint | None, gpus: list[GpuMemory]) -> str | None:
    """Why no GPU of the plan can hold one worker of this problem (with the run's own layer check of it
    on the first GPU), or None."""
    g = gpus[0]
    need = own.total + (main.total if main is not None else 0)
    if need <= g.usable - g.margin or any(own.total <= o.usable - o.margin for o in gpus[1:]):
        return None
    return (f"one worker needs {gib(own.total)} of GPU memory ({own.describe()})"
            + (f" and this process {gib(main.total)} for its layer check" if main is not None else "")
            + f", {gib(g.usable - g.margin)} is free on GPU {g.index}"
            + (f" under {CAP_ENV}={gib(g.cap)}" if g.cap else "") + " (after the margin): tune it at a larger --tp "
            "or on a larger GPU")


def largest(footprints) -> Footprint | None:
    fps = [f for f in footprints if f is not None]
    return max(fps, key=lambda f: f.total) if fps else None


def limit_process(fraction: float, device: int = 0) -> None:
    """Hold this process to `fraction` of the GPU's memory (torch's caching allocator): past it an
    allocation raises out-of-memory here, never in another process."""
    import torch

    torch.cuda.set_per_process_memory_fraction(min(1.0, max(0.01, fraction)), device)


def hold_to_cap(device: int = 0) -> int | None:
    """A command whose GPU work runs in its own process alone (`check`'s re-timing, `validate --engine
    harness`) has the whole GPU, but no more than AUTOTUNE_GPU_MEMORY where it is set: the cap stands for a
    smaller card, so the process is held to it. Returns the cap applied, None where there is none (or no GPU)."""
    cap = memory_cap()
    if cap is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    limit_process(cap / torch.cuda.get_device_properties(device).total_memory, device)
    return cap
