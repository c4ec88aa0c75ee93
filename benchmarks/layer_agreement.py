"""Does the tool's layer timing agree with SGLang's own, and which timing of the disputed M=1 pair is right?

On a GPU, for Qwen3.5-397B-A17B at TP8 (bf16 experts: E=512, N=128, K=4096, top-10), per batch size and per
(gate_up, down) pair, four timings of the same layer:
- `tool`: the run's layer check and `autotune check` (autotune.families.triton_moe.layer_timing: SGLang's
  fused_experts through the tool's adapter, configs read by SGLang's loader from the side's folder, one CUDA graph
  over 10 routing sets, L2 emptied by a read before each replay, median per call; sides in turns, 3 repeats), and
  the same with the search's write-flush;
- `sglang`: SGLang's `fused_experts` (the function the server's Triton runner calls) called here directly with the
  same weights and routing sets, in a plain CUDA graph over the 10 routing sets, 20 replays timed with events
  without an L2 flush, median per call; 3 rounds, the pairs in turns: a timing written apart from the tool's (and
  the same with a write-flush before each replay);
- `old`: the layer check as it was (autotune.families.triton_moe.moe_layer's composition of SGLang's kernels, one
  routing set, a graph of 2 calls);
- `gemms`: the search's view, gate_up and down each timed alone (autotune.measure.timing, 10 routing sets), summed.
Pairs: SGLang's own folder (`shipped`), an empty folder (`default`: SGLang's default config), the disputed pair
of the issue written as it was (`disputed`: down without num_warps/num_stages), the same with Triton's defaults
stated (`disputed_stated`: the same kernel), and with down num_stages 4 (`disputed_s4`).

    python benchmarks/layer_agreement.py --Ms 1,2,4,8,64,1024 --out layer_agreement.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

UP = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4}
DOWN = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}


def raw_side(root, name, problem, device, Ms, up, down) -> str:
    """A folder holding exactly these dicts at every M (no key added): what the disputed run wrote."""
    from autotune.adapters.sglang_loader import sglang_file_name
    from autotune.folder.config_files import config_folder

    files = Path(root) / name / config_folder(device.versions.get("triton"))
    files.mkdir(parents=True, exist_ok=True)
    (files / sglang_file_name(problem, device)).write_text(json.dumps({str(M): up for M in Ms}))
    (files / sglang_file_name(problem, device, down=True)).write_text(json.dumps({str(M): down for M in Ms}))
    return str(Path(root) / name)


def sglang_own(timer, folders: dict, M: int, rounds: int = 3, replays: int = 20, flush: bool = False) -> dict:
    """side -> µs per call of SGLang's fused_experts, called here directly (not through the tool's adapter) on the
    timer's weights and routing sets, in a plain graph over the routing sets (no flush; `flush`: a 256 MB buffer
    zeroed before each replay, as the search's timing does)."""
    import torch
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    from autotune.adapters.sglang_layer import moe_flags, use_triton_configs

    p = timer.problem
    xs, wts, ids, _ = timer.inputs(M)
    w13, _, w2, _ = timer.weights
    cfg = MoeRunnerConfig(num_experts=p.E, num_local_experts=p.E, hidden_size=p.K, intermediate_size_per_partition=p.N,
                          layer_id=0, top_k=p.top_k, activation="silu", is_gated=True, inplace=False)
    graphs = {}
    for side, folder in folders.items():
        use_triton_configs(folder)
        with moe_flags("triton", None):
            def call(i):
                return fused_experts(xs[i], w13, w2, StandardTopKOutput(wts[i], ids[i], None), cfg)
            for i in range(len(xs)):        # eager first: compiles and JIT builds stay outside the graph
                call(i)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
                for i in range(len(xs)):
                    call(i)
            torch.cuda.current_stream().wait_stream(s)
        graphs[side] = g
    out: dict = {s: [] for s in folders}
    names = list(folders)
    buf = torch.empty(64 << 20, dtype=torch.int32, device="cuda") if flush else None
    for r in range(rounds):
        for side in names[r % len(names):] + names[: r % len(names)]:
            g = graphs[side]
            for _ in range(5):
                g.replay()
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
            for a, b in ev:
                if buf is not None:
                    buf.zero_()
                a.record()
                g.replay()
                b.record()
            torch.cuda.synchronize()
            out[side].append(statistics.median(a.elapsed_time(b) * 1000 / len(xs) for a, b in ev))
    return {s: statistics.median(v) for s, v in out.items()}


