"""SGLang's config loader as it behaves on a given device, and its answers remembered on disk.

Every answer comes from SGLang's own functions (`get_default_config`, `get_moe_configs`,
`try_get_optimal_moe_config`, `get_config_file_name`), run inside a "device view" that makes them
answer for the target GPU (its name, Triton version and shared memory) from the CPU.

Importing that loader costs 10-12 s of CPU (sglang/__init__ pulls in torch and transformers); a
replay run, a shared-study worker or an export needs a few dozen of its answers, the same ones
every time for one installed SGLang. They are kept in a memo file (`memo_path()`), keyed by all
they depend on: SGLang's version, install path and loader file; the device view; the problem
and M; and, for the file lookups, the names, sizes and mtimes of that device's files in the
config folder. A miss asks SGLang and stores the answer; an unreadable memo is started afresh.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path

from autotune.gpus.device import DeviceInfo
from autotune.fileio.writing import NotOurs, text_starting, write_json
from autotune.problems.models import Problem
from autotune.fileio.reading import load_json

_TRITON_UTILS = "sglang.srt.layers.moe.moe_runner.triton_utils"
_CONFIG_MODULE = f"{_TRITON_UTILS}.fused_moe_triton_config"
MEMO_MAX_ENTRIES = 20000     # a full Qwen3.5 plan at four TPs holds about a thousand


# --- SGLang's runtime context and a "device view" for its loader ------------------------------

@functools.lru_cache(maxsize=1)
def sglang_context():
    """SGLang's process config published from its default ServerArgs.

    SGLang's default-config and loader functions read `get_exec()` (deterministic mode, fused
    all-reduce), which raises until a context is published. Default ServerArgs, projected
    without model resolution, is the smallest honest context: the values a server started
    without those flags uses.
    """
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    ctx = rc.RuntimeContext(parallel=rc.ParallelContext())
    ctx.set_server_args(ServerArgs(model_path=tempfile.gettempdir()))
    return ctx


def in_context(ctx):
    """A `with` block in which SGLang's code reads `ctx` (from `sglang_context`) as its published context."""
    from sglang.srt import runtime_context as rc

    return rc.use_context(ctx)


def sglang_submodule(package: str, name: str, **package_attrs):
    """`package.name`, also where the package's __init__ cannot import.

    Some SGLang package __init__s import the AOT `sgl_kernel` wheel on CUDA for modules we never
    use (the lent H200 has no such wheel; it is 373 MB). There the package namespace is
    registered without running its __init__, carrying `package_attrs` (what the submodule reads
    from it), and the submodule, SGLang's own code, imports as usual.
    """
    import importlib
    import sys

    try:
        return importlib.import_module(f"{package}.{name}")
    except ImportError as e:
        if "sgl_kernel" not in str(e):
            raise
    spec = importlib.util.find_spec(package)
    pkg = importlib.util.module_from_spec(spec)
    for k, v in package_attrs.items():
        setattr(pkg, k, v)
    sys.modules[package] = pkg
    return importlib.import_module(f"{package}.{name}")


def triton_utils_module(name: str):
    """A submodule of SGLang's triton_utils package. Its __init__ imports fused_moe (sgl_kernel on
    CUDA); the one function the loader reads from the package, `get_config()` (the
    `override_config` context), answers "no override", as it does when none is active."""
    return sglang_submodule(_TRITON_UTILS, name, get_config=lambda: None)


def sglang_config_module():
    return triton_utils_module("fused_moe_triton_config")


def builtin_config_dir() -> str:
    """SGLang's own config folder: where its loader file lies (its default SGLANG_MOE_CONFIG_DIR)."""
    where = _loader_file()
    if where is not None:
        return os.path.dirname(os.path.realpath(where))
    return os.path.dirname(os.path.realpath(sglang_config_module().__file__))


# SGLang's loader file imports torch, triton and three names of SGLang's; its loader functions use
# none of them but those the device view replaces (the GPU's name, Triton's version, the shared
# memory) and SGLang's published context, of which they read only whether deterministic inference is
# on (off in the default ServerArgs `sglang_context` publishes). Run from its own source with those
# names answered so, it costs no import of SGLang (6-10 s of CPU: sglang/__init__ pulls in torch and
# transformers). Anything else it reaches raises, and the question is then asked of the loader
# SGLang's import gives (`loader_answer`): the light loader answers where both can, never otherwise.
_NOT_ANSWERED = ("sglang", "torch", "triton")


