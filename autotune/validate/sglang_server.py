"""The real path: SGLang's server and SGLang's own benchmarks, baseline vs tuned.

Per repeat the server is started once with SGLang's defaults (baseline) and once with the tuned
files (tuned), in alternating order (ABBA: drift over time cancels in the pairs):

- baseline: `python -m sglang.launch_server --model-path DIR ...`, SGLANG_MOE_CONFIG_DIR removed
  from the environment (SGLang reads its built-in config folder), no `--config`;
- tuned: the same command plus `--config tuned_configs/<device>/server_args.yaml` when the file
  exists, SGLANG_MOE_CONFIG_DIR=tuned_configs/<device> (SGLang looks for
  `configs/triton_<ver>/<file>` under it), and an SGLANG_CACHE_DIR holding a copy of the
  FlashInfer autotuner cache when the tuned folder has one (`flashinfer/autotune/...` under the
  folder or under its `sglang_cache/`).

Each start gets a fresh SGLANG_CACHE_DIR (empty for the baseline, the copied FlashInfer cache for
the tuned side) so that neither side sees tactics the other or an earlier start saved; the
compile caches under it (Triton, inductor, CUDA, FlashInfer JIT, DeepGEMM, CuTe AOT) stay pinned
to the user's shared locations, so both sides start from the same compiled kernels.
`--load-format dummy` is added when the model folder holds no weight files (config + tokenizer
only): SGLang then fills random weights, which is all a kernel-speed comparison needs.

While a server is up: `sglang.benchmark.one_batch_server --base-url ... --batch-size 1`
(single-request decode) and `sglang.benchmark.serving --dataset-name random-ids` with fixed input
and output lengths (`--random-range-ratio 1 --tokenize-prompt`), one run per concurrency
(`--max-concurrency C`), warm-up requests, the radix cache flushed, results in JSON lines files
whose `output_throughput` and latencies are read back.

The command lines are checked against SGLang's own parsers before anything starts. On a machine
with the full SGLang the benchmark modules are imported; where they do not import (the CPU test
environment: `sglang.benchmark.serving` pulls in `datasets` and, through
`sglang.srt.disaggregation.utils`, the quantization stack and `compressed_tensors`), their
parser-building function is executed from the installed module's source text (`sglang_parser`).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from autotune.validate import BenchmarkError
from autotune.validate.server_process import Lifecycle, ServerProcess, run_logged
from autotune.validate.sglang_commands import (
    LOOPBACK,
    ONE_BATCH_MODULE,
    BenchClient,
    check_port_free,
    free_port,
    one_batch_command,
    prepare_cache_dir,
    server_command,
    server_env,
    serving_command,
)
from autotune.validate.sglang_inputs import ModelDir, TunedConfigs
from autotune.validate.sglang_parsers import parse_command, sglang_parser


# Metrics read from sglang.benchmark.serving's result line (its `result` dict, SGLang 0.5.23).
SERVING_METRICS = ("output_throughput", "input_throughput", "request_throughput", "total_throughput",
                   "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
                   "p99_itl_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms", "concurrency",
                   "completed", "duration", "total_output_tokens", "max_concurrency",
                   "random_input_len", "random_output_len")
# ...and from one_batch_server's (BenchOneCaseResult.dump_to_jsonl).
ONE_BATCH_METRICS = ("output_throughput", "input_throughput", "overall_throughput", "latency",
                     "last_ttft", "last_gen_throughput", "batch_size", "input_len", "output_len",
                     "total_output_tokens")



# --- results ----------------------------------------------------------------------------------

def _last_json_line(path: Path, what: str) -> dict:
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError:
        raise BenchmarkError(f"{what} wrote no result file {path}") from None
    if not lines:
        raise BenchmarkError(f"{what} wrote an empty result file {path}")
    try:
        # Python's json reads SGLang's `"request_rate": Infinity` (not RFC 8259, but what it writes).
        rec = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise BenchmarkError(f"{what}: last line of {path} is not JSON: {e}") from None
    if not isinstance(rec, dict):
        raise BenchmarkError(f"{what}: last line of {path} is not a JSON object")
    return rec


def _pick(rec: dict, keys, path: Path, what: str) -> dict:
    out = {k: rec[k] for k in keys if k in rec}
    v = out.get("output_throughput")
    if not isinstance(v, (int, float)) or not v > 0 or v != v or v == float("inf"):
        raise BenchmarkError(f"{what}: {path} has no usable output_throughput ({v!r})")
    return out


def read_serving_result(path: str | Path, what: str = "sglang.benchmark.serving") -> dict:
    """The metrics of the last run appended to a serving result file (one JSON object a line)."""
    return _pick(_last_json_line(Path(path), what), SERVING_METRICS, Path(path), what)


def read_one_batch_result(path: str | Path, what: str = "sglang.benchmark.one_batch_server") -> dict:
    return _pick(_last_json_line(Path(path), what), ONE_BATCH_METRICS, Path(path), what)


# --- the runner ---------------------------------------------------------------------------------

def interleaved_order(repeats: int) -> list[tuple[int, str]]:
    """(repeat, side) in ABBA order: baseline, tuned / tuned, baseline / ..."""
    out = []
    for r in range(repeats):
        sides = ("baseline", "tuned") if r % 2 == 0 else ("tuned", "baseline")
        out += [(r, s) for s in sides]
    return out


@dataclass
class ServerValidation:
    model: ModelDir
    configs: TunedConfigs
    work_dir: Path
    concurrencies: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
    repeats: int = 3
    tp: int = 1
    input_len: int = 1024
    output_len: int = 256
    prompts_per_concurrency: int = 4
    min_prompts: int = 8
    warmup_requests: int = 4
    one_batch: bool = True
    extra_server_args: tuple[str, ...] = ()
    port: int | None = None
    health_timeout_s: float = 1800.0
    bench_timeout_s: float = 3600.0
    shutdown_grace_s: float = 30.0
    python: str = sys.executable
    seed: int = 1

    def num_prompts(self, c: int) -> int:
        return max(self.min_prompts, self.prompts_per_concurrency * c)

    def server_spec(self, side: str, repeat: int, port: int) -> tuple[list[str], dict, Path]:
        run_dir = self.work_dir / f"r{repeat}-{side}"
        cache = run_dir / "sglang_cache"
        cmd = server_command(self.model, port, tp=self.tp,
                             config_yaml=self.configs.server_args if side == "tuned" else None,
                             extra_args=self.extra_server_args, python=self.python)
        return cmd, server_env(side, self.configs, cache), run_dir

    def commands(self, side: str, repeat: int, port: int) -> list[list[str]]:
        """Every command of one server start (the server first), for the parser check and the record."""
        cmd, _, run_dir = self.server_spec(side, repeat, port)
        client = BenchClient(f"http://{LOOPBACK}:{port}", self.model, self.input_len, self.output_len, self.python)
        out = [cmd]
        if self.one_batch:
            out.append(one_batch_command(client, result_file=run_dir / "one_batch.jsonl", run_name=f"{side}-r{repeat}"))
        for c in self.concurrencies:
            out.append(serving_command(client, c, num_prompts=self.num_prompts(c), warmup_requests=self.warmup_requests,
                                       output_file=run_dir / f"serving_c{c}.jsonl", seed=self.seed))
        return out

    def check_commands(self) -> dict[str, str]:
        """Every command line through SGLang's own parser, before anything starts; returns how
        each module's parser was obtained."""
        how = {}
        for side in ("baseline", "tuned"):
            for cmd in self.commands(side, 0, self.port or 30000):
                parse_command(cmd)
                how[cmd[2]] = sglang_parser(cmd[2]).how
        return how


