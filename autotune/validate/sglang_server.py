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

import argparse
import ast
import atexit
import builtins
import importlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import BenchmarkError, CommandError, ConfigDirError, ModelDirError, PortInUseError, ServerError

SERVER_MODULE = "sglang.launch_server"
SERVING_MODULE = "sglang.benchmark.serving"
ONE_BATCH_MODULE = "sglang.benchmark.one_batch_server"
LOOPBACK = "127.0.0.1"

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".npz")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "merges.txt", "spiece.model", "vocab.txt", "tiktoken.model", "qwen.tiktoken")

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


# --- inputs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelDir:
    path: Path
    weight_files: tuple[str, ...]
    tokenizer_files: tuple[str, ...]

    @property
    def load_format(self) -> str | None:
        """`dummy` when the folder has a config and a tokenizer but no weights."""
        return None if self.weight_files else "dummy"


def inspect_model_dir(path: str | Path) -> ModelDir:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelDirError(f"model folder {p} does not exist (or is not a folder)")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ModelDirError(f"model folder {p} has no config.json: SGLang cannot serve it")
    try:
        json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelDirError(f"{cfg} is not valid JSON: {e}") from None
    names = sorted(f.name for f in p.iterdir() if f.is_file())
    weights = tuple(n for n in names if n.endswith(WEIGHT_SUFFIXES) or n in WEIGHT_INDEXES)
    toks = tuple(n for n in names if n in TOKENIZER_FILES)
    if not toks:
        raise ModelDirError(f"model folder {p} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): "
                            "the server and the benchmark client both need one")
    return ModelDir(p.resolve(), weights, toks)


@dataclass(frozen=True)
class TunedConfigs:
    root: Path
    moe_files: tuple[str, ...]          # configs/triton_<ver>/<SGLang file name>, relative to root
    server_args: Path | None            # server_args.yaml
    flashinfer_cache: Path | None       # a folder laid out as SGLANG_CACHE_DIR (holds flashinfer/autotune)
    provenance: Path | None

    @property
    def moe_config_dir(self) -> Path | None:
        return self.root if self.moe_files else None

    def describe(self) -> str:
        parts = [f"{len(self.moe_files)} fused-MoE config file(s)" if self.moe_files else "no fused-MoE configs"]
        parts.append("server_args.yaml" if self.server_args else "no server_args.yaml")
        parts.append("a FlashInfer cache" if self.flashinfer_cache else "no FlashInfer cache")
        return ", ".join(parts)


def inspect_configs(path: str | Path) -> TunedConfigs:
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ConfigDirError(f"tuned configs folder {root} does not exist")
    root = root.resolve()
    moe = tuple(sorted(str(f.relative_to(root)) for f in root.glob("configs/triton_*/*.json")))
    yaml_path = root / "server_args.yaml"
    fi = None
    for cand in (root, root / "sglang_cache"):
        if (cand / "flashinfer" / "autotune").is_dir():
            fi = cand
            break
    prov = root / "provenance.json"
    out = TunedConfigs(root, moe, yaml_path if yaml_path.is_file() else None, fi,
                       prov if prov.is_file() else None)
    if not (out.moe_files or out.server_args or out.flashinfer_cache):
        raise ConfigDirError(f"{root} holds nothing SGLang would load (no configs/triton_*/*.json, "
                             "no server_args.yaml, no flashinfer/autotune cache)")
    return out


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
        from sglang.srt.environ import envs, third_party_cache_defaults
        pinned = dict(third_party_cache_defaults())
        pinned["SGLANG_DG_CACHE_DIR"] = envs.SGLANG_DG_CACHE_DIR.get()
        pinned["SGLANG_CUTE_AOT_CACHE_DIR"] = envs.SGLANG_CUTE_AOT_CACHE_DIR.get()
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


def serving_command(base_url: str, model: ModelDir, concurrency: int, *, input_len: int, output_len: int,
                    num_prompts: int, warmup_requests: int, output_file: Path, seed: int = 1,
                    python: str = sys.executable) -> list[str]:
    """`python -m sglang.benchmark.serving`: fixed-length random token ids, at most `concurrency`
    requests in flight, all sent at once (request rate inf), radix cache flushed first."""
    return [python, "-m", SERVING_MODULE, "--backend", "sglang", "--base-url", base_url,
            "--model", str(model.path), "--tokenizer", str(model.path),
            "--dataset-name", "random-ids", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "1.0", "--tokenize-prompt",
            "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
            "--warmup-requests", str(warmup_requests), "--flush-cache", "--seed", str(seed),
            "--output-file", str(output_file), "--disable-tqdm", "--ready-check-timeout-sec", "0"]


