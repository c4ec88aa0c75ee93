"""The command lines and environments of SGLang's server and benchmarks, and loopback ports."""
from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from autotune.validate import PortInUseError
from autotune.validate.sglang_inputs import ModelDir, TunedConfigs


SERVER_MODULE = "sglang.launch_server"
SERVING_MODULE = "sglang.benchmark.serving"
ONE_BATCH_MODULE = "sglang.benchmark.one_batch_server"
LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port the kernel just handed out on `host` (free now; we start at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((host, port)) == 0:        # something answers
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as servers (uvicorn) set it: connections in TIME_WAIT do not block the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))                   # bound but not listening counts too
        except OSError:
            return True
    return False


def check_port_free(port: int, host: str = LOOPBACK) -> None:
    if not 0 < port < 65536:
        raise PortInUseError(f"port {port} is not a valid TCP port")
    if port_in_use(port, host):
        raise PortInUseError(f"port {port} on {host} is in use: stop what holds it or leave --port out "
                             "(a free loopback port is chosen)")


# --- command lines ----------------------------------------------------------------------------

def server_command(model: ModelDir, port: int, *, tp: int = 1, config_yaml: Path | None = None,
                   extra_args: tuple[str, ...] = (), host: str = LOOPBACK,
                   python: str = sys.executable) -> list[str]:
    """`python -m sglang.launch_server` for one side. Both sides get the same arguments except
    `--config` (the tuned side's server_args.yaml)."""
    cmd = [python, "-m", SERVER_MODULE, "--model-path", str(model.path), "--host", host, "--port", str(port),
           "--tp-size", str(tp)]
    if model.load_format:
        cmd += ["--load-format", model.load_format]
    if config_yaml is not None:
        cmd += ["--config", str(config_yaml)]
    return cmd + list(extra_args)


def compile_cache_env(base_env: dict | None = None) -> dict[str, str]:
    """The compile-cache locations SGLang would derive from the user's SGLANG_CACHE_DIR, pinned, so
    that giving each server its own SGLANG_CACHE_DIR does not make it recompile everything.
    Values already set in the environment are kept."""
    env = dict(os.environ if base_env is None else base_env)
    base = os.path.expanduser(env.get("SGLANG_CACHE_DIR") or "~/.cache/sglang")
    saved = os.environ.get("SGLANG_CACHE_DIR")
    try:
        os.environ["SGLANG_CACHE_DIR"] = base
        from autotune.adapters.sglang_server import compile_cache_defaults
        pinned = compile_cache_defaults()
    finally:
        if saved is None:
            os.environ.pop("SGLANG_CACHE_DIR", None)
        else:
            os.environ["SGLANG_CACHE_DIR"] = saved
    pinned["SGLANG_JIT_CACHE_DIR"] = os.path.join(base, "jit")
    return {k: env.get(k) or v for k, v in pinned.items()}


def server_env(side: str, configs: TunedConfigs | None, cache_dir: Path,
               base_env: dict | None = None) -> dict[str, str | None]:
    """Environment overrides for one server start (None = removed from the environment).
    `cache_dir` becomes this start's SGLANG_CACHE_DIR; for the tuned side the FlashInfer
    autotuner cache is copied into it first (by `prepare_cache_dir`)."""
    env: dict[str, str | None] = dict(compile_cache_env(base_env))
    env["SGLANG_CACHE_DIR"] = str(cache_dir)
    if side == "baseline":
        env["SGLANG_MOE_CONFIG_DIR"] = None
    elif side == "tuned":
        env["SGLANG_MOE_CONFIG_DIR"] = str(configs.moe_config_dir) if configs and configs.moe_config_dir else None
    else:
        raise ValueError(f"side must be baseline or tuned, not {side!r}")
    return env


def prepare_cache_dir(side: str, configs: TunedConfigs | None, cache_dir: Path) -> None:
    """A fresh SGLANG_CACHE_DIR: empty for the baseline, the tuned FlashInfer cache for the tuned
    side (copied: the server saves its own tactics back into it after warm-up)."""
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
    cache_dir.mkdir(parents=True)
    if side == "tuned" and configs and configs.flashinfer_cache:
        shutil.copytree(configs.flashinfer_cache / "flashinfer", cache_dir / "flashinfer")


@dataclass(frozen=True)
class BenchClient:
    """What every benchmark command against one server shares: the server's URL, the model folder
    (its tokenizer), the prompt and output lengths in tokens, and the interpreter that has SGLang."""
    base_url: str
    model: ModelDir
    input_len: int
    output_len: int
    python: str = sys.executable


def serving_command(client: BenchClient, concurrency: int, *, num_prompts: int, warmup_requests: int,
                    output_file: Path, seed: int = 1) -> list[str]:
    """`python -m sglang.benchmark.serving`: fixed-length random token ids, at most `concurrency`
    requests in flight, all sent at once (request rate inf), radix cache flushed first."""
    model = client.model
    return [client.python, "-m", SERVING_MODULE, "--backend", "sglang", "--base-url", client.base_url,
            "--model", str(model.path), "--tokenizer", str(model.path),
            "--dataset-name", "random-ids", "--random-input-len", str(client.input_len),
            "--random-output-len", str(client.output_len), "--random-range-ratio", "1.0", "--tokenize-prompt",
            "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
            "--warmup-requests", str(warmup_requests), "--flush-cache", "--seed", str(seed),
            "--output-file", str(output_file), "--disable-tqdm", "--ready-check-timeout-sec", "0"]


def one_batch_command(client: BenchClient, *, result_file: Path, run_name: str, batch_size: int = 1) -> list[str]:
    """`python -m sglang.benchmark.one_batch_server` against the running server: one batch of
    `batch_size` requests (1 = single-request decode), random token ids, its own warm-up."""
    return [client.python, "-m", ONE_BATCH_MODULE, "--model-path", str(client.model.path),
            "--base-url", client.base_url, "--batch-size", str(batch_size), "--input-len", str(client.input_len),
            "--output-len", str(client.output_len), "--dataset-name", "random-ids", "--run-name", run_name,
            "--result-filename", str(result_file), "--no-append-to-github-summary"]
