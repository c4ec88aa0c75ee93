"""`autotune install`: put a tuned folder's FlashInfer cache where SGLang 0.5.23 reads it at start-up.

SGLang keeps one file per rank under a folder named by a hash of values the server resolves
(model path, dtype, quantization, MoE runner, parallel sizes, HF config class, skip list:
autotune.export.flashinfer.sglang_cache_path). Every rank gets the same bytes: SGLang hashes the
ranks' files after tuning and deletes them all when any differ. Entries already in those files
are kept (ours win on equal keys); a file of another FlashInfer/CUDA environment is refused.
"""
from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from pathlib import Path

from autotune.fileio.writing import NotOurs, claim, write_atomic
from autotune.gpus.catalog import MAX_GPUS
from autotune.adapters import flashinfer_cache as fi
from autotune.export.flashinfer import Parallel, Rank, ServerKey, sglang_cache_path
from autotune.export.tactics import BLOCKLIST_FILE, CACHE_FILE
from autotune.fileio.reading import load_json
from autotune.folder.tuned import TunedFolder


class InstallError(ValueError):
    pass


# SGLang's one runner whose rank files also carry the GPU's UUID (flashinfer_autotune_cache_path)
MEGAMOE = "flashinfer_megamoe"


@dataclass(frozen=True)
class ModelFacts:
    """What a local model folder's config.json tells install (all None where the path is a hub name)."""
    hf_config_class: str | None = None       # transformers' config class
    quantization: str | None = None          # SGLang's name of its quantization
    found: bool = False                      # a local folder was read
    heads: int | None = None                 # attention heads (the language model's)
    experts: int | None = None               # routed experts, for a MoE model
    # why SGLang's name of the checkpoint's quantization is unknown here: said only where --quantization
    # is not given (with it, the user's name is the one the hash holds)
    quantization_unknown: str | None = None


def model_facts(model_path: str) -> ModelFacts:
    """The facts of a local model folder's config.json; ModelFacts() where the path is a hub name
    (nothing to read here)."""
    from autotune.problems.hf_config import ConfigError, text_section

    cfg_path = Path(model_path) / "config.json"
    if not cfg_path.is_file():
        return ModelFacts()
    try:
        cls = _config_class(cfg_path)
        raw = load_json(cfg_path)
        text, names = text_section(raw, cfg_path)
    except ConfigError as e:
        raise InstallError(str(e)) from None
    except Exception as e:
        raise InstallError(f"{cfg_path}: not a model config transformers can read ({type(e).__name__}: {e})") from None
    q = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config")

    def count(key):          # a count the file gives as one (a bool or a string is none)
        v = text.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    try:
        quantization, unknown = _quantization_name(q, cfg_path), None
    except InstallError as e:
        quantization, unknown = None, str(e)
    return ModelFacts(cls, quantization, True, count("num_attention_heads"), count(names["num_experts"]), unknown)


def _config_class(cfg_path: Path) -> str:
    """transformers' config class of the model folder's config.json, remembered per content and
    transformers release (with SGLang's loader answers: autotune.adapters.sglang_loader.remembered),
    so a later install imports no transformers (3-5 s of CPU) for it."""
    import hashlib

    from autotune.adapters.sglang_loader import remembered

    def ask():
        from transformers import AutoConfig

        return type(AutoConfig.from_pretrained(str(cfg_path.parent))).__name__
    question = ("hf_config_class", _versions("transformers"), hashlib.sha256(cfg_path.read_bytes()).hexdigest())
    return remembered(question, ask, lambda a: isinstance(a, str) and a != "")


def _versions(*dists: str) -> list:
    import importlib.metadata as md

    out = []
    for d in dists:
        try:
            out.append(md.version(d))
        except md.PackageNotFoundError:
            out.append(None)
    return out


