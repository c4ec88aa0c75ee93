"""One tensor-parallel rank of a MoE model as a config-only folder SGLang serves with `--tp 1`.

SGLang's server at `--tp T` on T GPUs runs, on each GPU, every layer with its per-rank slice:
attention heads / T, KV heads / T (at least 1: SGLang replicates KV heads when there are fewer
than T), expert FFN width / T (so the fused MoE runs exactly E, N = moe_intermediate_size / T,
the shape a TP-T tuned file is named for), shared-expert width / T, linear-attention heads / T.
Written as a model with those full sizes and served on one GPU with `--load-format dummy`, it runs
the same kernels on the same shapes as one rank of the real deployment, without the all-reduces.
The vocabulary stays whole (memory, not kernels: the LM head split is a GEMM of its own).

The folder also gets a tiny word-level tokenizer (SGLang's benchmarks load one; requests carry
token ids) and, for Qwen3.5's vision-language architecture, the processor configs SGLang's
TokenizerManager looks for even with `--skip-tokenizer-init`.
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from autotune.errors import UsageError
from autotune.fileio.writing import check_writable, claim, json_with, listed, read_json, write_atomic, write_json
from autotune.problems import models
from autotune.problems.models import ModelError, MoeModel

# Text-config keys split across TP ranks, besides the expert and shared-expert widths (whose names
# differ between model families: `divided_keys` takes them from autotune.problems.hf_config, the reading `shapes`
# and `run` use). The dense layers' MLP width is split as well (DeepSeek's first layers, Llama-4's
# dense layers, Qwen's mlp_only_layers). KV heads are special (replicated below TP).
HEADS = ("num_attention_heads",)
LINEAR_HEADS = ("linear_num_key_heads", "linear_num_value_heads")
DENSE_MLP = ("intermediate_size", "intermediate_size_mlp")
KV_HEADS = "num_key_value_heads"
# Multi-head latent attention (DeepSeek) names its head sizes itself: no head_dim is derived for it.
MLA_KEYS = ("qk_nope_head_dim", "kv_lora_rank")


def divided_keys(text: dict) -> list[str]:
    """The keys of a text config that one TP rank holds a 1/tp share of, by the file's own names."""
    from autotune.problems.hf_config import text_section

    names = text_section(text, "")[1]
    return list(dict.fromkeys((*HEADS, names["moe_intermediate_size"], names["shared"], *DENSE_MLP, *LINEAR_HEADS)))


def preset_hf_config(m: MoeModel) -> dict:
    """The HF config.json of a preset (autotune.problems.models.PRESETS): every family has one."""
    if m.family == "qwen3-next" and m.linear is not None:
        return qwen3_next_hf_config(m)
    return qwen35_hf_config(m)


def _qwen_text(m: MoeModel, vocab_size: int) -> dict:
    """The text keys Qwen3.5-MoE and Qwen3-Next share (hybrid Gated DeltaNet / gated attention layers)."""
    return {
        "hidden_size": m.hidden_size, "num_hidden_layers": m.num_layers,
        "num_experts": m.num_experts, "num_experts_per_tok": m.top_k,
        "moe_intermediate_size": m.moe_intermediate_size,
        "shared_expert_intermediate_size": m.shared_expert_intermediate_size,
        "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.num_key_value_heads,
        "head_dim": m.head_dim, "attn_output_gate": m.attn_output_gate,
        "full_attention_interval": m.full_attention_interval,
        "linear_num_key_heads": m.linear.num_key_heads, "linear_num_value_heads": m.linear.num_value_heads,
        "linear_key_head_dim": m.linear.key_head_dim, "linear_value_head_dim": m.linear.value_head_dim,
        "linear_conv_kernel_dim": m.linear.conv_kernel,
        "norm_topk_prob": True, "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": vocab_size,
        "max_position_embeddings": 262144, "tie_word_embeddings": False, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "dtype": "bfloat16"}


