"""Which part of a timed bmm_fp8 call gets slower after a process's first measurement? (issue 10)

The cache probe (flashinfer_cache_probe.py) showed it on the H200: the first `time_gpu` of a fresh
process agrees with the tuning run's workers, and every later one in that process, the very same
launch included, is ~2.9 µs per call slower. This runs the pieces of that launch in fresh
processes, each in a given order, so the numbers say which piece carries the change and whether
anything in time_gpu's own state (the L2-flush buffer, cached memory) sets it:
  full    FlashInfer's public bmm_fp8 (cuBLAS, tactic -1) with the activation quantized per call,
          as autotune.families.fp8_gemm times it
  gemm    bmm_fp8 alone on operands quantized beforehand
  quant   the per-call activation quantization alone (torch ops)
  sgquant SGLang's per-tensor FP8 quantization kernel (what its FP8 linears run) alone
  mm      a bf16 torch.mm of the same shape (cuBLAS through torch)
Orders (one fresh process each) are lists of those names and of steps between measurements:
  flush      allocate time_gpu's L2-flush buffer now     empty   empty torch's cached memory
  sleep      2 s with the GPU idle                       other   another process runs a kernel and exits
  poke       a process kept running beside this one runs one kernel (as a run's worker ahead in the GPU lock)
  series     200 replays of a 10-call `full` graph, L2 flushed and timed one by one: a row of the medians of
             each 20 in turn (does the state change inside a measurement, and after how long?)
  graph      capture, replay and drop a one-kernel graph busy    2 s of back-to-back eager `full` calls
  events     record 50 pairs of timing events around eager `full` calls, read them
  replays    500 replays of a 10-call graph of `full`, no events
and of switches for the rest of the process:
  keep       time_gpu's graphs are never destroyed       onestream  every graph captured on one stream
  noflush    no L2 flush before the timed replays
  prime      every timing right after a throwaway one (time_gpu(prime=True), as a run's workers time)

usage: python benchmarks/timing_state_probe.py [--out rows.json] [--M 1] [ORDER ...]
       (ORDER like full,full,full; without orders, the built-in set)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ORDERS = ["full,sleep,full,sleep,full", "full,other,full,other,full", "graph,full,full",
          "noflush,full,full,full", "keep,full,full,full", "onestream,full,full,full", "busy,full,full",
          "full,full,full,full", "prime,full,other,full,other,full"]
ARMS = ("full", "gemm", "quant", "sgquant", "mm")
STEPS = ("flush", "empty", "sleep", "other", "graph", "busy", "events", "replays", "keep", "onestream", "noflush", "prime", "poke",
         "series")
OTHER = "import torch; x = torch.ones(1 << 20, device='cuda'); print(x.sum().item())"
NEIGHBOUR = ("import sys, torch\nx = torch.ones(1 << 16, device='cuda')\nprint('ready', flush=True)\n"
             "for _ in sys.stdin:\n    x.add_(1); torch.cuda.synchronize(); print('ok', flush=True)\n")


def one_process(order: list[str], M: int) -> list[dict]:
    import statistics

    import torch

    from autotune.measure import timing
    from autotune.families.fp8_gemm import Fp8Gemm, per_tensor_x
    from autotune.contract.runner import discover
    from autotune.problems.models import GemmProblem

    problem = GemmProblem("attn_qkv+linear_in_proj_qkvz", 2560, 4096, "fp8_w8a8_block")
    runner = {r.name: r for r in discover("autotune.families.fp8_gemm")}["flashinfer_cublas"]
    routings = 10
    inputs = Fp8Gemm().make_inputs(problem, "layer", M, routings=routings)
    pre = [runner._operands(inputs, i) for i in range(routings)]
    w_bf16 = inputs.w_ref.to(torch.bfloat16)
    if "sgquant" in order:
        try:                                   # SGLang 0.5.23's place, then older releases'
            from sglang.kernels.ops.quantization.fp8_kernel import scaled_fp8_quant
        except ImportError:
            from sglang.srt.layers.quantization.fp8_kernel import scaled_fp8_quant

    import flashinfer
    launches = {
        "full": lambda i: runner.run(inputs, i, -1),
        "gemm": lambda i: flashinfer.bmm_fp8(*pre[i][:4], torch.bfloat16, out=pre[i][4], backend="cublas"),
        "quant": lambda i: per_tensor_x(inputs.x[i]),
        "sgquant": lambda i: scaled_fp8_quant(inputs.x[i]),
        "mm": lambda i: torch.mm(inputs.x[i], w_bf16.T),
    }
    import time
    kept, one_stream = [], []
    graph_of = timing._graph_of

    def keep_graphs(launch, indices):
        kept.append(graph_of(launch, indices))
        return kept[-1]

    def on_one_stream(launch, indices):
        if not one_stream:
            one_stream.append(torch.cuda.Stream())
        graph, stream = torch.cuda.CUDAGraph(), one_stream[0]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            for i in indices:
                launch(i)
        torch.cuda.current_stream().wait_stream(stream)
        return graph

    def series():
        g = timing._graph_of(launches["full"], list(range(routings)))
        per_call = timing.timed_replays(g, timing._flush_buffer(), 200, routings)
        del g
        return [round(statistics.median(per_call[i:i + 20]), 2) for i in range(0, 200, 20)]

    def step(name):
        if name == "poke":
            if not neighbour:
                neighbour.append(subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdin=subprocess.PIPE,
                                                  stdout=subprocess.PIPE, text=True))
                neighbour[0].stdout.readline()
            torch.cuda.synchronize()
            neighbour[0].stdin.write("go\n")
            neighbour[0].stdin.flush()
            neighbour[0].stdout.readline()
        elif name == "flush":
            timing._flush_buffer()
        elif name == "empty":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        elif name == "sleep":
            torch.cuda.synchronize()
            time.sleep(2)
        elif name == "other":
            torch.cuda.synchronize()
            subprocess.run([sys.executable, "-c", OTHER], check=True, capture_output=True)
        elif name == "graph":
            x = torch.zeros(1 << 10, device="cuda")
            g = timing._graph_of(lambda i: x.add_(1), [0])
            g.replay()
            torch.cuda.synchronize()
            del g
        elif name == "busy":
            end = time.perf_counter() + 2
            while time.perf_counter() < end:
                for i in range(routings):
                    launches["full"](i)
                torch.cuda.synchronize()
        elif name == "events":
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(50)]
            for n, (a, b) in enumerate(pairs):
                a.record()
                launches["full"](n % routings)
                b.record()
            torch.cuda.synchronize()
            [a.elapsed_time(b) for a, b in pairs]
        elif name == "replays":
            g = timing._graph_of(launches["full"], list(range(routings)))
            for _ in range(500):
                g.replay()
            torch.cuda.synchronize()
            del g
        elif name == "keep":
            timing._graph_of = keep_graphs
        elif name == "onestream":
            timing._graph_of = on_one_stream
        elif name == "prime":
            primed[0] = True
        elif name == "noflush":
            timing._FLUSH = torch.empty(1, dtype=torch.int32, device="cuda")
        else:
            return False
        return True

    rows, primed, neighbour = [], [False], []
    for step_no, name in enumerate(order):
        if step(name):
            continue
        if name == "series":
            rows.append({"step": step_no, "arm": name, "us": series()})
            continue
        try:
            t = timing.time_gpu(launches[name], routings, repeats=21, prime=primed[0])
            rows.append({"step": step_no, "arm": name, "us": round(t.median_us, 3), "spread": round(t.spread, 4),
                         "calls": t.calls})
        except Exception as e:       # a launch that cannot run here: the row says why
            rows.append({"step": step_no, "arm": name, "error": f"{type(e).__name__}: {e}"[:200]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("orders", nargs="*")
    ap.add_argument("--M", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for order in args.orders:
        unknown = sorted(set(order.split(",")) - set(ARMS) - set(STEPS))
        if unknown:
            ap.error(f"unknown step {', '.join(unknown)} in {order!r}; arms: {', '.join(ARMS)}; steps: {', '.join(STEPS)}")
    if args.child:
        print(json.dumps(one_process(args.orders[0].split(","), args.M)))
        return 0
    results = []
    for order in args.orders or ORDERS:
        p = subprocess.run([sys.executable, __file__, "--child", "--M", str(args.M), order],
                           capture_output=True, text=True, timeout=300)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
        rows = json.loads(lines[-1]) if p.returncode == 0 and lines else [{"error": p.stderr[-600:]}]
        results.append({"order": order, "rows": rows})
        print(order, "->", "  ".join(f"{r.get('arm')}={r.get('us', r.get('error'))}" for r in rows), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