def _quantization_name(q: dict | None, where) -> str | None:
    """SGLang's name for a checkpoint's quantization_config (what its cache hash holds)."""
    if not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if "FP4" in algo:
            return "modelopt_fp4"
        if "FP8" in algo:
            return "modelopt_fp8"
    raise InstallError(f"{where}: quantization {method or q!r} is not one autotune knows SGLang's name of; "
                       "pass --quantization as the server resolves it")


@dataclass(frozen=True)
class ServerFlags:
    """The server's values as `autotune install` is given them; None where read elsewhere:
    quantization from the model folder's config.json ('none' for none), moe_runner_backend from
    the tuned folder's server_args.yaml, hf_config_class from the model folder."""
    model_path: str
    parallel: Parallel
    dtype: str = "bfloat16"
    quantization: str | None = None
    moe_runner_backend: str | None = None
    hf_config_class: str | None = None
    skip_ops: tuple[str, ...] = ()


def install(folder: str | Path, server: ServerFlags, cache_dir: str | None = None) -> list[Path]:
    """The folder's FlashInfer cache into every rank's file of SGLang's cache for `server` under
    `cache_dir` (None: $SGLANG_CACHE_DIR, default ~/.cache/sglang); the files written."""
    folder = Path(folder)
    src = folder / CACHE_FILE
    if not src.is_file():
        raise InstallError(f"{folder} has no {CACHE_FILE}: a GPU run of `autotune run` on a backend with tactics "
                           "writes it")
    key = _server_key(folder, server)
    sm = _sm(folder)
    try:
        got = fi.read_cache(src)
    except ValueError:
        got = None
    if got is None or got[0] is None:
        raise InstallError(f"{src} is not a FlashInfer cache file")
    meta, records, ours = got
    par = server.parallel
    paths = [sglang_cache_path(cache_dir, key, Rank(tp=r, pp=p, dp=0), sm=sm)
             for p in range(par.pp) for r in range(par.tp)]
    blocking = next((p for p in (*reversed(paths[0].parents),) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise InstallError(f"SGLang's cache folder cannot be made: {blocking} is a file (--cache-dir or "
                           "SGLANG_CACHE_DIR must name a folder)")
    configs: dict = {}
    for path in paths:            # what SGLang already tuned there stays, the same in every rank's file
        try:
            claim(path, fi.CACHE_OURS)
            configs.update(fi.kept_entries(path, meta)[0])
        except NotOurs as e:
            raise InstallError(f"{e}; nothing installed") from None
        except fi.ForeignCache as e:
            raise InstallError(f"{path} belongs to another environment ({e.details}); nothing installed") from None
        except ValueError:
            raise InstallError(f"{path} is not a FlashInfer cache file; nothing installed") from None
    configs.update(ours)
    text = fi.render(meta, records, configs)
    for path in paths:
        write_atomic(path, text, ours=fi.CACHE_OURS)
    return paths


def _server_key(folder: Path, server: ServerFlags) -> ServerKey:
    """The values SGLang hashes into its cache folder's name, each given or read and checked
    against the installed SGLang's own lists."""
    facts = model_facts(server.model_path)
    _check_parallel(server.parallel, facts)
    hf_config_class = server.hf_config_class or facts.hf_config_class
    if not hf_config_class:
        raise InstallError(f"{server.model_path} is not a local model folder: pass --hf-config-class (transformers' "
                           "config class name, e.g. Qwen3_5MoeConfig)")
    if server.quantization is None:
        if not facts.found:
            raise InstallError(f"{server.model_path} is not a local model folder: pass --quantization (or 'none')")
        if facts.quantization_unknown:
            raise InstallError(facts.quantization_unknown)
        quantization = facts.quantization
    else:
        quantization = None if server.quantization.lower() == "none" else server.quantization
    moe_runner_backend, runner_from = server.moe_runner_backend, None
    if moe_runner_backend is None:
        moe_runner_backend, runner_from = _from_server_args(folder), f"{folder / 'server_args.yaml'}: moe-runner-backend"
    # Every value enters the hash of the folder SGLang reads: one SGLang would never resolve names a
    # folder no server reads, so each is checked against SGLang's own lists, wherever it came from.
    stack = _stack_values()
    sglang = stack["flags"]
    _server_value("--moe-runner-backend", moe_runner_backend, sglang["--moe-runner-backend"], runner_from)
    if moe_runner_backend == MEGAMOE:
        raise InstallError(f"{runner_from or '--moe-runner-backend'} {MEGAMOE}: SGLang names that runner's files by "
                           "each GPU's UUID, which install cannot know (the files would never be read); let the "
                           "server tune it")
    if quantization is not None:
        _server_value("--quantization", quantization, sglang["--quantization"], also=", or 'none'")
    dtype = _torch_dtype(server.dtype, sglang["--dtype"], stack["dtypes"])
    _one_of("--hf-config-class", hf_config_class, stack["config_classes"],
            "a config class transformers or SGLang defines (the server's hf_config class)")
    return ServerKey(server.model_path, dtype, quantization, moe_runner_backend, hf_config_class, server.parallel,
                     server.skip_ops)


def _check_parallel(par: Parallel, facts: ModelFacts) -> None:
    """Parallel sizes one SGLang server could run with: at most MAX_GPUS ranks, attention DP and
    expert parallelism inside --tp, at least one attention head per attention-TP rank and one
    expert per EP rank where the model's config says how many it has."""
    tp, pp, attn_dp, ep = par.tp, par.pp, par.attn_dp, par.ep
    for flag, v in (("--tp", tp), ("--pp", pp), ("--attn-dp", attn_dp), ("--ep", ep)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_GPUS:
            raise InstallError(f"{flag} must be an integer from 1 to {MAX_GPUS}, got {v!r}")
    if tp * pp > MAX_GPUS:
        raise InstallError(f"--tp {tp} x --pp {pp} is {tp * pp} GPUs (one rank file each), above {MAX_GPUS}")
    for flag, v in (("--attn-dp", attn_dp), ("--ep", ep)):
        if v > tp:
            raise InstallError(f"{flag} {v} is above --tp {tp} (SGLang splits the --tp ranks into its groups)")
    if facts.heads and tp // attn_dp > facts.heads:
        raise InstallError(f"--tp {tp} is above the model's {facts.heads} attention heads"
                           + (f" (over --attn-dp {attn_dp}: {tp // attn_dp} attention ranks)" if attn_dp > 1 else "")
                           + ": a rank without one head is not a layout SGLang runs")
    if facts.experts and ep > facts.experts:
        raise InstallError(f"--ep {ep} is above the model's {facts.experts} experts")


def _stack_values() -> dict:
    """What install checks a server's values against, as the installed SGLang, transformers and torch
    answer: SGLang's values of the flags its cache hash holds ("flags"), the config class names a
    server's model can have ("config_classes"), the torch dtype each --dtype value names ("dtypes":
    str of it, None where torch has none). Remembered with SGLang's loader answers, keyed by SGLang's
    install and the transformers and torch releases: asked once per installed stack, so a later
    install imports none of them (SGLang's import alone is 6-10 s of CPU)."""
    from autotune.adapters.sglang_loader import remembered

    def ask():
        flags = _sglang_values()
        return {"flags": flags, "config_classes": _config_classes(), "dtypes": _torch_dtypes(flags["--dtype"])}
    return remembered(("install", _versions("transformers", "torch")), ask,
                      lambda a: isinstance(a, dict) and set(a) == {"flags", "config_classes", "dtypes"})


@functools.cache
def _sglang_values() -> dict[str, list[str]]:
    """The values the installed SGLang's own server parser takes for the flags that enter the cache
    hash (its argparse choices: never a copy of them here, so a new release's values just work)."""
    from autotune.adapters.sglang_server import flag_choices

    try:
        return flag_choices(("--moe-runner-backend", "--quantization", "--dtype"))
    except Exception as e:
        raise InstallError(f"SGLang's server flags cannot be read here ({type(e).__name__}: {e}): install checks "
                           "its values against the SGLang that will read the files; run it where SGLang is "
                           "installed") from None


def _sglang_name() -> str:
    import importlib.metadata as md
    try:
        return f"SGLang {md.version('sglang')}"
    except md.PackageNotFoundError:
        return "SGLang"


def _one_of(label: str, value: str, valid, what: str, also: str = "") -> None:
    """`value` is one of `valid` (in their own order), else one line naming it, the closest valid
    ones (or the first few) and how many there are."""
    valid = list(valid)
    if value in valid:
        return
    near = difflib.get_close_matches(value, valid, n=3, cutoff=0.6)
    shown = "did you mean " + ", ".join(near) + "?" if near else "e.g. " + ", ".join(valid[:6])
    raise InstallError(f"{label} {value!r} is not {what}: {shown} ({len(valid)} in all{also})")


def _server_value(flag: str, value: str, valid, label: str | None = None, also: str = "") -> None:
    _one_of(label or flag, value, valid, f"a value {_sglang_name()}'s {flag} takes", also)


def _torch_dtypes(choices: list[str]) -> dict[str, str | None]:
    """str() of the torch dtype each of SGLang's --dtype values names (what SGLang's hash holds, as
    torch.float16 also for SGLang's alias half); None for one torch does not spell so."""
    import torch

    out = {}
    for c in choices:
        got = getattr(torch, c, None)
        out[c] = str(got) if isinstance(got, torch.dtype) else None
    return out


def _torch_dtype(dtype: str, choices: list[str], torch_names: dict) -> str:
    """The torch dtype (as str() gives it) a server started with `--dtype dtype` runs."""
    resolved = [c for c in choices if c != "auto"]
    if dtype == "auto" and "auto" in choices:
        raise InstallError("--dtype auto is resolved by the server from the checkpoint: pass the dtype it "
                           f"resolves (one of {', '.join(resolved)})")
    _server_value("--dtype", dtype, resolved)
    got = torch_names.get(dtype)
    if got is None:                           # an alias of a later SGLang that torch does not spell so
        raise InstallError(f"--dtype {dtype!r} is not a torch dtype name: pass the torch dtype the server "
                           "resolves it to")
    return got


def _config_classes() -> list[str]:
    """The config class names a server's model can have: transformers' own and those SGLang
    registers (sglang.srt.utils.hf_transformers: models transformers does not know), in their order."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    from autotune.adapters.sglang_server import registered_config_classes

    names = dict.fromkeys(CONFIG_MAPPING_NAMES.values())
    names.update(dict.fromkeys(registered_config_classes()))
    names.update(dict.fromkeys(c.__name__ for c in getattr(CONFIG_MAPPING, "_extra_content", {}).values()))
    return list(names)


def blocklist_hint(folder: str | Path) -> str | None:
    path = Path(folder) / BLOCKLIST_FILE
    return f"export FLASHINFER_TACTICS_BLOCKLIST={path.resolve()}" if path.is_file() else None


def _from_server_args(folder: Path) -> str:
    from autotune.export.server_args import read_values

    path = folder / "server_args.yaml"
    value = read_values(path).get("moe-runner-backend") if path.is_file() else None
    if not value:
        raise InstallError(f"{folder} has no moe-runner-backend line in server_args.yaml: pass --moe-runner-backend "
                           "as the server resolves it")
    return str(value)


def _sm(folder: Path) -> int:
    reads = (lambda: load_json(folder / "backend_choice.json"), TunedFolder(folder).provenance_as_written)
    for read in reads:
        try:
            return int(read()["device"]["sm"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    raise InstallError(f"{folder} says nowhere which GPU it was tuned on (backend_choice.json or provenance.json)")
