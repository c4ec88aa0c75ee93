"""What `autotune validate --engine sglang` is given: the model folder and the tuned folder."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autotune.validate import ConfigDirError, ModelDirError
from autotune.folder.tuned import TunedFolder


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".npz")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "merges.txt", "spiece.model", "vocab.txt", "tiktoken.model", "qwen.tiktoken")


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
    folder: TunedFolder                 # the folder's handle: its provenance, whose tables the report repeats

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
    out = TunedConfigs(root, moe, yaml_path if yaml_path.is_file() else None, fi, TunedFolder(root))
    if not (out.moe_files or out.server_args or out.flashinfer_cache):
        raise ConfigDirError(f"{root} holds nothing SGLang would load (no configs/triton_*/*.json, "
                             "no server_args.yaml, no flashinfer/autotune cache)")
    return out
