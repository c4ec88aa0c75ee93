"""Timing and the numerical check.

GPU timing: the launches of several routing sets are captured in one CUDA graph (launch
gaps vanish, weights are not re-read from L2 across calls), L2 is flushed before each
replay, each replay is timed with events, and the median per call is kept with the spread
(interquartile range over median). Under Triton's CPU interpreter the same protocol runs
with a wall clock: those numbers exercise the pipeline and mean nothing about speed.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

L2_FLUSH_BYTES = 256 << 20   # several times the largest L2 we target (H200: 60 MB)
WARMUP_MS = 30.0             # back-to-back GPU work before the timed replays (Triton's do_bench: 25 ms)
# On a GPU that a lone measuring process timed on less than HOT_GAP_S ago, its clocks are where that timing left
# them: 5 ms of warm-up gave the same medians as 30 (H100, 6 GEMM x M cases, 8 rounds each alternated: ratios
# 0.997-1.001, inside their spreads; benchmarks/layer_agreement.py), and the search measures 1.5x as much.
WARMUP_HOT_MS = 5.0
HOT_GAP_S = 0.25
WARMUP_REPLAYS_MAX = 2000
MIN_EFFECT = 0.01            # the smallest difference between two timings taken as real (1%)
DUEL_ROUNDS = 3              # rounds of a paired timing (each side timed once per round)


def noise(*spreads: float) -> float:
    """The relative difference two timings must exceed to count: their larger spread, at least MIN_EFFECT."""
    return max(MIN_EFFECT, *spreads)


@dataclass
class Timing:
    median_us: float
    spread: float        # (p75 - p25) / median over replays
    samples: int
    bench_s: float       # wall seconds spent timing
    calls: int = 1       # calls per timed replay (GPU: the graph's length; a replay starts L2-cold)


def rel_error(out, ref) -> float:
    import torch

    out = out.float()
    if not torch.isfinite(out).all():
        return float("nan")
    denom = ref.norm().item() or 1.0
    return (out - ref).norm().item() / denom


def check_output(out, ref, tol: float) -> tuple[bool, str, float]:
    """(ok, reason, error): NaN/Inf (also an output the kernel never wrote, since outputs are
    poisoned with NaN first) or a relative error above `tol` fails. The reason is the evidence a
    sieve keeps: the share of bad outputs and the first bad element, or the error and the element
    furthest off."""
    import torch

    o = out.float()
    finite = torch.isfinite(o)
    bad = (~finite).sum().item()
    if bad:
        first = int((~finite).flatten().nonzero()[0])
        return False, (f"{bad} of {o.numel()} outputs NaN/Inf or never written ({100 * bad / o.numel():.3g}%; "
                       f"first at {_index(first, o.shape)}: {o.flatten()[first].item()})"), float("nan")
    err = rel_error(o, ref)
    if not err <= tol:
        diff = (o - ref.float()).abs().flatten()
        worst = int(diff.argmax())
        return False, (f"relative error {err:.3g} > tolerance {tol:.3g} (furthest off at {_index(worst, o.shape)}: "
                       f"{o.flatten()[worst].item():.4g} vs {ref.flatten()[worst].item():.4g})"), err
    return True, "", err


def _index(flat: int, shape) -> tuple:
    """The index of element `flat` of a row-major tensor of `shape`."""
    out = []
    for n in reversed(tuple(shape)):
        out.append(flat % n)
        flat //= n
    return tuple(reversed(out))


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    if len(xs) < 4:
        m = statistics.median(xs)
        return xs[0], m, xs[-1]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[1], q[2]


_PRIMED = False


def time_gpu(launch, n_routings: int, repeats: int = 7, target_ms: float = 2.0, prime: bool = False,
             flush: str = "write", warmup_ms: float = WARMUP_MS) -> Timing:
    """Median per-call time of `launch(i)` for i over routing sets, in a CUDA graph.

    On the H200 the first graph timing after another process has run a kernel on the GPU is ~0.35 µs
    per kernel launch faster than every later one, the same launch included (measured by
    benchmarks/timing_state_probe.py). Every timing is therefore taken right after a
    throwaway one of the same launch, in the steady state of a process alone on its GPU, as a
    server is: a lone process primes once (its first timing), a run's workers, which share the GPU,
    prime every timing (`prime`, under the GPU lock, so no other worker's kernel comes between).

    `flush`: how L2 is emptied before each replay. "write" zeroes a 256 MB buffer (what every timing of the
    search does): L2 is then full of dirty lines the first call writes back. "read" reads the buffer: L2 is full
    of clean lines, as after the reads that fill most of a server's L2 before a kernel (the layer timing).
    """
    global _PRIMED
    if prime or not _PRIMED:
        _PRIMED = True
        _time_graph(launch, n_routings, 3, target_ms, flush, warmup_ms)
    return _time_graph(launch, n_routings, repeats, target_ms, flush, warmup_ms)


def duel(time_one, launch, versus, rounds: int = DUEL_ROUNDS) -> tuple[Timing, float, float]:
    """`launch` and `versus` timed alternately by `time_one`, the order turned each round (v l, l v,
    v l ...), so a state of the GPU that holds through the rounds, or drifts across them, weighs on
    both alike. Returns launch's timing (median of its rounds), versus's median µs and the spread
    of the per-round ratios (range over median): what a pin decision compares."""
    mine, theirs = [], []
    for r in range(rounds):
        if r % 2 == 0:
            theirs.append(time_one(versus))
            mine.append(time_one(launch))
        else:
            mine.append(time_one(launch))
            theirs.append(time_one(versus))
    lo, mid, hi = quartiles([a.median_us / b.median_us for a, b in zip(mine, theirs)])
    t = Timing(statistics.median(x.median_us for x in mine), statistics.median(x.spread for x in mine),
               sum(x.samples for x in mine), sum(x.bench_s for x in mine + theirs), mine[0].calls)
    return t, statistics.median(x.median_us for x in theirs), (hi - lo) / mid if mid > 0 else 0.0


def _time_graph(launch, n_routings: int, repeats: int, target_ms: float, flush_mode: str = "write",
                warmup_ms: float = WARMUP_MS) -> Timing:
    import torch

    t0 = time.perf_counter()
    # Eager pass over every routing set first: one-time costs (JIT, library handles, heuristics
    # queries, plans) and per-set buffers (alignment, TMA layouts) stay outside the graphs.
    for i in range(n_routings):
        launch(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # The calls per replay come from the GPU time of one call (a one-call graph), not from an
    # eager call: an eager call's time is mostly the CPU's launch overhead, which differs between
    # a busy run's workers and a fresh process, and it set how many calls after the first L2-cold
    # one a replay averaged over (seen: the same kernel 3 µs apart across processes).
    one = _graph_of(launch, [0])
    one.replay()
    start.record()
    one.replay()
    end.record()
    torch.cuda.synchronize()
    del one
    calls = max(2, min(n_routings, int(target_ms / max(start.elapsed_time(end), 1e-3)) + 1))
    graph = _graph_of(launch, [i % n_routings for i in range(calls)])
    flush = _flush_buffer()
    # Warm-up: back-to-back work before the timed replays (the GPU's clocks and caches settle).
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    for _ in range(min(WARMUP_REPLAYS_MAX, int(warmup_ms / max(start.elapsed_time(end), 1e-3)))):
        graph.replay()
    per_call = timed_replays(graph, flush, repeats, calls, flush_mode)
    del graph
    q1, med, q3 = quartiles(per_call)
    return Timing(med, (q3 - q1) / med if med > 0 else 0.0, len(per_call), time.perf_counter() - t0, calls)


def timed_replays(graph, flush, replays: int, calls: int, mode: str = "write") -> list[float]:
    """µs per call of each of `replays` replays of a graph of `calls` calls, L2 flushed before each (`mode`: by
    writing the flush buffer, or by reading it: time_gpu)."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    sink = torch.empty((), dtype=torch.int64, device=flush.device) if mode == "read" else None
    for s, e in events:
        if sink is None:
            flush.zero_()
        else:
            torch.sum(flush, dim=0, dtype=torch.int64, out=sink)
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / calls for s, e in events]


def _graph_of(launch, indices):
    """A CUDA graph of launch(i) for i in indices, captured on a side stream."""
    import torch

    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for i in indices:
                launch(i)
    torch.cuda.current_stream().wait_stream(stream)
    return graph


_FLUSH = None


def _flush_buffer():
    global _FLUSH
    import torch

    if _FLUSH is None:
        _FLUSH = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    return _FLUSH


def time_cpu(launch, n_routings: int, repeats: int = 3, clock=time.perf_counter) -> Timing:
    """Wall-clock stand-in under Triton's interpreter (labelled cpu-interpreter everywhere). `clock`:
    seconds, the wall clock unless the family brings its own (autotune.contract.protocol.KernelFamily.clock)."""
    t0 = clock()
    xs = []
    for r in range(repeats):
        s = clock()
        launch(r % n_routings)
        xs.append((clock() - s) * 1e6)
    q1, med, q3 = quartiles(xs)
    return Timing(med, (q3 - q1) / med if med > 0 else 0.0, len(xs), clock() - t0)