def run_server_validation(v: ServerValidation, log=print) -> dict:
    """Start, measure, stop, for every (repeat, side) in ABBA order. Returns {"runs": [...],
    "servers": [...]}: one run per benchmark result, with the command and the metrics."""
    if v.port is not None:
        check_port_free(v.port)
    runs, servers = [], []
    for repeat, side in interleaved_order(v.repeats):
        port = v.port or free_port()
        cmds = v.commands(side, repeat, port)
        server_cmd, env, run_dir = v.server_spec(side, repeat, port)
        prepare_cache_dir(side, v.configs, Path(env["SGLANG_CACHE_DIR"]))
        log(f"[{side} r{repeat}] starting SGLang on port {port} ({'tuned files' if side == 'tuned' else 'SGLang defaults'})")
        srv = ServerProcess(server_cmd, port=port, env=env, log_path=run_dir / "server.log",
                            name=f"SGLang server ({side}, repeat {repeat})",
                            lifecycle=Lifecycle(v.health_timeout_s, shutdown_grace_s=v.shutdown_grace_s))
        with srv:
            log(f"[{side} r{repeat}] healthy after {srv.healthy_after_s:.0f} s")
            servers.append({"side": side, "repeat": repeat, "command": server_cmd,
                            "env": {k: v_ for k, v_ in env.items() if k.startswith("SGLANG_MOE") or k == "SGLANG_CACHE_DIR"},
                            "healthy_after_s": round(srv.healthy_after_s, 1), "log": str(run_dir / "server.log")})
            for cmd in cmds[1:]:
                module = cmd[2]
                if module == ONE_BATCH_MODULE:
                    result = Path(cmd[cmd.index("--result-filename") + 1])
                    what = f"one_batch_server ({side}, repeat {repeat})"
                    wall = run_logged(cmd, log_path=run_dir / "one_batch.log", timeout_s=v.bench_timeout_s, what=what)
                    metrics = read_one_batch_result(result, what)
                    kind, x = "one_batch", int(metrics.get("batch_size", 1))
                else:
                    c = int(cmd[cmd.index("--max-concurrency") + 1])
                    result = Path(cmd[cmd.index("--output-file") + 1])
                    what = f"serving at concurrency {c} ({side}, repeat {repeat})"
                    wall = run_logged(cmd, log_path=run_dir / f"serving_c{c}.log", timeout_s=v.bench_timeout_s,
                                      what=what)
                    metrics = read_serving_result(result, what)
                    kind, x = "serving", c
                runs.append({"side": side, "repeat": repeat, "kind": kind, "x": x, "metrics": metrics,
                             "command": cmd, "result_file": str(result), "wall_s": round(wall, 1)})
                log(f"[{side} r{repeat}] {kind} {'concurrency' if kind == 'serving' else 'batch'} {x}: "
                    f"{metrics['output_throughput']:.1f} output tok/s")
    return {"runs": runs, "servers": servers}


