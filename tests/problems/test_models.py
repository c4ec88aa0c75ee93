import json

import pytest

from autotune.problems import models
from autotune.cli import main


def test_qwen35_family_tp8_shapes_follow_sglang_naming():
    exp = models.expand(models.select_models("qwen3.5"), tps=(8,), dtypes=("bf16",))
    got = {(p.E, p.N, p.K, p.top_k) for p in exp.problems}
    # E = experts / ep, N = moe_intermediate_size / tp (w2.shape[2]), K = hidden size
    assert got == {(512, 128, 4096, 10), (256, 128, 3072, 8), (256, 64, 2048, 8)}
    p397 = next(p for p in exp.problems if p.E == 512)
    assert ("qwen3.5-397b-a17b", 8, 1, "mtp") in p397.sources   # the MTP draft layer's MoE rides along


def test_family_over_all_tps_reports_files_shared_by_two_models():
    exp = models.expand(models.select_models("qwen3.5"), tps=(1, 2, 4, 8), dtypes=("bf16",))
    keys = [p.file_key for p in exp.problems]
    assert len(keys) == len(set(keys))                  # one problem per SGLang file
    # 35B at tp1 (N=512, K=2048) lands on 122B tp2's file (N=512, K=3072)
    shared = exp.shared[(256, 512, "bf16")]
    assert shared[0].K == 2048 and any(s[0] == "qwen3.5-35b-a3b" for s in shared[0].sources)


def test_ep_divides_experts_and_moe_tp_is_tp_over_ep():
    (p,) = models.expand([models.PRESETS["qwen3.5-397b-a17b"]], tps=(8,), eps=(8,)).problems
    assert (p.E, p.N, p.ep) == (64, 1024, 8)


@pytest.mark.parametrize("tp", [3, 16 * 1024])
def test_tp_that_does_not_divide_intermediate_is_rejected(tp):
    with pytest.raises(models.ModelError, match="does not divide"):
        models.expand([models.PRESETS["qwen3.5-35b-a3b"]], tps=(tp,))


def test_hf_config_text_config_and_other_key_spellings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["X"], "text_config": {"hidden_size": 7168, "n_routed_experts": 256,
                                                "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                                                "num_hidden_layers": 61, "num_nextn_predict_layers": 1}}))
    m = models.model_from_hf_config(tmp_path)
    assert (m.num_experts, m.top_k, m.moe_intermediate_size, m.hidden_size, m.mtp_layers) == (256, 8, 2048, 7168, 1)


def test_mixtral_style_config_uses_intermediate_size(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"hidden_size": 4096, "num_local_experts": 8, "num_experts_per_tok": 2,
                             "intermediate_size": 14336}))
    assert models.model_from_hf_config(f).moe_intermediate_size == 14336


@pytest.mark.parametrize("argv, msg", [
    (["shapes", "--model", "qwen9-huge"], "unknown model preset"),
    (["shapes", "--shapes", "llama"], "unknown shape family"),
    (["shapes", "--model", "qwen3.5-35b-a3b", "--tp", "3"], "does not divide"),
    (["shapes", "--tp", "two"], "comma-separated list of integers"),
    (["shapes", "--dtype", "fp4"], "unknown dtype"),
])
def test_bad_selection_is_one_line_and_exit_2(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_config_without_moe_fields_exits_2(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4096, "intermediate_size": 11008}))
    assert main(["shapes", "--model-config", str(tmp_path)]) == 2
    assert "no MoE fields" in capsys.readouterr().err


def test_shapes_prints_admitted_configs_per_architecture(capsys):
    assert main(["shapes", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16",
                 "--target-sm", "90", "--target-sm", "120"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("512"))
    sm90, sm120 = line.split("|")[1:3]
    # SM120's ~99 KB admits far fewer configs than SM90's 227 KB
    up90, up120 = int(sm90.split("/")[0]), int(sm120.split("/")[0])
    assert 0 < up120 < up90
