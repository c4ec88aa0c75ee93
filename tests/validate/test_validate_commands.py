"""The command lines `autotune validate --engine sglang` builds, parsed by SGLang's own parsers:
launch_server through sglang.srt.server_args.prepare_server_args (imported; --config merged by
SGLang's ConfigArgumentMerger), sglang.benchmark.serving and .one_batch_server through their
cli_main (imported where they import; on this CPU machine executed from their source text)."""
import json

import pytest

from autotune.validate import CommandError, ModelDirError
from autotune.validate.sglang_commands import (
    ONE_BATCH_MODULE,
    SERVING_MODULE,
    BenchClient,
    compile_cache_env,
    one_batch_command,
    prepare_cache_dir,
    server_command,
    server_env,
    serving_command,
)
from autotune.validate.sglang_inputs import inspect_configs, inspect_model_dir
from autotune.validate.sglang_parsers import parse_command, sglang_parser
from autotune.validate.sglang_server import ServerValidation, interleaved_order


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "Qwen3.5-397B-A17B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe"}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).write_text("{}")
    return d


@pytest.fixture
def configs(tmp_path):
    d = tmp_path / "tuned_configs" / "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
    (d / "configs" / "triton_3_5_1").mkdir(parents=True)
    (d / "configs" / "triton_3_5_1" / "E=512,N=128,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"
     ).write_text("{}")
    (d / "server_args.yaml").write_text("# autotune: ...\nmoe-runner-backend: flashinfer_cutlass\n")
    fi = d / "flashinfer" / "autotune" / "0.7.2" / "sm120" / "0123456789abcdef"
    fi.mkdir(parents=True)
    (fi / "rank_tp0_pp0_dp0.json").write_text("{}")
    (d / "provenance.json").write_text("{}")
    return d


def test_model_dir_with_only_config_and_tokenizer_gets_dummy_weights(model, tmp_path):
    md = inspect_model_dir(model)
    assert md.load_format == "dummy" and md.weight_files == ()
    ns = parse_command(server_command(md, 31234, tp=8))
    assert (ns.model_path, ns.load_format, ns.tp_size, ns.port, ns.host, ns.config) == \
        (str(model), "dummy", 8, 31234, "127.0.0.1", None)
    (model / "model-00001-of-00002.safetensors").write_bytes(b"")
    md = inspect_model_dir(model)
    cmd = server_command(md, 31234)
    assert "--load-format" not in cmd and parse_command(cmd).load_format == "auto"


def test_bad_model_dirs(tmp_path):
    with pytest.raises(ModelDirError, match="does not exist"):
        inspect_model_dir(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ModelDirError, match="not valid JSON"):
        inspect_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelDirError, match="no tokenizer files"):
        inspect_model_dir(tmp_path)


def test_tuned_side_gets_the_config_yaml_merged_by_sglang(model, configs):
    c = inspect_configs(configs)
    assert c.moe_files and c.server_args and c.flashinfer_cache == configs.resolve() and c.folder.has_provenance()
    md = inspect_model_dir(model)
    base = parse_command(server_command(md, 30001))
    tuned = parse_command(server_command(md, 30001, config_yaml=c.server_args,
                                         extra_args=("--mem-fraction-static", "0.8")))
    assert base.moe_runner_backend == "auto"                 # SGLang's default
    assert tuned.moe_runner_backend == "flashinfer_cutlass"  # from server_args.yaml, via SGLang's merger
    assert tuned.mem_fraction_static == 0.8
    # everything else is the same on both sides (SGLang's merger consumes --config itself)
    diff = {k for k in vars(base) if vars(base)[k] != vars(tuned)[k]}
    assert diff == {"moe_runner_backend", "mem_fraction_static"}