@functools.lru_cache(maxsize=1)
def light_config_module():
    """SGLang's installed loader file, executed from its source without importing SGLang or torch.
    ImportError where it cannot be: no SGLang here, a ROCm torch (the file's HIP branch), an
    import the file gained that is not answered here."""
    import builtins
    import importlib.metadata as md
    import types

    path = _loader_file()
    if path is None:
        raise ImportError("SGLang's loader file is not installed here")
    try:
        if "rocm" in md.version("torch"):
            raise ImportError("a ROCm build of torch: SGLang's loader takes its HIP branch")
        triton_version = md.version("triton")
    except md.PackageNotFoundError as e:
        raise ImportError(f"{e} is not installed") from None
    context = types.SimpleNamespace(deterministic=types.SimpleNamespace(enable_deterministic_inference=False))

    def no_view(*a, **k):
        raise RuntimeError("asked outside sglang_view")
    answered = {"torch": types.SimpleNamespace(), "triton": types.SimpleNamespace(__version__=triton_version),
                "sglang.srt.runtime_context": types.SimpleNamespace(get_exec=lambda: context),
                "sglang.srt.utils": types.SimpleNamespace(get_device_name=no_view, is_hip=lambda: False),
                _TRITON_UTILS: types.SimpleNamespace(get_config=lambda: None)}

    def light_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in answered:
            return answered[name]
        if level or name.partition(".")[0] in _NOT_ANSWERED:
            raise ImportError(f"{name}: not answered without importing SGLang")
        return builtins.__import__(name, globals, locals, fromlist, level)
    mod = types.ModuleType(_CONFIG_MODULE)
    mod.__file__ = path
    mod.__dict__["__builtins__"] = {**vars(builtins), "__import__": light_import}
    exec(compile(Path(path).read_text(), path, "exec"), mod.__dict__)
    return mod


@contextlib.contextmanager
def sglang_view(device: DeviceInfo, config_dir: str | None = None, light: bool = False):
    """Run SGLang's config functions as they behave on `device` (its name, Triton version and
    shared memory), reading configs from `config_dir` (default: SGLang's built-in folder); `light`:
    those of `light_config_module` (no SGLang imported).

    On the GPU itself the patches are no-ops; they let a replay or a planning run on the CPU
    answer "what would SGLang load on an H200 / RTX PRO 6000".
    """
    import logging
    import types

    mod = light_config_module() if light else sglang_config_module()
    log = logging.getLogger(mod.__name__)
    saved_level = log.level
    saved = {k: getattr(mod, k) for k in ("get_device_name", "triton", "_get_cuda_shared_memory_per_block_optin")}
    saved_env = os.environ.get("SGLANG_MOE_CONFIG_DIR")
    triton_version = device.versions.get("triton") or saved["triton"].__version__
    try:
        mod.get_device_name = lambda *a, **k: device.name
        mod.triton = types.SimpleNamespace(__version__=triton_version)
        mod._get_cuda_shared_memory_per_block_optin = lambda: device.smem_optin
        os.environ["SGLANG_MOE_CONFIG_DIR"] = config_dir or builtin_config_dir()
        mod.get_moe_configs.cache_clear()
        # Its "config file not found, using default" warning is the expected answer here.
        log.setLevel(logging.ERROR)
        if light:
            yield mod
        else:
            from sglang.srt import runtime_context as rc

            with rc.use_context(sglang_context()):
                yield mod
    finally:
        log.setLevel(saved_level)
        for k, v in saved.items():
            setattr(mod, k, v)
        if saved_env is None:
            os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
        else:
            os.environ["SGLANG_MOE_CONFIG_DIR"] = saved_env
        mod.get_moe_configs.cache_clear()


def loader_answer(device: DeviceInfo, question, config_dir: str | None = None):
    """`question(loader module)` inside the device view: the light loader's answer, or, where it
    cannot give one, the answer (or the error a server would hit) of the loader SGLang's import gives."""
    try:
        with sglang_view(device, config_dir, light=True) as mod:
            return question(mod)
    except Exception:
        pass
    with sglang_view(device, config_dir) as mod:
        return question(mod)


# --- the answers the tuner asks for, remembered -----------------------------------------------

def _block_shape(problem: Problem):
    return list(problem.block_shape) if problem.block_shape else None


def sglang_default_config(problem: Problem, M: int, device: DeviceInfo) -> dict:
    """SGLang's default (no file) config at M on `device`, for both GEMMs alike."""
    def ask():
        return loader_answer(device, lambda mod: dict(mod.get_default_config(
            M, problem.E, problem.N, problem.K, problem.top_k, problem.sglang_dtype, False, _block_shape(problem))))
    return remembered(("default", _problem_key(problem), M, _device_key(device)), ask, _is_config)


