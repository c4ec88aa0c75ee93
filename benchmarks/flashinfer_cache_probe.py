"""Does FlashInfer serve the tactics `autotune run` pinned, and as fast as the run measured? A fresh process, on the GPU.

For every (FP8 GEMM shape, FlashInfer backend, M) whose best tactic the run pinned in
`flashinfer_autotune_cache.json` (the run's --json summary lists them), the same bmm_fp8 call
SGLang makes (the public `flashinfer.bmm_fp8(..., backend=...)`, outside tuning mode) is timed
(with --all, also every (shape, backend, M) the run kept at -1: `default` and `fi_auto` only):
  default   no cache loaded: FlashInfer's fallback, tactic -1
  pinned    after `AutoTuner.load_configs(cache)`: the tactic choose_one returns is recorded (it must
            be the pinned one, with no profiling and no cache miss)
  direct    the pinned tactic launched on FlashInfer's runner object, as the run's workers timed it
  fi_auto   FlashInfer's own autotuning (`with autotune(True)`: one call profiles every tactic at
            every bucket, as SGLang's start-up warm-up does), then its pick, outside tuning mode

The GPU's state is matched to the run's. On the H200 the first graph timing after another process
has run a kernel is ~0.35 µs per kernel launch faster than every later one (session 11:
benchmarks/timing_state_probe.py, docs/NOTES.md). The run's workers take each timing right after a
throwaway one of the same launch, the steady state of a process alone on its GPU (as one SGLang server
per GPU is); so does every arm here (`time_gpu(prime=True)`). `agrees`: pinned (a row kept at -1:
default) is within the noise of the run's time for that tactic (the larger spread, at least 1%).
Each timing is autotune's own (autotune.measure.timing.time_gpu: CUDA graph, L2 flushed), on the same
operands as the run's measurement (autotune.families.fp8_gemm).

usage: python benchmarks/flashinfer_cache_probe.py --summary run.json --cache DIR/flashinfer_autotune_cache.json
           [--all] [--out probe.json] [--routings 10]
       python benchmarks/flashinfer_cache_probe.py --table probe.json     (the rows as a markdown table)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def pinned_rows(summary: dict, every: bool = False) -> list[dict]:
    """(problem key, backend, M, tactic, the run's times) for every tactic other than -1 the run pinned
    (`every`: and every (problem, backend, M) it kept at -1)."""
    rows = []
    for entry in summary.get("fp8_gemm", []):
        for r in entry.get("tactics", []):
            if every or json.loads(r["tactic"]) != -1:
                rows.append({"problem": entry["problem"], **r})
    return rows


def problem_of(key: str):
    from autotune.problems.models import GemmProblem

    name, n, k, dtype = key.split(",")
    return GemmProblem(name, int(n.removeprefix("N=")), int(k.removeprefix("K=")), dtype)


class Spy:
    """What choose_one returned and how often FlashInfer profiled, observed without changing either."""

    def __init__(self):
        from flashinfer.autotuner import AutoTuner

        self.picks, self.profiled = [], 0
        choose, profile = AutoTuner.choose_one, AutoTuner._profile_single_kernel
        spy = self

        def choose_one(tuner, custom_op, runners, *a, **kw):
            runner, tactic = choose(tuner, custom_op, runners, *a, **kw)
            spy.picks.append((custom_op, type(runner).__name__, tactic, tuner.is_tuning_mode))
            return runner, tactic

        def profile_single_kernel(*a, **kw):
            spy.profiled += 1
            return profile(*a, **kw)
        AutoTuner.choose_one, AutoTuner._profile_single_kernel = choose_one, profile_single_kernel

    def reset(self):
        self.picks, self.profiled = [], 0


def table(rows: list[dict]) -> str:
    def us(r, k):
        return f"{r[f'{k} µs']:.2f}" if r.get(f"{k} µs") is not None else "-"
    out = ["| shape | backend | M | run: -1 µs | run: pick µs | pick | probe: default µs | probe: pinned µs "
           "| probe: direct µs | FlashInfer's own pick | its µs | pinned vs run | served from cache |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kept = r.get("pinned µs") is None           # a row the run kept at -1 (--all)
        diff = r["default µs" if kept else "pinned µs"] / r["tactic µs"] - 1
        served = "-" if kept else "yes" if r["served pinned"] else "NO"
        agrees = {True: "agrees", False: "DIFFERS"}.get(r.get("agrees"), "not judged")
        out.append(f"| {r['problem'].split(',')[0]} | {r['backend'].removeprefix('flashinfer_')} | {r['M']} | "
                   f"{r['-1 µs']:.2f} | {r['tactic µs']:.2f} | `{r['tactic']}` | {us(r, 'default')} | {us(r, 'pinned')} | "
                   f"{us(r, 'direct')} | `{', '.join(r['fi_auto tactic'])}` | {us(r, 'fi_auto')} | "
                   f"{diff:+.1%} ({agrees}) | {served} |")
    return "\n".join(out)


def main() -> int:
    if sys.argv[1:2] == ["--table"]:
        try:
            print(table(json.loads(Path(sys.argv[2]).read_text())))
        except (IndexError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"--table needs a probe.json this script wrote ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", required=True, help="`autotune run --json` output of the fp8_gemm run")
    ap.add_argument("--cache", required=True, help="the flashinfer_autotune_cache.json that run wrote")
    ap.add_argument("--out", default=None, help="write the rows here as JSON")
    ap.add_argument("--routings", type=int, default=10)
    ap.add_argument("--all", action="store_true", help="also time the rows the run kept at -1 (default, FlashInfer's own pick)")
    args = ap.parse_args()

    import torch
    from flashinfer.autotuner import AutoTuner, _tactic_to_json, autotune

    from autotune.families.fp8_gemm import Fp8Gemm
    from autotune.contract.runner import discover
    from autotune.measure.timing import noise, time_gpu

    try:
        rows = pinned_rows(json.loads(Path(args.summary).read_text()), every=args.all)
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        ap.error(f"{args.summary} is not an `autotune run --json` summary ({type(e).__name__})")
    if not Path(args.cache).is_file():
        ap.error(f"{args.cache}: no such file")
    if not rows:
        print(f"the summary lists no {'FlashInfer tactic row' if args.all else 'pinned tactic (other than -1)'}: "
              "nothing to probe", file=sys.stderr)
        return 1
    runners = {r.name: r for r in discover("autotune.families.fp8_gemm")}
    family, spy, tuner = Fp8Gemm(), Spy(), AutoTuner.get()
    out = []
    for row in rows:
        problem, M, runner = problem_of(row["problem"]), int(row["M"]), runners[row["backend"]]
        inputs = family.make_inputs(problem, "layer", M, routings=args.routings)

        def launch(i):
            return runner.run(inputs, i, -1)     # the public bmm_fp8 call, as SGLang makes it

        def launch_direct(i):
            return runner.run(inputs, i, json.loads(row["tactic"]))

        def timed(phase, fn=launch):
            spy.reset()
            t = time_gpu(fn, args.routings, repeats=21, prime=True)
            seen = sorted({json.dumps(_tactic_to_json(p[2])) for p in spy.picks if p[0] == runner.flashinfer_op})
            return {f"{phase} µs": t.median_us, f"{phase} spread": t.spread, f"{phase} tactic": seen,
                    f"{phase} profiled": spy.profiled, f"{phase} calls": t.calls}

        tuner.clear_cache()
        res = {**row, **timed("default")}
        pinned = json.loads(row["tactic"]) != -1
        if pinned:
            if not tuner.load_configs(args.cache):
                print(f"FlashInfer refused {args.cache} (metadata of another machine?)", file=sys.stderr)
                return 1
            misses = tuner.stats.cache_misses
            res.update(timed("pinned"))
            res["pinned misses"] = tuner.stats.cache_misses - misses
            direct = timed("direct", launch_direct)
            res.update({k: direct[k] for k in ("direct µs", "direct spread")})
            tuner.clear_cache()
        spy.reset()
        with autotune(True):
            launch(0)
        torch.cuda.synchronize()
        res["fi_auto profiled"] = spy.profiled
        res.update({k: v for k, v in timed("fi_auto").items() if k != "fi_auto profiled"})
        arm = "pinned" if pinned else "default"
        if pinned:
            res["served pinned"] = res["pinned tactic"] == [row["tactic"]] and res["pinned profiled"] == 0 \
                and res["pinned misses"] == 0
        res["agrees"] = abs(res[f"{arm} µs"] / row["tactic µs"] - 1) <= noise(row["spread"], res[f"{arm} spread"])
        out.append(res)
        print(json.dumps(res), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    pins = [r for r in out if "served pinned" in r]
    bad = [r for r in pins if not r["served pinned"]]
    print(f"{len(pins) - len(bad)} of {len(pins)} pinned tactics served from the cache without profiling")
    print(f"{sum(r['agrees'] for r in pins)} of {len(pins)} served at the run's time within the noise")
    if len(out) > len(pins):
        kept = [r for r in out if "served pinned" not in r]
        print(f"{sum(r['agrees'] for r in kept)} of {len(kept)} kept at -1 timed at the run's -1 time within the noise; "
              f"FlashInfer's own tuning picked other than -1 in {sum(r['fi_auto tactic'] != ['-1'] for r in kept)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
