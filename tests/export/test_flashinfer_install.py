"""`autotune install`: a tuned folder's FlashInfer cache lands in every rank's file exactly where
SGLang 0.5.23 looks (its own path code), as identical bytes, merged with what SGLang tuned there
before, and FlashInfer's loader accepts each file."""
import json

import pytest
import torch
from flashinfer.autotuner import AutoTuner
from flashinfer.autotuner.autotuner import _collect_metadata

from autotune.cli import main
from autotune.adapters.flashinfer_cache import CacheEntry, write_cache
from autotune.export.tactics import CACHE_FILE
from tests.fakes.flashinfer_folders import model_folder, sglang_path, tuned_folder


def test_every_rank_gets_the_same_file_where_sglang_reads_it(tmp_path, capsys):
    folder, model, cache = tuned_folder(tmp_path), model_folder(tmp_path), tmp_path / "cache"
    assert main(["install", str(folder), "--model-path", str(model), "--tp", "2", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    paths = [sglang_path(cache, model, r) for r in (0, 1)]
    assert all(p.is_file() and str(p) in out for p in paths)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert AutoTuner().load_configs(str(paths[0]))
    assert "FLASHINFER_TACTICS_BLOCKLIST=" in out


def test_entries_sglang_tuned_before_are_kept_in_every_rank(tmp_path):
    folder, model, cache = tuned_folder(tmp_path), model_folder(tmp_path), tmp_path / "cache"
    rank1 = sglang_path(cache, model, 1)
    meta = {k: "*" for k in _collect_metadata()}
    write_cache(rank1, [CacheEntry("fp8_gemm", "CublasFp8GemmRunner", ((8, 128),), 2)], meta)
    assert main(["install", str(folder), "--model-path", str(model), "--tp", "2", "--cache-dir", str(cache)]) == 0
    files = [json.loads(sglang_path(cache, model, r).read_text()) for r in (0, 1)]
    assert files[0] == files[1]
    runners = sorted(v[0] for k, v in files[0].items() if not k.startswith("_"))
    assert runners == ["CublasFp8GemmRunner", "CutlassFp4GemmRunner"]


def test_a_rank_file_of_another_environment_stops_it_and_nothing_changes(tmp_path, capsys):
    folder, model, cache = tuned_folder(tmp_path), model_folder(tmp_path), tmp_path / "cache"
    rank1 = sglang_path(cache, model, 1)
    rank1.parent.mkdir(parents=True, exist_ok=True)    # SGLang's path code makes the folder
    other = {k: "*" for k in _collect_metadata()}
    other["flashinfer_version"] = "0.1.0"
    rank1.write_text(json.dumps({"_metadata": other, "x": ["R", 1]}))
    before = rank1.read_bytes()
    assert main(["install", str(folder), "--model-path", str(model), "--tp", "2", "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "another environment" in err and "Traceback" not in err
    assert rank1.read_bytes() == before and not sglang_path(cache, model, 0).exists()


@pytest.mark.parametrize("case,message", [
    ("no_cache", "has no flashinfer_autotune_cache.json"),
    ("hub_name", "not a local model folder: pass --hf-config-class"),
    ("no_runner", "no moe-runner-backend line"),
])
def test_bad_input_is_one_line(tmp_path, capsys, case, message):
    folder, model, cache = tuned_folder(tmp_path), model_folder(tmp_path), tmp_path / "cache"
    if case == "no_cache":
        (folder / CACHE_FILE).unlink()
    if case == "hub_name":
        model = "Qwen/Qwen3.5-397B-A17B"
    if case == "no_runner":
        (folder / "server_args.yaml").write_text("fp4-gemm-backend: flashinfer_cudnn\n")
    assert main(["install", str(folder), "--model-path", str(model), "--tp", "2", "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not cache.exists()


def test_every_value_sglang_takes_is_installed_where_sglang_reads_it(tmp_path, capsys):
    """install checks --moe-runner-backend, --quantization and --dtype against the installed SGLang's
    own parser: each of its real values is still taken (a new release's too: the lists are SGLang's),
    and lands where SGLang's path code looks (--dtype half is torch.float16 there)."""
    from autotune.validate.sglang_commands import SERVER_MODULE
    from autotune.validate.sglang_parsers import sglang_parser

    actions = sglang_parser(SERVER_MODULE).parser._option_string_actions
    folder, model, cache = tuned_folder(tmp_path), model_folder(tmp_path), tmp_path / "cache"
    base = ["install", str(folder), "--model-path", str(model), "--tp", "2", "--cache-dir", str(cache)]
    assert "flashinfer_cutlass" in actions["--moe-runner-backend"].choices
    for runner in actions["--moe-runner-backend"].choices:
        if runner == "flashinfer_megamoe":        # its files carry each GPU's UUID: refused (install-runner-megamoe)
            assert main([*base, "--moe-runner-backend", runner]) == 2 and "GPU's UUID" in capsys.readouterr().err
            continue
        assert main([*base, "--moe-runner-backend", runner]) == 0, capsys.readouterr().err
        assert sglang_path(cache, model, 1, runner=runner).is_file(), runner
    for quant in ("fp8", "none"):
        assert main([*base, "--quantization", quant]) == 0, capsys.readouterr().err
        assert sglang_path(cache, model, 0, quantization=None if quant == "none" else quant).is_file(), quant
    for dtype, torch_dtype in (("half", torch.float16), ("float32", torch.float32)):
        assert main([*base, "--dtype", dtype]) == 0, capsys.readouterr().err
        assert sglang_path(cache, model, 0, dtype=torch_dtype).is_file(), dtype
    assert main([*base, "--hf-config-class", "Qwen3_5MoeConfig", "--ep", "2", "--attn-dp", "2"]) == 0


def test_a_quantization_autotune_cannot_name_is_taken_from_the_flag(tmp_path, capsys):
    """GPT-OSS's checkpoints say quant_method mxfp4, which autotune has no SGLang name for: without
    --quantization install says to pass it, and with it installs (the model folder was refused
    whatever the flag said, although the line asked for the flag)."""
    folder, model, cache = tuned_folder(tmp_path), model_folder(tmp_path), tmp_path / "cache"
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (model / "config.json").write_text(json.dumps(cfg))
    base = ["install", str(folder), "--model-path", str(model), "--tp", "2", "--cache-dir", str(cache)]
    assert main(base) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "quantization 'mxfp4' is not one autotune knows" in err[0] and "--quantization" in err[0]
    assert not cache.exists()
    assert main([*base, "--quantization", "mxfp4"]) == 0, capsys.readouterr().err
    assert sglang_path(cache, model, 0, quantization="mxfp4").is_file()