def qwen3_next_hf_config(m: MoeModel, vocab_size: int = 151936) -> dict:
    """The HF config.json of a Qwen3-Next preset (text only: Qwen3NextForCausalLM), from the released
    checkpoint's values."""
    if m.family != "qwen3-next" or m.linear is None:
        raise ModelError(f"{m.name} is not a Qwen3-Next preset")
    return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "torch_dtype": "bfloat16",
            **_qwen_text(m, vocab_size),
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}


def qwen35_hf_config(m: MoeModel, vocab_size: int = 248320) -> dict:
    """The HF config.json of a Qwen3.5-MoE preset (the keys SGLang's qwen3_5 model reads), from the
    released checkpoint's values; the vision tower is one tiny block (text-only requests never run it)."""
    if m.family != "qwen3.5" or m.linear is None:
        raise ModelError(f"{m.name}: only Qwen3.5 and Qwen3-Next presets have a built-in HF config; "
                         "pass --model-config")
    text = {
        "model_type": "qwen3_5_moe_text", **_qwen_text(m, vocab_size),
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "image_token_id": 248056, "video_token_id": 248057,
        "vision_start_token_id": 248053, "vision_end_token_id": 248054,
        "text_config": text,
        "vision_config": {
            "model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
            "in_channels": 3, "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
            "out_hidden_size": m.hidden_size, "num_position_embeddings": 2304, "deepstack_visual_indexes": [],
            "hidden_act": "gelu_pytorch_tanh"},
    }


# Qwen's released block-FP8 checkpoints (e.g. Qwen3.5-397B-A17B-FP8) declare this; SGLang then runs
# its block-FP8 linear and fused-MoE paths (the `dtype=fp8_w8a8,block_shape=[128, 128]` files).
# Like those checkpoints, the Gated DeltaNet's tiny b/a projections stay bf16: at TP8 each is 8 rows
# per rank, which no 128-row block divides (SGLang refuses to build the layer; seen on the H200).
FP8_BLOCK_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                   "weight_block_size": [128, 128],
                   "modules_to_not_convert": ["lm_head", "mlp.gate", "mlp.shared_expert_gate",
                                              "linear_attn.in_proj_a", "linear_attn.in_proj_b",
                                              "linear_attn.in_proj_ba"]}


