#!/usr/bin/env python3
"""Every MoE runner / FP4 GEMM backend SGLang offers, launched through SGLang's own layers
(autotune/adapters/sglang_layer.py) on this GPU, one fresh process per (experts, backend): what
happens (refused by SGLang, unavailable, crash with its signal, NaN share, error vs the float32
reference) and, where correct, the CUDA-graph time per call. A quick look before a full
`autotune run`; the run itself does the same through its workers.

  python benchmarks/sglang_layer_probe.py [--out FILE] [--M 1,64] [--cases moe:nvfp4:marlin,...]
"""
import argparse, json, os, subprocess, sys, time

MOE = {"bf16": ["triton", "flashinfer_cutlass"], "fp8_w8a8_block": ["triton", "flashinfer_cutlass", "deep_gemm"],
       "nvfp4": ["flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutedsl",
                 "marlin", "triton", "cutlass", "auto"]}
FP4 = ["flashinfer_cutlass", "flashinfer_cudnn", "flashinfer_trtllm", "flashinfer_cutedsl", "marlin", "auto"]
SHAPE = dict(E=512, N=128, K=4096, top_k=10)        # Qwen3.5-397B-A17B at TP8, one rank


def one(case: str, Ms: list) -> dict:
    import torch

    from autotune.adapters import moe_checkpoint as ck
    from autotune.adapters import sglang_layer as L
    from autotune.measure.timing import check_output, time_gpu
    from autotune.problems.models import Problem
    from autotune.numerics import nvfp4

    kind, dtype, backend = case.split(":")
    out = {"case": case}
    stage = "build"
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        if kind == "moe":
            p = Problem(dtype=dtype, **SHAPE)
            shards = ck.make_shards(p)
            block = L.MoeBlock(p, backend)
            out["sglang_runs"] = block.runner_backend
            stage = "load"
            block.load(shards)
            for M in Ms:
                stage = f"M={M}"
                xs = [torch.randn(M, p.K, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4)]
                logits = [torch.randn(M, p.E, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4)]
                ids, w = ck.renormalized_topk(logits[0], p.top_k)
                ok, why, err = check_output(block(xs[0], logits[0]), ck.reference(xs[0], ids, w, shards.dequant13, shards.dequant2, p.N), 0.3 if dtype == "nvfp4" else 0.08)
                r = {"ok": ok, "why": why, "err": err}
                if ok:
                    t = time_gpu(lambda i: block(xs[i], logits[i]), 4)
                    r.update(us=t.median_us, spread=t.spread)
                out[M] = r
        else:
            N, K = 4096, 4096
            w = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).to(torch.bfloat16).float()
            gs = nvfp4.global_scale(w)
            q, sf = nvfp4.quantize(w, gs, swizzle=False)
            wt = {"weight": q, "weight_scale": sf, "weight_scale_2": (1 / gs).reshape(()).float(),
                  "input_scale": torch.tensor(8 / 2688, device="cuda")}
            lin = L.Fp4Linear(N, K, backend)
            stage = "load"
            lin.load(wt)
            ref_w = nvfp4.dequantize(q, sf, gs, N, K, swizzled=False)
            for M in Ms:
                stage = f"M={M}"
                xs = [torch.randn(M, K, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4)]
                ok, why, err = check_output(lin(xs[0]), xs[0].float() @ ref_w.T, 0.3)
                r = {"ok": ok, "why": why, "err": err}
                if ok:
                    t = time_gpu(lambda i: lin(xs[i]), 4)
                    r.update(us=t.median_us, spread=t.spread)
                out[M] = r
    except Exception as e:
        out["failed"] = f"{stage}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--M", default="1,64")
    ap.add_argument("--cases")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--one")
    ap.add_argument("--logs", help="folder for each case's stderr")
    a = ap.parse_args()
    Ms = [int(m) for m in a.M.split(",")]
    if a.one:
        import faulthandler
        faulthandler.dump_traceback_later(max(a.timeout - 10, 5), repeat=True)   # where a hang sits
        print("RESULT " + json.dumps(one(a.one, Ms)), flush=True)
        return
    cases = a.cases.split(",") if a.cases else \
        [f"moe:{d}:{b}" for d, bs in MOE.items() for b in bs] + [f"fp4:nvfp4:{b}" for b in FP4]
    rows = []
    for c in cases:
        t0 = time.time()
        try:
            log = open(os.path.join(a.logs, c.replace(":", "_") + ".log"), "w+") if a.logs else subprocess.PIPE
            p = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--one", c, "--M", a.M,
                                "--timeout", str(a.timeout)],
                               stdout=subprocess.PIPE, stderr=log, text=True, timeout=a.timeout)
            res = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            row = res[0] if res else {"case": c, "failed": f"process exit {p.returncode}"}
        except subprocess.TimeoutExpired:
            row = {"case": c, "failed": f"hang: killed after {a.timeout}s"}
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
