"""`autotune install`: put a tuned folder's FlashInfer cache where SGLang 0.5.23 reads it at start-up.

SGLang keeps one file per rank under a folder named by a hash of values the server resolves
(model path, dtype, quantization, MoE runner, parallel sizes, HF config class, skip list:
autotune.export.flashinfer.sglang_cache_path). Every rank gets the same bytes: SGLang hashes the
ranks' files after tuning and deletes them all when any differ. Entries already in those files
are kept (ours win on equal keys); a file of another FlashInfer/CUDA environment is refused.
"""
from __future__ import annotations

from pathlib import Path

from ..fsutil import NotOurs, claim, write_atomic
from ..kernels import flashinfer_cache as fi
from .flashinfer import sglang_cache_path
from .tactics import BLOCKLIST_FILE, CACHE_FILE
from ..reading import load_json


class InstallError(ValueError):
    pass


def model_facts(model_path: str) -> tuple[str | None, str | None, bool]:
    """(HF config class, SGLang's quantization name, found) from a local model folder's config.json;
    (None, None, False) where the path is a hub name (nothing to read here)."""
    cfg_path = Path(model_path) / "config.json"
    if not cfg_path.is_file():
        return None, None, False
    from transformers import AutoConfig

    try:
        cls = type(AutoConfig.from_pretrained(str(cfg_path.parent))).__name__
        raw = load_json(cfg_path)
    except Exception as e:
        raise InstallError(f"{cfg_path}: not a model config transformers can read ({type(e).__name__}: {e})") from None
    q = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config")
    return cls, _quantization_name(q, cfg_path), True


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


def install(folder: str | Path, *, model_path: str, tp: int, pp: int = 1, attn_dp: int = 1, ep: int = 1,
            dtype: str = "bfloat16", quantization: str | None = None, moe_runner_backend: str | None = None,
            hf_config_class: str | None = None, cache_dir: str | None = None, skip_ops=(),
            quantization_given: bool = False) -> list[Path]:
    folder = Path(folder)
    src = folder / CACHE_FILE
    if not src.is_file():
        raise InstallError(f"{folder} has no {CACHE_FILE}: a GPU run of `autotune run` on a backend with tactics "
                           "writes it")
    if tp <= 0 or pp <= 0 or attn_dp <= 0 or ep <= 0:
        raise InstallError("--tp, --pp, --attn-dp and --ep must be positive")
    cls, quant, found = model_facts(model_path)
    hf_config_class = hf_config_class or cls
    if not hf_config_class:
        raise InstallError(f"{model_path} is not a local model folder: pass --hf-config-class (transformers' config "
                           "class name, e.g. Qwen3_5MoeConfig)")
    if not quantization_given:
        if not found:
            raise InstallError(f"{model_path} is not a local model folder: pass --quantization (or 'none')")
        quantization = quant
    if moe_runner_backend is None:
        moe_runner_backend = _from_server_args(folder)
    sm = _sm(folder)
    try:
        got = fi.read_cache(src)
    except ValueError:
        got = None
    if got is None or got[0] is None:
        raise InstallError(f"{src} is not a FlashInfer cache file")
    meta, records, ours = got
    paths = [sglang_cache_path(cache_dir, model_path=model_path, dtype=dtype, quantization=quantization,
                               moe_runner_backend=moe_runner_backend, tp_size=tp, pp_size=pp,
                               attn_dp_size=attn_dp, moe_ep_size=ep, hf_config_class=hf_config_class, sm=sm,
                               skip_ops=skip_ops, tp_rank=r, pp_rank=p, dp_rank=0)
             for p in range(pp) for r in range(tp)]
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


def blocklist_hint(folder: str | Path) -> str | None:
    path = Path(folder) / BLOCKLIST_FILE
    return f"export FLASHINFER_TACTICS_BLOCKLIST={path.resolve()}" if path.is_file() else None


def _from_server_args(folder: Path) -> str:
    from .server_args import read_values

    path = folder / "server_args.yaml"
    value = read_values(path).get("moe-runner-backend") if path.is_file() else None
    if not value:
        raise InstallError(f"{folder} has no moe-runner-backend line in server_args.yaml: pass --moe-runner-backend "
                           "as the server resolves it")
    return str(value)


def _sm(folder: Path) -> int:
    for name in ("backend_choice.json", "provenance.json"):
        path = folder / name
        if path.is_file():
            try:
                return int(load_json(path)["device"]["sm"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
    raise InstallError(f"{folder} says nowhere which GPU it was tuned on (backend_choice.json or provenance.json)")