def rank_config(hf: dict, tp: int, layers: int | None = None, fp8_block: bool = False) -> dict:
    """`hf` (a full model's config.json) with every per-rank dimension of TP `tp`; one clear
    ModelError naming the dimension that does not split. `fp8_block` declares a block-FP8 checkpoint.
    The rank is read back as `shapes` reads a config and must run the very fused-MoE problem
    `shapes` and `run` derive for one rank at `--tp tp` (models.rank_problem), or nothing is written."""
    if tp <= 0:
        raise ModelError(f"--tp must be positive, got {tp}")
    model = models.model_from_hf(hf, "the model config")
    out = copy.deepcopy(hf)
    text = out.get("text_config") if isinstance(out.get("text_config"), dict) else out
    heads = text.get("num_attention_heads")
    if isinstance(heads, int) and heads > 0 and not text.get("head_dim") and not any(k in text for k in MLA_KEYS):
        text["head_dim"] = text["hidden_size"] // heads   # stays the full model's, not hidden / (heads / tp)
    for key in divided_keys(text):
        v = text.get(key)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0 or v % tp:
            raise ModelError(f"{key} = {v!r} does not split over --tp {tp}")
        text[key] = v // tp
    kv = text.get(KV_HEADS)
    if kv is not None:
        if not isinstance(kv, int) or kv <= 0 or (kv % tp if kv >= tp else tp % kv):
            raise ModelError(f"{KV_HEADS} = {kv!r} neither splits over --tp {tp} nor is replicated evenly")
        text[KV_HEADS] = max(1, kv // tp)
    if layers is not None:
        _keep_layers(text, layers)
    problem = models.rank_problem(model, tp)
    served = models.rank_problem(models.model_from_hf(out, f"the tp{tp} rank's config"), 1)
    if (served.E, served.N, served.K, served.top_k) != (problem.E, problem.N, problem.K, problem.top_k):
        raise ModelError(f"the tp{tp} rank's config would run the fused MoE at E={served.E}, N={served.N}, "
                         f"K={served.K}, top_k={served.top_k} where one rank at --tp {tp} runs E={problem.E}, "
                         f"N={problem.N}, K={problem.K}, top_k={problem.top_k}: not written")
    if fp8_block:
        _declare_block_fp8(out, text, tp)
    return out


def _keep_layers(text: dict, layers) -> None:
    from autotune.problems.hf_config import text_section

    key = text_section(text, "")[1]["num_layers"]      # the model's own name of its layer count
    full = text.get(key)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers <= 0:
        raise ModelError(f"--layers must be a positive integer, got {layers!r}")
    # more layers than the model has is no rank of it: its timings would be of a model nobody serves
    if isinstance(full, int) and not isinstance(full, bool) and layers > full:
        raise ModelError(f"--layers {layers} is above the model's {full} layers ({key})")
    text[key] = layers


def _declare_block_fp8(out: dict, text: dict, tp: int) -> None:
    if not all(isinstance(text.get(k), int) for k in ("linear_num_key_heads", "linear_num_value_heads",
                                                       "linear_key_head_dim", "linear_value_head_dim")):
        raise ModelError(f"--fp8-block declares the layout of Qwen's block-FP8 checkpoints (Qwen3.5 / Qwen3-Next: "
                         f"which modules stay bf16); model_type {text.get('model_type')!r} is not one of them")
    out["quantization_config"] = copy.deepcopy(FP8_BLOCK_QUANT)
    block = FP8_BLOCK_QUANT["weight_block_size"][0]
    for module, dims in block_fp8_dims(text).items():
        for what, v in dims.items():
            if v % block:
                raise ModelError(f"block-FP8 at --tp {tp}: {module} has {what} = {v} per rank, which "
                                 f"the {block}-wide weight blocks do not divide (SGLang refuses such a layer)")


def block_fp8_dims(text: dict) -> dict[str, dict[str, int]]:
    """The per-rank dimensions SGLang checks against the weight block for every block-FP8 linear
    of a Qwen3.5 rank (output rows per shard of column-parallel layers, input columns of row-parallel
    ones), keyed by module name; the modules the checkpoint keeps bf16 are not listed."""
    from autotune.problems.hf_config import text_section

    names = text_section(text, "")[1]
    hd = text["head_dim"]
    q = text["num_attention_heads"] * hd * (2 if text.get("attn_output_gate") else 1)
    kv = text["num_key_value_heads"] * hd
    key = text["linear_num_key_heads"] * text["linear_key_head_dim"]
    value = text["linear_num_value_heads"] * text["linear_value_head_dim"]
    shared, moe = text.get(names["shared"]), text[names["moe_intermediate_size"]]
    dims = {"self_attn.qkv_proj": {"q rows": q, "k/v rows": kv},
            "self_attn.o_proj": {"input columns": text["num_attention_heads"] * hd},
            "linear_attn.in_proj_qkvz": {"qkv rows": 2 * key + value, "z rows": value},
            "linear_attn.out_proj": {"input columns": value},
            "mlp.experts": {names["moe_intermediate_size"]: moe}}
    if shared:
        dims["mlp.shared_expert.gate_up_proj"] = {"rows per projection": shared}
        dims["mlp.shared_expert.down_proj"] = {"input columns": shared}
    return dims


def _tokenizer(folder: Path) -> None:
    """A 1000-word word-level tokenizer: the benchmarks load a tokenizer, the requests are ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eos>": 1, **{f"t{i}": i + 2 for i in range(998)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    write_atomic(folder / "tokenizer.json", tok.to_str())
    write_json(folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
                                                  "eos_token": "<eos>", "model_max_length": 262144}, indent=1)


def _vl_processor(folder: Path) -> None:
    common = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
              "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor"}
    write_json(folder / "preprocessor_config.json",
               dict(common, size={"longest_edge": 16777216, "shortest_edge": 65536},
                    image_processor_type="Qwen2VLImageProcessorFast"), indent=1)
    write_json(folder / "video_preprocessor_config.json",
               dict(common, size={"longest_edge": 25165824, "shortest_edge": 4096},
                    video_processor_type="Qwen3VLVideoProcessor"), indent=1)


# The folder's list of what rank-model wrote there: only those files are ever replaced.
MANIFEST = "autotune_rank_model.json"
WRITES = ("config.json", "tokenizer.json", "tokenizer_config.json")
VL_WRITES = ("preprocessor_config.json", "video_preprocessor_config.json")


def write_rank_model(folder: str | Path, hf: dict, tp: int, layers: int | None = None,
                     fp8_block: bool = False) -> Path:
    """Write the config-only folder of one TP rank; refuses a folder that holds weights, and any
    file there that an earlier rank-model did not write (unless --force)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ModelError(f"--out {folder} is a file; name a folder")
    if folder.exists() and any(f.suffix in (".safetensors", ".bin", ".pt") for f in folder.iterdir()):
        raise ModelError(f"{folder} holds weight files: not overwriting a real model folder")
    cfg = rank_config(hf, tp, layers, fp8_block)
    vl = any("VL" in str(a) or "ConditionalGeneration" in str(a) for a in cfg.get("architectures") or [])
    names = WRITES + (VL_WRITES if vl else ())
    manifest_ours = json_with("written_by", "files")
    claim(folder / MANIFEST, manifest_ours)
    try:
        before = read_json(folder / MANIFEST, default=None) or {}
    except ValueError:
        before = {}
    ours = listed(before.get("files") or [] if isinstance(before.get("files"), list) else [], folder)
    for name in names:                         # all refused before any is written
        claim(folder / name, ours)
    try:
        check_writable(folder)
    except OSError as e:
        raise ModelError(f"--out {folder}: {e}") from None
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        write_json(folder / "config.json", cfg, indent=1)
        _tokenizer(folder)
        if vl:
            _vl_processor(folder)
        write_json(folder / MANIFEST, {"written_by": "autotune rank-model", "files": list(names)}, ours=manifest_ours)
    except BaseException:
        if made:                               # a write failed (a disk filled meanwhile): no half a folder left
            shutil.rmtree(made[-1], ignore_errors=True)
        raise
    return folder


def command(out, tp, model=None, model_config=None, layers=None, fp8_block=False) -> list[str]:
    """A config-only model folder of one TP rank, for SGLang's server with --tp 1 --load-format dummy."""
    lines: list[str] = []
    if bool(model) == bool(model_config):
        raise UsageError("rank-model needs one of --model NAME or --model-config FILE")
    if model_config:
        models.model_from_hf_config(model_config)      # validated once; the rank keeps every other key
    hf = (models.read_hf_config(model_config) if model_config
          else preset_hf_config(models.select_models(model=model)[0]))
    folder = write_rank_model(out, hf, tp, layers, fp8_block)
    from autotune.problems.hf_config import text_section

    rank, names = text_section(json.loads((folder / "config.json").read_text()), folder / "config.json")
    p = models.rank_problem(models.model_from_hf(hf, model_config or model), tp)
    lines.append(f"wrote {folder}: one tp{tp} rank, {rank.get(names['num_layers'])} layers; its fused MoE runs "
                 f"E={p.E} experts x N={p.N} ({names['moe_intermediate_size']} per rank), K={p.K}, top_k {p.top_k}, "
                 f"the problem `shapes --tp {tp}` lists; serve it with --tp 1 --load-format dummy")
    return lines