def sglang_selection(problem: Problem, M: int, device: DeviceInfo, config_dir: str | None = None):
    """(gate_up config, down config, file found) exactly as SGLang's loader picks them at M."""
    folder = config_dir or builtin_config_dir()

    def question(mod):
        bs = _block_shape(problem)
        found = mod.get_moe_configs(problem.E, problem.N, problem.sglang_dtype,
                                    bs[0] if bs else 0, bs[1] if bs else 0) is not None
        up, (down, _) = mod.try_get_optimal_moe_config(
            (problem.E, 2 * problem.N, problem.K), (problem.E, problem.K, problem.N), problem.top_k,
            problem.sglang_dtype, M, block_shape=bs, return_down_config=True)
        return up, down, found

    def ask():
        up, down, found = loader_answer(device, question, folder)
        up = dict(up)
        # SGLang runs the down GEMM with `down_config or config`; TMA only from a `_down` file.
        down = dict(down) if down else {k: v for k, v in up.items() if k != "USE_TMA"}
        return [up, down, found]
    up, down, found = remembered(("selection", _problem_key(problem), M, _device_key(device),
                                   os.path.realpath(folder), _folder_signature(folder, device)), ask,
                                  lambda a: isinstance(a, list) and len(a) == 3 and _is_config(a[0])
                                  and _is_config(a[1]) and isinstance(a[2], bool))
    return up, down, found


def sglang_file_name(problem: Problem, device: DeviceInfo, down: bool = False) -> str:
    def ask():
        return loader_answer(device, lambda mod: mod.get_config_file_name(problem.E, problem.N, problem.sglang_dtype,
                                                                   _block_shape(problem), down_moe=down))
    return remembered(("file_name", _problem_key(problem), down, _device_key(device)), ask,
                       lambda a: isinstance(a, str) and a.endswith(".json"))


def _is_config(a) -> bool:
    return isinstance(a, dict) and all(isinstance(v, int) for v in a.values())


def _problem_key(problem: Problem) -> list:
    return [problem.E, problem.N, problem.K, problem.top_k, problem.sglang_dtype, _block_shape(problem)]


def _device_key(device: DeviceInfo) -> list:
    import importlib.metadata as md
    try:
        triton = device.versions.get("triton") or md.version("triton")
    except md.PackageNotFoundError:
        triton = None
    return [device.name, triton, device.smem_optin]


def _folder_signature(folder: str, device: DeviceInfo) -> str:
    """What of `folder` SGLang's lookup for `device` can see: the names of its version folders
    and the name, size and mtime of every file naming this device (at any of the depths the
    supported releases read)."""
    tag = f"device_name={device.file_name}"
    seen = []
    for root in (Path(folder), Path(folder) / "configs"):
        if not root.is_dir():
            continue
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if entry.is_dir() and entry.name.startswith("triton_"):
                seen.append(entry.name)
                for f in sorted(os.scandir(entry.path), key=lambda e: e.name):
                    if tag in f.name:
                        st = f.stat()
                        seen.append([f"{entry.name}/{f.name}", st.st_size, st.st_mtime_ns])
            elif tag in entry.name:
                st = entry.stat()
                seen.append([entry.name, st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(seen).encode()).hexdigest()[:20]


def memo_path() -> Path:
    root = os.environ.get("AUTOTUNE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "autotune")
    return Path(root) / "sglang-answers.json"


def _loader_file() -> str | None:
    """SGLang's loader file found without importing SGLang (None when SGLang is not installed)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], *_CONFIG_MODULE.split(".")[1:]) + ".py"
    return path if os.path.exists(path) else None


def _sglang_identity() -> list | None:
    from autotune.adapters.sglang_versions import installed

    where = _loader_file()
    if where is None:
        return None
    st = os.stat(where)
    return [installed(), where, st.st_size, st.st_mtime_ns]


_memo: dict | None = None


def remembered(question: tuple, ask, valid):
    """SGLang's answer to `question`, from the memo or by asking it (then remembered). A remembered
    answer that is not `valid` (a memo edited or damaged by hand) is asked again and replaced."""
    global _memo
    ident = _sglang_identity()
    if ident is None:                 # SGLang not where find_spec looks: nothing to key on
        return ask()
    key = json.dumps([ident, *question])
    if _memo is None:
        _memo = _read_memo()
    if key in _memo and valid(_memo[key]):
        return copy.deepcopy(_memo[key])        # callers may change what they get
    answer = json.loads(json.dumps(ask()))      # the same JSON form a later process reads
    latest = _read_memo()                       # another process may have added answers meanwhile
    if len(latest) >= MEMO_MAX_ENTRIES:
        latest = {}
    latest[key] = answer
    _memo = latest
    try:
        write_json(memo_path(), latest, indent=None, ours=_is_memo)
    except (OSError, NotOurs):
        pass                                    # a read-only cache folder, or a file that is not a memo
    return copy.deepcopy(answer)                # there (AUTOTUNE_CACHE_DIR named a user's folder): asked again


def _is_memo(path: Path) -> bool:
    """A file this memo wrote: a JSON object whose every key is a question as `remembered` writes it,
    or the start of one (a memo cut short by something else is ours to start afresh)."""
    if text_starting('{"[')(path):
        return True
    try:
        doc = load_json(path)
        return isinstance(doc, dict) and all(isinstance(json.loads(k), list) for k in doc)
    except (OSError, ValueError):
        return False


def _read_memo() -> dict:
    try:
        memo = load_json(memo_path())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}
