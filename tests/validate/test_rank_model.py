"""One TP rank of a MoE model as a config-only folder: every per-rank dimension, read back by
transformers' own config class, and a clear error where a dimension does not split."""
import json

import pytest

from autotune.cli import main
from pathlib import Path

from autotune.problems import models
from autotune.problems.models import PRESETS, ModelError
from autotune.validate.rank_model import preset_hf_config, qwen35_hf_config, rank_config

FULL = qwen35_hf_config(PRESETS["qwen3.5-397b-a17b"])


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_every_divided_dimension(tp):
    t = rank_config(FULL, tp)["text_config"]
    f = FULL["text_config"]
    assert t["num_attention_heads"] == f["num_attention_heads"] // tp
    assert t["num_key_value_heads"] == max(1, f["num_key_value_heads"] // tp)   # 2 kv heads: replicated at tp 4, 8
    assert t["moe_intermediate_size"] == f["moe_intermediate_size"] // tp       # the fused MoE's N
    assert t["shared_expert_intermediate_size"] == f["shared_expert_intermediate_size"] // tp
    assert t["linear_num_key_heads"] == f["linear_num_key_heads"] // tp
    assert t["linear_num_value_heads"] == f["linear_num_value_heads"] // tp
    for same in ("hidden_size", "num_experts", "num_experts_per_tok", "head_dim", "vocab_size", "num_hidden_layers"):
        assert t[same] == f[same], same
    assert FULL["text_config"]["num_attention_heads"] == 32, "the full config is left as it was"


@pytest.mark.parametrize("tp,key", [(3, "num_attention_heads"), (64, "moe_intermediate_size")])
def test_a_dimension_that_does_not_split_is_named(tp, key):
    cfg = json.loads(json.dumps(FULL))
    if key == "moe_intermediate_size":
        cfg["text_config"].update(num_attention_heads=64, linear_num_key_heads=64, linear_num_value_heads=64,
                                  moe_intermediate_size=96)
    with pytest.raises(ModelError, match=key):
        rank_config(cfg, tp)


def test_kv_heads_that_neither_split_nor_replicate(tmp_path):
    cfg = json.loads(json.dumps(FULL))
    cfg["text_config"]["num_key_value_heads"] = 3
    with pytest.raises(ModelError, match="num_key_value_heads"):
        rank_config(cfg, 8)


def test_cli_folder_is_read_back_by_transformers(tmp_path, capsys):
    from transformers import AutoConfig

    out = tmp_path / "rank"
    assert main(["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--layers", "4", "--fp8-block",
                 "--out", str(out)]) == 0
    c = AutoConfig.from_pretrained(out)
    t = c.text_config
    assert (t.num_attention_heads, t.num_key_value_heads, t.moe_intermediate_size, t.num_hidden_layers) == (4, 1, 128, 4)
    assert c.quantization_config["weight_block_size"] == [128, 128]
    assert (out / "tokenizer.json").exists() and (out / "preprocessor_config.json").exists()


def test_cli_bad_input_one_line(tmp_path, capsys):
    weights = tmp_path / "real"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"x")
    for argv, says in ((["--model", "qwen3.5-397b-a17b", "--tp", "3", "--out", str(tmp_path / "a")], "does not split"),
                       (["--model", "nope", "--tp", "8", "--out", str(tmp_path / "b")], "unknown model preset"),
                       (["--model", "qwen3.5-397b-a17b", "--tp", "8", "--out", str(weights)], "holds weight files")):
        assert main(["rank-model", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "a").exists() and (weights / "model.safetensors").read_bytes() == b"x"


def test_block_fp8_rank_builds_under_sglangs_own_quantization_rules():
    """The block-FP8 rank SGLang serves: SGLang's own Fp8Config, read from the folder's config,
    keeps the DeltaNet b/a projections bf16 (8 rows per rank at TP8: no 128-block divides them,
    and SGLang 0.5.16 refused to build the layer on the H200 without this) and quantizes every
    other projection, each of whose per-rank dimensions the block divides."""
    from autotune.adapters.sglang_loader import sglang_submodule
    from autotune.validate.rank_model import block_fp8_dims

    fp8 = sglang_submodule("sglang.srt.layers.quantization", "fp8")
    utils = sglang_submodule("sglang.srt.layers.quantization", "utils")
    cfg = rank_config(FULL, 8, fp8_block=True)
    quant = fp8.Fp8Config.from_config(cfg["quantization_config"])
    block = quant.weight_block_size[0]

    def skipped(module):
        return utils.is_layer_skipped(f"model.layers.0.{module}", quant.ignored_layers)

    assert cfg["text_config"]["linear_num_value_heads"] % block, "the b/a rows really do not divide"
    assert skipped("linear_attn.in_proj_ba") and skipped("mlp.gate") and skipped("mlp.shared_expert_gate")
    for module, dims in block_fp8_dims(cfg["text_config"]).items():
        assert not skipped(module), module
        assert all(v % block == 0 for v in dims.values()), (module, dims)


def test_block_fp8_names_the_dimension_the_block_does_not_divide():
    rank_config(FULL, 16)                                   # 1024 / 16 = 64 rows: fine in bf16
    with pytest.raises(ModelError, match="mlp.experts has moe_intermediate_size = 64"):
        rank_config(FULL, 16, fp8_block=True)
    cfg = json.loads(json.dumps(FULL))
    cfg["text_config"]["moe_intermediate_size"] = 1088      # 136 per rank at TP8: bf16 fine, block-FP8 not
    rank_config(cfg, 8)
    with pytest.raises(ModelError, match="mlp.experts has moe_intermediate_size = 136"):
        rank_config(cfg, 8, fp8_block=True)


def test_layers_up_to_the_models_own_count_are_kept_and_more_refused():
    """--layers keeps a prefix of the model's layers: all of them is fine, one more is no rank of it."""
    full = FULL["text_config"]["num_hidden_layers"]
    assert rank_config(FULL, 8, layers=full)["text_config"]["num_hidden_layers"] == full
    assert rank_config(FULL, 8, layers=1)["text_config"]["num_hidden_layers"] == 1
    with pytest.raises(ModelError, match=f"--layers {full + 1} is above the model's {full} layers"):
        rank_config(FULL, 8, layers=full + 1)


# --- one derivation: the rank runs the problem `shapes` lists -------------------------------------

STYLES = Path(__file__).parents[1] / "data/model_configs"
# What each model family's transformers config class calls the routed-expert count and the expert
# FFN width (read from transformers' own classes, not from autotune's table of names).
EXPERT_KEYS = {"mixtral": ("num_local_experts", "intermediate_size"),
               "gpt_oss": ("num_local_experts", "intermediate_size"),
               "llama4_text": ("num_local_experts", "intermediate_size"),
               "deepseek_v3": ("n_routed_experts", "moe_intermediate_size"),
               "qwen3_5_moe_text": ("num_experts", "moe_intermediate_size"),
               "qwen3_next": ("num_experts", "moe_intermediate_size")}


def _full(name):
    """(the model `shapes` reads, its full config.json) for a preset or a config fixture."""
    if name in PRESETS:
        return PRESETS[name], preset_hf_config(PRESETS[name])
    path = STYLES / f"{name}.config.json"
    return models.model_from_hf_config(path), json.loads(path.read_text())


MODELS = [*PRESETS, *sorted(p.name.removesuffix(".config.json") for p in STYLES.glob("*.config.json"))]


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("name", MODELS)
def test_a_rank_runs_the_problem_shapes_lists(tmp_path, name, tp):
    """Read back by transformers' own config class, the rank's expert count, expert width, hidden size
    and top-k are the fused-MoE problem `shapes --tp T` lists for the model (Mixtral, GPT-OSS and
    Llama-4 call the expert width intermediate_size: the rank kept 14336 where shapes said 1792)."""
    from transformers import AutoConfig

    model, hf = _full(name)
    (expected,) = models.expand([model], tps=(tp,), dtypes=("bf16",)).problems
    (tmp_path / "config.json").write_text(json.dumps(rank_config(hf, tp)))
    c = AutoConfig.from_pretrained(tmp_path)
    t = getattr(c, "text_config", None) or c
    experts, width = EXPERT_KEYS[t.model_type]
    assert (getattr(t, experts), getattr(t, width), t.hidden_size, t.num_experts_per_tok) == \
        (expected.E, expected.N, expected.K, expected.top_k)


@pytest.mark.parametrize("name", [n for n in MODELS if n not in PRESETS])
def test_dense_layers_are_split_too_and_mla_keeps_its_head_sizes(name):
    """A rank holds 1/tp of every MLP: the dense layers' width (DeepSeek's first layers, Llama-4's
    intermediate_size_mlp) as well; DeepSeek's latent attention gets no head_dim of ours."""
    _, hf = _full(name)
    full = hf.get("text_config", hf)
    rank = rank_config(hf, 8)
    t = rank.get("text_config", rank)
    for key in ("intermediate_size", "intermediate_size_mlp"):
        if key in full:
            assert t[key] == full[key] // 8, key
    assert ("head_dim" in t) == ("head_dim" in full or "qk_nope_head_dim" not in full)


def test_cli_mixtral_rank_says_the_problem_it_runs(tmp_path, capsys):
    out = tmp_path / "rank"
    assert main(["rank-model", "--model-config", str(STYLES / "mixtral-8x7b.config.json"), "--tp", "8",
                 "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert "E=8 experts x N=1792 (intermediate_size per rank), K=4096, top_k 2" in line and "None" not in line
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == 1792


def test_fp8_block_on_a_model_of_another_layout_is_one_line(tmp_path, capsys):
    """--fp8-block declares Qwen's block-FP8 layout; on Mixtral it was a KeyError traceback."""
    out = tmp_path / "rank"
    assert main(["rank-model", "--model-config", str(STYLES / "mixtral-8x7b.config.json"), "--tp", "8",
                 "--fp8-block", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fp8-block declares the layout of Qwen's block-FP8 checkpoints" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("name", MODELS)
def test_the_harness_times_the_problem_shapes_lists(name):
    from autotune.validate.harness import HarnessModel, layer_shapes

    model, _ = _full(name)
    (expected,) = models.expand([model], tps=(8,), dtypes=("bf16",)).problems
    assert layer_shapes(HarnessModel(model), 8).problem == expected


@pytest.mark.parametrize("name", [n for n in MODELS if n not in PRESETS])
def test_install_reads_the_expert_count_shapes_reads(tmp_path, name):
    from autotune.export.install import model_facts

    model, hf = _full(name)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert model_facts(str(tmp_path)).experts == model.num_experts