def one_batch_command(base_url: str, model: ModelDir, *, input_len: int, output_len: int, result_file: Path,
                      run_name: str, batch_size: int = 1, python: str = sys.executable) -> list[str]:
    """`python -m sglang.benchmark.one_batch_server` against the running server: one batch of
    `batch_size` requests (1 = single-request decode), random token ids, its own warm-up."""
    return [python, "-m", ONE_BATCH_MODULE, "--model-path", str(model.path), "--base-url", base_url,
            "--batch-size", str(batch_size), "--input-len", str(input_len), "--output-len", str(output_len),
            "--dataset-name", "random-ids", "--run-name", run_name, "--result-filename", str(result_file),
            "--no-append-to-github-summary"]


# --- SGLang's own parsers ---------------------------------------------------------------------

class _Captured(Exception):
    def __init__(self, parser, argv):
        super().__init__("parser captured")
        self.parser, self.argv = parser, argv


def _capture_parser(entry, *args):
    """Run an SGLang CLI entry point until it calls `parse_args`; return (parser, argv it passed)."""
    real = argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):
        raise _Captured(self, args)

    argparse.ArgumentParser.parse_args = capture
    try:
        entry(*args)
    except _Captured as c:
        return c.parser, c.argv
    finally:
        argparse.ArgumentParser.parse_args = real
    raise CommandError(f"{entry!r} returned without parsing arguments")


@dataclass
class SourceNamespace:
    """Definitions of a module executed from its source text (names it could not define are
    placeholders, listed in `missing`)."""
    namespace: dict
    missing: list = field(default_factory=list)


class _Missing:
    def __init__(self, name, why=""):
        self.name, self.why = name, why

    def __repr__(self):
        return f"<not loaded from source: {self.name}{': ' + self.why if self.why else ''}>"


def _names(nodes) -> set[str]:
    out = set()
    for n in nodes:
        if n is None:
            continue
        for sub in ast.walk(n):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                out.add(sub.id)
    return out


