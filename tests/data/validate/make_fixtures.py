"""Generate the SGLang 0.5.23-format benchmark result fixtures with SGLang's own code paths.

No public repository we could find holds result files of the current formats (0.5.23 writes
`max_concurrency`, TPOT/ITL percentiles, `server_info`, `concurrency`, ...; one_batch_server's
`BenchOneCaseResult` line). So these lines come from SGLang's own result-writing code, executed
from the installed modules' source text (they do not import on a CPU machine), on synthetic
request timings:

- serving: SGLang's `calculate_metrics` turns synthetic `RequestFuncOutput`s into its
  `BenchmarkMetrics`; the `result = {...}` dict literal of `benchmark()` is evaluated on them
  and written as `json.dumps(result) + "\\n"`, the way `benchmark()` appends it.
- one_batch_server: SGLang's `BenchOneCaseResult(...).dump_to_jsonl(path)`.

The numbers are synthetic (the timings below), the layout is SGLang's. Run from the repo root:
    .venv/bin/python tests/data/validate/make_fixtures.py
"""
from __future__ import annotations

import ast
import importlib.util
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from autotune.validate.sglang_commands import ONE_BATCH_MODULE, SERVING_MODULE  # noqa: E402
from autotune.validate.sglang_parsers import load_from_source  # noqa: E402


class _WordTokenizer:
    """Synthetic stand-in for the retokenization count only (one token per word)."""

    def encode(self, text, add_special_tokens=False):
        return text.split()


def _result_dict_node():
    src = Path(importlib.util.find_spec(SERVING_MODULE).origin).read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "benchmark":
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Dict)
                        and any(isinstance(t, ast.Name) and t.id == "result" for t in sub.targets)):
                    return sub.value
    raise RuntimeError("benchmark()'s result dict not found in " + SERVING_MODULE)


def serving_line(*, concurrency: int, num_prompts: int, input_len: int, output_len: int, itl_s: float,
                 ttft_s: float, seed: int = 0) -> str:
    """One result line as sglang.benchmark.serving 0.5.23 appends it (synthetic timings)."""
    ns = load_from_source(SERVING_MODULE, "calculate_metrics").namespace
    rfo = load_from_source(SERVING_MODULE, "RequestFuncOutput").namespace["RequestFuncOutput"]
    rng = random.Random(seed)
    outputs, inputs, t = [], [], 0.0
    for i in range(num_prompts):
        start = (i // concurrency) * (ttft_s + itl_s * (output_len - 1)) * 1.02
        itl = [itl_s * rng.uniform(0.95, 1.08) for _ in range(output_len - 1)]
        ttft = ttft_s * rng.uniform(0.9, 1.3)
        outputs.append(rfo(generated_text=" ".join(["tok"] * output_len), success=True, latency=ttft + sum(itl),
                           ttft=ttft, itl=itl, prompt_len=input_len, output_len=output_len, start_time=start))
        inputs.append(SimpleNamespace(prompt_len=input_len, text_prompt_len=input_len, vision_prompt_len=0))
        t = max(t, start + ttft + sum(itl))
    metrics, _ = ns["calculate_metrics"](inputs, outputs, t, _WordTokenizer(), "sglang")
    args = SimpleNamespace(tag=None, backend="sglang", dataset_name="random-ids", sharegpt_output_len=None,
                           random_input_len=input_len, random_output_len=output_len, random_range_ratio=1.0)
    env = {"args": args, "use_trace_timestamps": False, "request_rate": float("inf"),
           "max_concurrency": concurrency, "server_info": {"version": "0.5.23", "tp_size": 8},
           "benchmark_duration": t, "metrics": metrics, "accept_length": None}
    expr = ast.fix_missing_locations(ast.Expression(_result_dict_node()))
    result = eval(compile(expr, "serving.py:benchmark.result", "eval"), env)
    return json.dumps(result) + "\n"


def write_one_batch(path: Path, **fields) -> None:
    cls = load_from_source(ONE_BATCH_MODULE, "BenchOneCaseResult").namespace["BenchOneCaseResult"]
    cls(**fields).dump_to_jsonl(str(path))


def main() -> None:
    serving = HERE / "sglang_serving_0.5.23_generated.jsonl"
    serving.write_text(serving_line(concurrency=8, num_prompts=32, input_len=1024, output_len=64,
                                    itl_s=0.012, ttft_s=0.09, seed=1)
                       + serving_line(concurrency=32, num_prompts=128, input_len=1024, output_len=64,
                                      itl_s=0.019, ttft_s=0.31, seed=2))
    one = HERE / "sglang_one_batch_0.5.23_generated.jsonl"
    one.unlink(missing_ok=True)
    write_one_batch(one, run_name="baseline-r0", batch_size=1, input_len=1024, output_len=256, latency=3.3712,
                    input_throughput=12190.5, output_throughput=77.91, overall_throughput=379.6, last_ttft=0.084,
                    last_gen_throughput=78.4, acc_length=-1, total_output_tokens=256, num_early_stopped=None,
                    steady_state_output_throughput=None, steady_state_window_s=None, cache_hit_rate=0.0)
    print(f"wrote {serving} and {one}")


if __name__ == "__main__":
    main()