def test_server_environments(configs, tmp_path):
    c = inspect_configs(configs)
    base_env = {"SGLANG_CACHE_DIR": str(tmp_path / "user-cache"), "SGLANG_MOE_CONFIG_DIR": "/somewhere/else"}
    b = server_env("baseline", c, tmp_path / "b", base_env)
    t = server_env("tuned", c, tmp_path / "t", base_env)
    assert b["SGLANG_MOE_CONFIG_DIR"] is None                 # removed: SGLang's built-in folder
    assert t["SGLANG_MOE_CONFIG_DIR"] == str(configs.resolve())
    assert (b["SGLANG_CACHE_DIR"], t["SGLANG_CACHE_DIR"]) == (str(tmp_path / "b"), str(tmp_path / "t"))
    pinned = compile_cache_env(base_env)
    assert pinned["TRITON_CACHE_DIR"] == str(tmp_path / "user-cache" / "triton")
    assert pinned["SGLANG_DG_CACHE_DIR"] == str(tmp_path / "user-cache" / "deep_gemm")
    for k, v in pinned.items():
        assert b[k] == t[k] == v                             # both sides share the compile caches
    prepare_cache_dir("tuned", c, tmp_path / "t")
    prepare_cache_dir("baseline", c, tmp_path / "b")
    copied = tmp_path / "t/flashinfer/autotune/0.7.2/sm120/0123456789abcdef/rank_tp0_pp0_dp0.json"
    assert copied.is_file() and not any((tmp_path / "b").iterdir())


def test_serving_command_is_what_sglang_serving_parses(model, tmp_path):
    md = inspect_model_dir(model)
    cmd = serving_command(BenchClient("http://127.0.0.1:30001", md, 1024, 256), 32, num_prompts=128,
                          warmup_requests=4, output_file=tmp_path / "c32.jsonl")
    ns = parse_command(cmd)
    assert ns.backend == "sglang" and ns.base_url == "http://127.0.0.1:30001"
    assert (ns.dataset_name, ns.random_input_len, ns.random_output_len, ns.random_range_ratio) == \
        ("random-ids", 1024, 256, 1.0)
    assert (ns.max_concurrency, ns.num_prompts, ns.warmup_requests) == (32, 128, 4)
    assert ns.tokenize_prompt and ns.flush_cache and ns.request_rate == float("inf")
    assert ns.output_file == str(tmp_path / "c32.jsonl") and ns.tokenizer == str(model)
    how = sglang_parser(SERVING_MODULE).how
    assert how == "imported" or ("source text" in how and "does not import here" in how)


def test_one_batch_command_is_what_sglang_one_batch_server_parses(model, tmp_path):
    md = inspect_model_dir(model)
    cmd = one_batch_command(BenchClient("http://127.0.0.1:30001", md, input_len=1024, output_len=256),
                            result_file=tmp_path / "ob.jsonl", run_name="tuned-r1")
    ns = parse_command(cmd)
    assert (ns.batch_size, ns.input_len, ns.output_len) == ([1], [1024], [256])
    assert ns.base_url == "http://127.0.0.1:30001" and ns.dataset_name == "random-ids"
    assert ns.result_filename == str(tmp_path / "ob.jsonl") and ns.run_name == "tuned-r1"
    assert ns.model_path == str(model) and ns.append_to_github_summary is False
    # its parser is ServerArgs + BenchArgs: a server flag is known to it too
    assert parse_command(cmd + ["--tp-size", "2"]).tp_size == 2


@pytest.mark.parametrize("module,bad", [
    (SERVING_MODULE, ["--max-concurency", "8"]),
    (SERVING_MODULE, ["--dataset-name", "random_ids"]),
    (ONE_BATCH_MODULE, ["--model-path", "m", "--batch-size", "one"]),
    ("sglang.launch_server", ["--model-path", "m", "--load-format", "dumy"]),
])
def test_sglang_parsers_refuse_wrong_arguments(module, bad):
    with pytest.raises(CommandError, match="refuses"):
        parse_command(["python", "-m", module, *bad])


def test_every_command_of_a_validation_parses(model, configs, tmp_path):
    v = ServerValidation(model=inspect_model_dir(model), configs=inspect_configs(configs), work_dir=tmp_path / "w",
                         concurrencies=(1, 8, 256), repeats=2, tp=4)
    how = v.check_commands()
    assert set(how) == {"sglang.launch_server", SERVING_MODULE, ONE_BATCH_MODULE}
    cmds = v.commands("tuned", 1, 30007)
    assert len(cmds) == 1 + 1 + 3                            # server, one_batch, three concurrencies
    assert "--config" in cmds[0] and "--config" not in v.commands("baseline", 1, 30007)[0]
    assert [parse_command(c).num_prompts for c in cmds[2:]] == [8, 32, 1024]
    assert interleaved_order(3) == [(0, "baseline"), (0, "tuned"), (1, "tuned"), (1, "baseline"),
                                    (2, "baseline"), (2, "tuned")]