def _definition_names(node) -> set[str]:
    """Names a top-level statement evaluates when it is executed (function annotations excluded:
    the statements are compiled with postponed annotations; class field annotations included)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return _names(node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d])
    if isinstance(node, ast.ClassDef):
        out = _names(node.bases + [k.value for k in node.keywords] + node.decorator_list)
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out |= _definition_names(stmt)
            elif isinstance(stmt, ast.AnnAssign):
                # field annotations too: pydantic resolves them in the module's namespace
                out |= _names([stmt.value, stmt.annotation])
            else:
                out |= _names([stmt])
        return out
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return _names([node.value])
    return set()


def _body_names(node) -> set[str]:
    """Global names a function (or a class's methods) reads when called: names read in the body
    that the body does not bind itself (arguments, assignments, loop and comprehension targets)."""
    funcs = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        funcs = [node]
    elif isinstance(node, ast.ClassDef):
        funcs = [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    out = set()
    for f in funcs:
        local = {a.arg for a in ast.walk(f.args) if isinstance(a, ast.arg)}
        for sub in ast.walk(f):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                local.add(sub.id)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                local |= {a.asname or a.name.split(".")[0] for a in sub.names}
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                local.add(sub.name)
        out |= _names(f.body) - local
    return out


def load_from_source(module_name: str, entry: str) -> SourceNamespace:
    """Execute `entry` (a function of `module_name`) and what it needs from the module's source
    text: the definitions it reads when called, and, one level down, what the functions and
    classes it names read; imports are performed one name at a time. Everything is the
    installed module's own code; nothing is copied. A name whose definition cannot be executed
    (an import that fails here) becomes a placeholder listed in `missing`."""
    import __future__

    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin:
        raise CommandError(f"{module_name} is not installed")
    source = Path(spec.origin).read_text()
    tree = ast.parse(source)
    defs: dict[str, ast.stmt] = {}

    def collect(stmts):
        for node in stmts:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs.setdefault(node.name, node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        defs.setdefault(t.id, node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                defs.setdefault(node.target.id, node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    one = (ast.Import(names=[alias]) if isinstance(node, ast.Import)
                           else ast.ImportFrom(module=node.module, names=[alias], level=node.level))
                    defs.setdefault(name, ast.copy_location(one, node))
            elif isinstance(node, ast.Try):
                collect(node.body)
            elif isinstance(node, ast.If) and not _is_main_guard(node):
                collect(node.body)

    collect(tree.body)
    # A real module object (dataclasses and pydantic look classes' modules up in sys.modules),
    # under a private name so the failed import of the real module is not shadowed.
    import types
    mod_name = "_autotune_sglang_source." + module_name
    module = types.ModuleType(mod_name)
    module.__file__ = spec.origin
    sys.modules[mod_name] = module
    ns = module.__dict__
    out = SourceNamespace(ns)
    busy: set[str] = set()
    flags = __future__.annotations.compiler_flag

    def resolve(name: str, deep: bool) -> None:
        if name in ns or name in busy or (name not in defs and hasattr(builtins, name)):
            return
        node = defs.get(name)
        if node is None:
            ns[name] = _Missing(name)
            out.missing.append(name)
            return
        busy.add(name)
        try:
            for n in _definition_names(node) | (_body_names(node) if deep else set()):
                resolve(n, False)
            tree1 = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
            exec(compile(tree1, spec.origin, "exec", flags=flags, dont_inherit=True), ns)
        except Exception as e:              # an import this machine lacks, mostly
            ns[name] = _Missing(name, f"{type(e).__name__}: {e}")
            out.missing.append(name)
        finally:
            busy.discard(name)

    entry_node = defs.get(entry)
    if entry_node is None:
        raise CommandError(f"{module_name} has no {entry}() in {spec.origin}")
    for n in _body_names(entry_node):
        node = defs.get(n)
        resolve(n, isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    resolve(entry, False)
    return out


def _is_main_guard(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__")


@dataclass
class SglangParser:
    module: str
    parser: argparse.ArgumentParser
    how: str                        # "imported" or "source text of <file> (<why the import failed>)"
    transform: object = None        # argv -> argv SGLang applies before parsing (--config merge)

    def parse(self, argv: list[str]) -> argparse.Namespace:
        if self.transform:
            argv = self.transform(list(argv))
        saved = sys.stderr
        import io
        err = io.StringIO()
        sys.stderr = err
        try:
            return self.parser.parse_args(argv)
        except SystemExit:
            raise CommandError(f"SGLang's parser for {self.module} refuses {shlex.join(argv)}: "
                               + err.getvalue().strip().splitlines()[-1]) from None
        finally:
            sys.stderr = saved


_PARSERS: dict[str, SglangParser] = {}


def sglang_parser(module: str) -> SglangParser:
    """SGLang's own argument parser of `module` (launch_server, benchmark.serving,
    benchmark.one_batch_server), built by SGLang's code: imported where the module imports,
    else its CLI function executed from the installed source text."""
    if module in _PARSERS:
        return _PARSERS[module]
    if module == SERVER_MODULE:
        from sglang.srt.server_args import prepare_server_args

        def transform(argv):
            return _capture_parser(prepare_server_args, argv)[1]

        parser, _ = _capture_parser(prepare_server_args, ["--model-path", "x"])
        sp = SglangParser(module, parser, "imported (sglang.srt.server_args.prepare_server_args)", transform)
    elif module in (SERVING_MODULE, ONE_BATCH_MODULE):
        try:
            mod = importlib.import_module(module)
            parser, _ = _capture_parser(mod.cli_main)
            sp = SglangParser(module, parser, "imported")
        except ImportError as e:
            src = load_from_source(module, "cli_main")
            entry = src.namespace.get("cli_main")
            if not callable(entry):
                raise CommandError(f"cannot build {module}'s parser from its source: {entry!r}") from None
            try:
                parser, _ = _capture_parser(entry)
            except CommandError:
                raise
            except Exception as e2:
                raise CommandError(f"cannot build {module}'s parser from its source: "
                                   f"{type(e2).__name__}: {e2}") from None
            origin = importlib.util.find_spec(module).origin
            sp = SglangParser(module, parser, f"source text of {origin} (the module does not import here: {e})")
    else:
        raise CommandError(f"no SGLang parser known for {module}")
    _PARSERS[module] = sp
    return sp


def parse_command(cmd: list[str]) -> argparse.Namespace:
    """Parse one of our command lines ([python, -m, module, args...]) with SGLang's parser."""
    if len(cmd) < 3 or cmd[1] != "-m":
        raise CommandError(f"not a `python -m module` command: {shlex.join(cmd)}")
    return sglang_parser(cmd[2]).parse(cmd[3:])


# --- processes --------------------------------------------------------------------------------

_LIVE: set = set()


def _stop_all() -> None:
    for p in list(_LIVE):
        p.stop()


atexit.register(_stop_all)