def old_layer(problem, device, pairs: dict, M: int) -> dict:
    """side -> µs of the layer check as it was: moe_layer's composition, one routing set, a graph of 2 calls."""
    import torch

    from autotune.families.triton_moe import random_routing
    from autotune.families.triton_moe.moe_layer import MoeSides, SideConfig
    from autotune.measure.timing import time_gpu

    configs = {(M, s): SideConfig(up, down, True, s) for s, (up, down) in pairs.items()}
    sides = MoeSides(problem, device, ".", configs=configs)
    up_w, down_w = sides.expert_weights(3)
    g = torch.Generator(device="cuda").manual_seed(3 + M)
    x = torch.randn((M, problem.K), generator=g, device="cuda").to(torch.bfloat16)
    ids, w = (r[0] for r in random_routing(g, M, problem.E, problem.top_k, 0.0, 1))
    return {s: time_gpu(lambda i, s=s: sides.moe(up_w, down_w, x, ids, w, s), 1, repeats=7).median_us for s in pairs}


def gemm_sum(problem, pairs: dict, M: int) -> dict:
    """side -> gate_up µs + down µs, each timed alone as the search times them (10 routing sets)."""
    from autotune.families.triton_moe import TritonMoe
    from autotune.measure.timing import time_gpu

    from autotune.contract.config import KernelConfig

    fam = TritonMoe()
    out = {}
    ins = {g: fam.make_inputs(problem, g, M) for g in ("gate_up", "down")}
    for s, (up, down) in pairs.items():
        cfgs = {"gate_up": KernelConfig.from_entry(up),
                "down": KernelConfig.from_entry({**down, "BLOCK_SIZE_M": up["BLOCK_SIZE_M"]})}
        out[s] = sum(time_gpu(lambda i, g=g: fam.run(cfgs[g], ins[g], i), 10, repeats=7).median_us for g in cfgs)
    return out