def _group_alive(pgid: int) -> bool:
    """Does any non-zombie process remain in process group `pgid`?"""
    proc = Path("/proc")
    if proc.is_dir():
        for d in proc.iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2:].split()
            if len(rest) > 2 and int(rest[2]) == pgid and rest[0] != "Z":
                return True
        return False
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after `grace_s`."""
    pgid = proc.pid              # started with start_new_session: its pid is the group id
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        if not _group_alive(pgid):
            break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    rows = text.rstrip("\n").splitlines()[-lines:]
    return "\n".join("    " + r for r in rows) if rows else "    (empty log)"


def _full_env(overrides: dict | None) -> dict:
    env = dict(os.environ)
    for k, v in (overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


class ServerProcess:
    """A server in its own process group: started, waited on until healthy, always shut down
    (SIGTERM to the group, SIGKILL after `shutdown_grace_s`), also on Ctrl-C and exceptions."""

    def __init__(self, argv: list[str], *, port: int, log_path: str | Path, env: dict | None = None,
                 host: str = LOOPBACK, health_path: str = "/health_generate", health_timeout_s: float = 1800.0,
                 poll_s: float = 2.0, shutdown_grace_s: float = 30.0, name: str = "SGLang server"):
        self.argv, self.port, self.host = list(argv), port, host
        self.log_path = Path(log_path)
        self.env = env
        self.health_path = health_path
        self.health_timeout_s, self.poll_s, self.shutdown_grace_s = health_timeout_s, poll_s, shutdown_grace_s
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.healthy_after_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        check_port_free(self.port, self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            log.write(("$ " + shlex.join(self.argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, env=_full_env(self.env), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        _LIVE.add(self)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + self.health_path, timeout=30) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self) -> float:
        t0 = time.monotonic()
        deadline = t0 + self.health_timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerError(f"{self.name} exited with code {rc} before it became healthy; "
                                  f"last lines of {self.log_path}:\n{_tail(self.log_path)}")
            if self._healthy():
                self.healthy_after_s = time.monotonic() - t0
                return self.healthy_after_s
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name} not healthy after {self.health_timeout_s:.0f} s "
                                  f"(GET {self.base_url}{self.health_path}); last lines of {self.log_path}:\n"
                                  f"{_tail(self.log_path)}")
            time.sleep(self.poll_s)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is not None:
            _kill_group(proc, self.shutdown_grace_s)

    def __enter__(self) -> "ServerProcess":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_logged(cmd: list[str], *, log_path: str | Path, timeout_s: float, what: str,
               env: dict | None = None) -> float:
    """Run a command in its own process group, output to `log_path`; returns wall seconds.
    Non-zero exit or time-out: BenchmarkError with the log tail; the group is killed on any
    exit path (time-out, Ctrl-C, exception)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(("$ " + shlex.join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, env=_full_env(env), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc, 10.0)
        raise BenchmarkError(f"{what} did not finish in {timeout_s:.0f} s; last lines of {log_path}:\n"
                             f"{_tail(log_path)}") from None
    except BaseException:
        _kill_group(proc, 10.0)
        raise
    if _group_alive(proc.pid):
        _kill_group(proc, 5.0)
    if rc != 0:
        raise BenchmarkError(f"{what} exited with code {rc}; last lines of {log_path}:\n{_tail(log_path)}")
    return time.monotonic() - t0


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
        url = f"http://{LOOPBACK}:{port}"
        out = [cmd]
        if self.one_batch:
            out.append(one_batch_command(url, self.model, input_len=self.input_len, output_len=self.output_len,
                                         result_file=run_dir / "one_batch.jsonl", run_name=f"{side}-r{repeat}",
                                         python=self.python))
        for c in self.concurrencies:
            out.append(serving_command(url, self.model, c, input_len=self.input_len, output_len=self.output_len,
                                       num_prompts=self.num_prompts(c), warmup_requests=self.warmup_requests,
                                       output_file=run_dir / f"serving_c{c}.jsonl", seed=self.seed,
                                       python=self.python))
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
                            health_timeout_s=v.health_timeout_s, shutdown_grace_s=v.shutdown_grace_s,
                            name=f"SGLang server ({side}, repeat {repeat})")
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


def parse_server_args(text: str | None) -> tuple[str, ...]:
    return tuple(shlex.split(text)) if text else ()


__all__ = [
    "ModelDir", "TunedConfigs", "inspect_model_dir", "inspect_configs", "free_port", "port_in_use",
    "check_port_free", "server_command", "server_env", "compile_cache_env", "prepare_cache_dir",
    "serving_command", "one_batch_command", "sglang_parser", "parse_command", "load_from_source",
    "ServerProcess", "run_logged", "read_serving_result", "read_one_batch_result", "interleaved_order",
    "ServerValidation", "run_server_validation", "parse_server_args",
]