def warmup_ab(problem, Ms=(1, 64, 1024), rounds: int = 8) -> list[dict]:
    """One search measurement's timing with the 30 ms warm-up and with 5 ms, alternated, on a GPU kept busy (as a
    lone measuring process keeps it): does the shorter warm-up change the median?"""
    from autotune.families.triton_moe import TritonMoe
    from autotune.measure.timing import time_gpu

    from autotune.contract.config import KernelConfig

    fam, out = TritonMoe(), []
    cfg = {"gate_up": KernelConfig.from_entry(UP), "down": KernelConfig.from_entry({**UP, "num_stages": 3})}
    for M in Ms:
        for g in ("gate_up", "down"):
            inputs = fam.make_inputs(problem, g, M)
            times = {30.0: [], 5.0: []}
            for r in range(rounds):
                for w in ((30.0, 5.0) if r % 2 == 0 else (5.0, 30.0)):
                    times[w].append(time_gpu(lambda i: fam.run(cfg[g], inputs, i), 10, repeats=7, warmup_ms=w).median_us)
            med = {w: statistics.median(v) for w, v in times.items()}
            out.append({"M": M, "gemm": g, "warmup_30ms_us": med[30.0], "warmup_5ms_us": med[5.0],
                        "spread_30ms": (max(times[30.0]) - min(times[30.0])) / med[30.0],
                        "ratio": med[5.0] / med[30.0]})
            print(f"warm-up A/B M={M:5d} {g:8s} 30 ms {med[30.0]:8.2f}  5 ms {med[5.0]:8.2f}  "
                  f"ratio {med[5.0] / med[30.0]:.4f}  spread(30) {out[-1]['spread_30ms']:.1%}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--Ms", default="1,2,4,8,64,1024")
    ap.add_argument("--out", default="layer_agreement.json")
    ap.add_argument("--write-disputed", metavar="DIR", help="only write the disputed pair (as it was written: no "
                    "num_warps/num_stages in down) for every batch size of the default list as this GPU's "
                    "SGLANG_MOE_CONFIG_DIR folder, for a one-batch decode against SGLang's shipped file")
    args = ap.parse_args()
    import torch

    from autotune.adapters import local_gpu
    from autotune.adapters.sglang_loader import in_context, sglang_context
    from autotune.families.triton_moe.layer_timing import LayerTimer, empty_folder, time_sides, write_side
    from autotune.problems.models import Problem

    device = local_gpu.detect()
    problem = Problem(512, 128, 4096, 10, "bf16")
    if args.write_disputed:
        from autotune.problems.models import DEFAULT_BATCH_SIZES
        out = Path(args.write_disputed)
        raw_side(out.parent, out.name, problem, device, DEFAULT_BATCH_SIZES, UP, DOWN)
        print(f"wrote the disputed pair for {device.name} at {len(DEFAULT_BATCH_SIZES)} batch sizes under {out}")
        return
    Ms = [int(m) for m in args.Ms.split(",")]
    timer = LayerTimer(problem, device)
    root = timer.scratch
    folders = {"shipped": None, "default": empty_folder(root),
               "disputed": raw_side(root, "disputed", problem, device, Ms, UP, DOWN),
               "disputed_stated": write_side(root, "disputed_stated", problem, device, {M: (UP, DOWN) for M in Ms}),
               "disputed_s4": write_side(root, "disputed_s4", problem, device,
                                         {M: (UP, {**DOWN, "num_warps": 4, "num_stages": 4}) for M in Ms})}
    rows = []
    t0 = time.time()
    with torch.no_grad():
        for M in Ms:
            timer.flush = "read"
            [tool] = time_sides(timer, folders, [M], repeats=3)
            timer.flush = "write"
            [tool_w] = time_sides(timer, folders, [M], repeats=3)
            pairs = {s: tuple(tool[f"{s} loads"]) for s in folders}
            own = sglang_own(timer, folders, M)
            own_w = sglang_own(timer, folders, M, flush=True)
            with in_context(sglang_context()):
                old = old_layer(problem, device, pairs, M)
                gemms = gemm_sum(problem, pairs, M)
            for s in folders:
                rows.append({"M": M, "pair": s, "loads": pairs[s], "tool_us": tool[f"{s} µs"],
                             "tool_spread": tool[f"{s} spread"], "tool_write_flush_us": tool_w[f"{s} µs"],
                             "sglang_us": own[s], "sglang_write_flush_us": own_w[s], "old_us": old[s],
                             "gemms_us": gemms[s], "error": tool[f"{s} error"],
                             "tool_vs_sglang": tool[f"{s} µs"] / own[s] - 1})
                r = rows[-1]
                print(f"M={M:5d} {s:16s} tool {r['tool_us']:8.2f} (±{r['tool_spread']:.1%}, write-flush "
                      f"{r['tool_write_flush_us']:.2f})  sglang {r['sglang_us']:8.2f} (write-flush "
                      f"{r['sglang_write_flush_us']:.2f})  tool/sglang {r['tool_vs_sglang']:+.1%}  old {r['old_us']:8.2f}  "
                      f"gemms {r['gemms_us']:8.2f}", flush=True)
    timer.close()
    with in_context(sglang_context()), torch.no_grad():
        warm = warmup_ab(problem)
    doc = {"gpu": device.name, "versions": device.versions, "problem": problem.key, "seconds": round(time.time() - t0, 1),
           "date": time.strftime("%Y-%m-%d"), "rows": rows, "warmup_ab": warm}
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    worst = max(abs(r["tool_vs_sglang"]) for r in rows)
    print(f"largest |tool/sglang - 1|: {worst:.1%} over {len(rows)} (M, pair) points; {doc['seconds']} s")


if __name__ == "__main__":
    main()
