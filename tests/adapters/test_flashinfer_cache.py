"""The FlashInfer cache files we write are read by FlashInfer's own loader (on the CPU) exactly as a
file written by its save_configs, and land where SGLang 0.5.23 looks for them."""
import ast
import dataclasses
import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashinfer")

from flashinfer.autotuner import AutoTuner, TunableRunner, _collect_metadata  # noqa: E402

from autotune.export.flashinfer import Parallel, Rank, ServerKey, sglang_cache_path  # noqa: E402
from autotune.adapters.flashinfer_cache import (
    BMM_FP8,
    CUTLASS_MOE_GEMM1,
    CUTLASS_MOE_GEMM2,
    MM_FP4,
    TRTLLM_FP4_MOE,
    CacheEntry,
    metadata_for,
    profiled_shapes,
    tuning_config_for,
    write_cache,
)
from tests.fakes.flashinfer_folders import sglang_path_function  # noqa: E402

M, N, K = 100, 4096, 7168
COLD = ("cuda_graph_profile_replays", 1, "l2_cache_policy", "cold")
CUDNN_TACTIC = (7, ((1, 2), (3, 0)))      # (engine id, sorted (knob type, value) pairs)


def meta(*shape, dtype=torch.uint8):
    return torch.empty(shape, dtype=dtype, device="meta")


def mm_fp4_inputs(m=M):
    """mm_fp4's choose_one inputs (gemm_base.py:9360): a, b, a_sf, b_sf, alpha, out_dtype, out,
    block_size, use_nvfp4, workspace; shapes only."""
    return [meta(m, K // 2), meta(N, K // 2).T, meta(128, K // 16), meta(N, K // 16).T,
            meta(dtype=torch.float32), torch.bfloat16, meta(m, N, dtype=torch.bfloat16), 16, True,
            meta(32 * 1024 * 1024)]


def bmm_fp8_inputs(m=M):
    return [meta(1, m, K, dtype=torch.float8_e4m3fn), meta(1, K, N, dtype=torch.float8_e4m3fn),
            meta(dtype=torch.float32), meta(dtype=torch.float32), meta(1, m, N, dtype=torch.bfloat16),
            meta(32 * 1024 * 1024)]


def moe_inputs(m=M):
    """cutlass_fused_moe's stage inputs (core.py:1058): x, fc1 w, fc1 bias, fc2 w, fc2 bias."""
    return [meta(m, 3584), meta(256, 512, 448), None, meta(256, 7168, 16), None]


def trtllm_moe_inputs(m=M):
    """MoeRunnerInputs order: output, routing_logits, topk_ids, expert_weights, hidden_states,
    hidden_states_scale, gemm1_lora_delta, per_token_scale."""
    return [meta(m, 7168, dtype=torch.bfloat16), meta(m, 256, dtype=torch.float32), None, None,
            meta(m, 3584), meta(m, 448), None, None]


def sizes(inputs):
    return AutoTuner.get()._get_input_sizes(inputs)


class Module:   # type(moe_op).__name__ of a JIT-loaded tvm_ffi module is "Module"
    pass


@pytest.fixture(scope="module")
def runners():
    """FlashInfer's real runner objects, built on the CPU (their JIT modules mocked where they
    would compile), so their class names and cache-key extras are FlashInfer's own."""
    from flashinfer.fused_moe.backends.trtllm import MoERunner as TrtllmMoERunner
    from flashinfer.gemm import gemm_base as gb
    from flashinfer.tllm_enums import DtypeTrtllmGen, Fp8QuantizationType

    mp = pytest.MonkeyPatch()
    module = MagicMock()
    module.get_library_paths.return_value = []
    mp.setattr(gb, "gen_trtllm_gen_gemm_module", lambda enable_rubin=False: module)
    mp.setattr(gb, "setup_cubin_loader", lambda path: None)
    gb._get_trtllm_gemm_module_impl.cache_clear()
    try:
        out = {
            "cudnn_fp4": gb._cudnn_gemm_fp4_runner(tuning_config_for(MM_FP4)),
            "trtllm_fp4": gb._get_trtllm_gemm_module_impl(False).trtllm_fp4_gemm_runner(False),
            "cudnn_fp8": gb._cudnn_gemm_fp8_runner(),
            "cutlass_moe": moe_runner(torch.uint8, 8, 2, 1, tp_rank=1, use_fused_finalize=True),
            "trtllm_moe": TrtllmMoERunner(
                Module(), top_k=8, num_local_experts=256, dtype_act=DtypeTrtllmGen.E2m1,
                dtype_weights=DtypeTrtllmGen.E2m1, fp8_quantization_type=Fp8QuantizationType.NoneFp8,
                hidden_size=7168, intermediate_size=2048),
        }
    finally:
        gb._get_trtllm_gemm_module_impl.cache_clear()
        mp.undo()
    yield out


class CutlassFp4GemmRunner(TunableRunner):
    """Stand-in with the class name of mm_fp4's CUTLASS runner, whose module needs a JIT build."""

    def get_valid_tactics(self, inputs, profile):
        return [0]

    def forward(self, inputs, tactic=-1, do_preparation=False, **kwargs):
        raise NotImplementedError


def trtllm_moe_config():
    return tuning_config_for(TRTLLM_FP4_MOE, input_shapes=sizes(trtllm_moe_inputs()), hidden_size=7168,
                             num_experts=256, tune_max_num_tokens=128)


def cases(runners):
    """(custom_op, runner object, inputs, tuning config, tactic) for every op SGLang tunes."""
    moe_cfg = tuning_config_for(CUTLASS_MOE_GEMM1, tune_max_num_tokens=8192)
    return [
        (MM_FP4, CutlassFp4GemmRunner(), mm_fp4_inputs(), tuning_config_for(MM_FP4), 5),
        (MM_FP4, runners["cudnn_fp4"], mm_fp4_inputs(), tuning_config_for(MM_FP4), CUDNN_TACTIC),
        (MM_FP4, runners["trtllm_fp4"], mm_fp4_inputs(), tuning_config_for(MM_FP4), 21),
        (BMM_FP8, runners["cudnn_fp8"], bmm_fp8_inputs(), tuning_config_for(BMM_FP8), (3, ())),
        (CUTLASS_MOE_GEMM1, runners["cutlass_moe"], moe_inputs(), moe_cfg, 11),
        (CUTLASS_MOE_GEMM2, runners["cutlass_moe"], moe_inputs(), moe_cfg, 40),
        (TRTLLM_FP4_MOE, runners["trtllm_moe"], trtllm_moe_inputs(), trtllm_moe_config(), (16, 4)),
    ]


def entry(op, runner, inputs, cfg, tactic):
    return CacheEntry.from_call(op, type(runner).__name__, sizes(inputs), cfg, tactic,
                                runner.get_cache_key_extras(inputs))


def fresh_tuner():
    return AutoTuner()


# --- keys ----------------------------------------------------------------------------------------

def test_entry_key_is_flashinfers_key(runners):
    for op, runner, inputs, cfg, tactic in cases(runners):
        key = AutoTuner._get_cache_key(op, runner, sizes(inputs), cfg, runner.get_cache_key_extras(inputs))
        e = entry(op, runner, inputs, cfg, tactic)
        assert e.file_key == key.file_key
        assert CacheEntry.from_key(key, tactic, e.policy) == e


def test_mm_fp4_key_format():
    e = CacheEntry.from_call(MM_FP4, "CutlassFp4GemmRunner", sizes(mm_fp4_inputs()), tuning_config_for(MM_FP4), 5)
    # M=100 is served by the bucket 128; scale, out and workspace dims are constrained (-1).
    assert e.file_key == ("('fp4_gemm', 'CutlassFp4GemmRunner', ((128, 3584), (3584, 4096), (-1, 448), "
                          "(448, 4096), (), (0,), (-1, 4096), (0,), (0,), (-1,)), ())")
    assert e.policy == COLD
    assert e.value == ["CutlassFp4GemmRunner", 5, list(COLD)]


def test_profiles_match_keys_flashinfer_shipped():
    """FlashInfer's bundled B200 table was written by its tuner (legacy key without extras): our
    profile of the same call is the one in its keys."""
    spec = importlib.util.find_spec("flashinfer.tuning_configs.v0_1_trtllm_fused_moe_NVIDIA_B200")
    table = ast.literal_eval(Path(spec.origin).read_text().split("=", 1)[1])
    cfg = tuning_config_for(CUTLASS_MOE_GEMM1, tune_max_num_tokens=16384)
    checked = 0
    for key in table:
        op, runner, profile = ast.literal_eval(key)
        e = CacheEntry.from_call(op, runner, profile, cfg, 0)
        assert e.profile == profile
        assert e.file_key == key[:-1] + ", ())"   # 0.7.2 appends the runner's extras
        checked += 1
    assert checked > 10


def test_profiled_shapes_are_the_warmup_buckets():
    shapes = profiled_shapes(tuning_config_for(MM_FP4), sizes(mm_fp4_inputs(M)))
    assert [s[0][0] for s in shapes] == [1, 2, 4, 8, 16, 32, 64, 100]
    moe = profiled_shapes(tuning_config_for(CUTLASS_MOE_GEMM1, tune_max_num_tokens=1024),
                          sizes(moe_inputs(M)))
    assert [s[0][0] for s in moe] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024]


def test_moe_tuning_configs_bucket_like_the_runners_own(runners):
    """tuning_config_for rebuilds the MoE configs FlashInfer's runners build: same profiles, same
    buckets, same policy."""
    from flashinfer.fused_moe.shared.inputs import MoeRunnerInputs
    from flashinfer.tllm_enums import SfLayout

    moe_cls = type(runners["cutlass_moe"])
    moe_cls.refine_tuning_config(4096)
    theirs_cutlass = moe_cls.tuning_config
    theirs_trtllm = runners["trtllm_moe"]._make_tuning_config(
        MoeRunnerInputs.from_list(trtllm_moe_inputs()), tune_max_num_tokens=128,
        hidden_states_scale_layout=SfLayout.layout_linear, use_cold_l2_cache=True, use_cuda_graph=True)
    pairs = [(theirs_cutlass, tuning_config_for(CUTLASS_MOE_GEMM2, tune_max_num_tokens=4096), moe_inputs),
             (theirs_trtllm, trtllm_moe_config(), trtllm_moe_inputs)]
    for theirs, ours, make in pairs:
        assert AutoTuner._profiling_policy(ours) == AutoTuner._profiling_policy(theirs)
        assert profiled_shapes(ours, sizes(make(M))) == profiled_shapes(theirs, sizes(make(M)))
        for m in (1, 3, 100, 129, 700, 3000, 5000, 20000):
            shapes = sizes(make(m))
            assert AutoTuner._find_nearest_profile(shapes, ours) == AutoTuner._find_nearest_profile(shapes, theirs)


def test_cudnn_plan_index_is_refused():
    with pytest.raises(ValueError, match="cuDNN"):
        CacheEntry(MM_FP4, "CudnnFp4GemmRunner", ((1,),), 3)


# --- FlashInfer reads the file -------------------------------------------------------------------

def test_round_trip_through_load_configs(tmp_path, runners):
    entries = [entry(*c) for c in cases(runners)]
    path = tmp_path / "rank_tp0_pp0_dp0.json"
    write_cache(path, entries, _collect_metadata())
    tuner = fresh_tuner()
    assert tuner.load_configs(str(path)) is True
    assert len(tuner._file_configs) == len(entries)
    for e in entries:
        runner, tactic = tuner._file_configs[e.file_key]
        assert runner == e.runner
        assert tactic == e.tactic
        assert tuner._file_config_policies.get(e.file_key) == e.policy


@pytest.mark.parametrize("tuning", [False, True])
def test_flashinfer_serves_our_tactics(tmp_path, runners, tuning):
    """search_cache is what choose_one asks, at serving time and for each warm-up bucket (then
    requiring a matching measurement policy): every op finds our runner and tactic."""
    entries = []
    for op, runner, inputs, cfg, tactic in cases(runners):
        for shapes in profiled_shapes(cfg, sizes(inputs)):
            entries.append(CacheEntry.from_call(op, type(runner).__name__, shapes, cfg, tactic,
                                                runner.get_cache_key_extras(inputs)))
    path = tmp_path / "cache.json"
    write_cache(path, entries, _collect_metadata())
    tuner = fresh_tuner()
    assert tuner.load_configs(str(path))
    tuner.is_tuning_mode = tuning
    for op, runner, inputs, cfg, tactic in cases(runners):
        for shapes in ([sizes(inputs)] + profiled_shapes(cfg, sizes(inputs))):
            hit, idx, got, _ = tuner.search_cache(op, [runner], shapes, cfg, inputs=inputs,
                                                  require_profiling_policy=tuning)
            assert (hit, idx, got) == (True, 0, tactic), (op, type(runner).__name__, shapes)


def test_without_policy_a_cold_l2_op_is_retuned_at_warmup(tmp_path):
    cfg = tuning_config_for(MM_FP4)
    e = CacheEntry.from_call(MM_FP4, "CutlassFp4GemmRunner", sizes(mm_fp4_inputs()), cfg, 5)
    bare = CacheEntry(e.custom_op, e.runner, e.profile, e.tactic, e.extras, policy=None)
    path = tmp_path / "cache.json"
    write_cache(path, [bare], _collect_metadata())
    tuner = fresh_tuner()
    tuner.load_configs(str(path))
    tuner.is_tuning_mode = True
    assert tuner.search_cache(MM_FP4, [CutlassFp4GemmRunner()], sizes(mm_fp4_inputs()), cfg,
                              inputs=mm_fp4_inputs(), require_profiling_policy=True)[0] is False


def test_file_equals_flashinfers_save_configs(tmp_path, runners):
    """The same tuned results saved by FlashInfer itself give a byte-identical file."""
    tuner = fresh_tuner()
    entries = []
    for op, runner, inputs, cfg, tactic in cases(runners):
        key = AutoTuner._get_cache_key(op, runner, sizes(inputs), cfg, runner.get_cache_key_extras(inputs))
        tuner.profiling_cache[key] = (tactic, None)
        tuner._profiling_cache_policies[(None, key)] = AutoTuner._profiling_policy(cfg)
        entries.append(entry(op, runner, inputs, cfg, tactic))
    theirs, ours = tmp_path / "theirs.json", tmp_path / "ours.json"
    tuner.save_configs(str(theirs))
    write_cache(ours, entries, _collect_metadata())
    assert ours.read_text() == theirs.read_text()


@pytest.mark.parametrize("field,value", [("gpu", "NVIDIA H200"), ("flashinfer_version", "0.7.1"),
                                         ("cudnn_version", "91900")])
def test_load_configs_refuses_another_environment(tmp_path, field, value):
    e = CacheEntry.from_call(MM_FP4, "CutlassFp4GemmRunner", sizes(mm_fp4_inputs()), tuning_config_for(MM_FP4), 5)
    path = tmp_path / "cache.json"
    write_cache(path, [e], {**_collect_metadata(), field: value})
    tuner = fresh_tuner()
    assert tuner.load_configs(str(path)) is False
    assert tuner._file_configs == {}


def test_wildcard_metadata_is_accepted(tmp_path):
    e = CacheEntry.from_call(MM_FP4, "CutlassFp4GemmRunner", sizes(mm_fp4_inputs()), tuning_config_for(MM_FP4), 5)
    path = tmp_path / "cache.json"
    write_cache(path, [e], metadata_for({**_collect_metadata(), "gpu": "NVIDIA H200"}, wildcard=["gpu"]))
    assert fresh_tuner().load_configs(str(path)) is True


# --- metadata --------------------------------------------------------------------------------------

def test_metadata_for_recorded_versions():
    here = _collect_metadata()
    assert metadata_for(here) == here
    recorded = {**here, "gpu": "NVIDIA B200", "cudnn_version": 92400}
    del recorded["flashinfer_version"], recorded["cuda_version"]
    recorded.update(flashinfer=here["flashinfer_version"], cuda=here["cuda_version"])  # DeviceInfo names
    got = metadata_for(recorded)
    assert got["gpu"] == "NVIDIA B200" and got["cudnn_version"] == "92400"
    assert got["flashinfer_version"] == here["flashinfer_version"]
    assert list(got) == list(here)


def test_metadata_for_refuses_incomplete_or_foreign_versions():
    here = _collect_metadata()
    partial = {k: v for k, v in here.items() if k != "cublas_version"}
    with pytest.raises(ValueError, match="cublas_version"):
        metadata_for(partial)
    assert metadata_for(partial, wildcard=["cublas_version"])["cublas_version"] == "*"
    with pytest.raises(ValueError, match="FlashInfer 0.6.0"):
        metadata_for({**here, "flashinfer_version": "0.6.0"})
    with pytest.raises(ValueError, match="no metadata field"):
        metadata_for(here, wildcard=["driver"])


# --- writing ---------------------------------------------------------------------------------------

def _entry(m, tactic, runner="CutlassFp4GemmRunner"):
    return CacheEntry.from_call(MM_FP4, runner, sizes(mm_fp4_inputs(m)), tuning_config_for(MM_FP4), tactic)


def test_merge_keeps_existing_entries_and_metadata(tmp_path):
    path = tmp_path / "cache.json"
    first = {**_collect_metadata(), "note": "created by the server"}
    write_cache(path, [_entry(1, 1), _entry(64, 2)], first)
    disk = json.loads(path.read_text())
    disk["_records"] = {"megamoe": {"x": 1}}
    path.write_text(json.dumps(disk))
    write_cache(path, [_entry(64, 7), _entry(256, 3)], _collect_metadata())
    out = json.loads(path.read_text())
    assert out["_metadata"] == first                       # the original "created by" record
    assert out["_records"] == {"megamoe": {"x": 1}}
    assert out[_entry(1, 0).file_key][1] == 1               # kept
    assert out[_entry(64, 0).file_key][1] == 7              # ours win
    assert out[_entry(256, 0).file_key][1] == 3
    tuner = fresh_tuner()
    assert tuner.load_configs(str(path)) and len(tuner._file_configs) == 3


def test_refuses_a_file_of_another_environment(tmp_path):
    path = tmp_path / "cache.json"
    write_cache(path, [_entry(1, 1)], {**_collect_metadata(), "gpu": "NVIDIA H200"})
    before = path.read_bytes()
    with pytest.raises(ValueError, match="different environment.*gpu"):
        write_cache(path, [_entry(1, 2)], {**_collect_metadata(), "gpu": "NVIDIA B200"})
    assert path.read_bytes() == before
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        write_cache(path, [_entry(1, 2)], _collect_metadata())
    assert path.read_text() == "{not json"


def test_indeterminate_file_is_replaced_like_flashinfer_heals_it(tmp_path):
    """A file whose writer could not tell its environment is replaced, as save_configs does."""
    path = tmp_path / "cache.json"
    write_cache(path, [_entry(1, 1)], {**_collect_metadata(), "cudnn_version": "unknown"})
    write_cache(path, [_entry(64, 2)], _collect_metadata())
    out = json.loads(path.read_text())
    assert _entry(1, 0).file_key not in out and _entry(64, 0).file_key in out
    assert out["_metadata"] == _collect_metadata()


def test_failed_write_leaves_the_existing_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    write_cache(path, [_entry(1, 1)], _collect_metadata())
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_cache(path, [_entry(64, 2)], _collect_metadata())
    monkeypatch.undo()
    with pytest.raises(TypeError):   # a tactic JSON cannot hold
        write_cache(path, [_entry(64, object())], _collect_metadata())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json"]   # no temp file left


# --- where SGLang looks ----------------------------------------------------------------------------

class Qwen3MoeConfig:
    pass


@pytest.mark.parametrize("draft", [False, True])
def test_path_is_sglangs(tmp_path, draft):
    ns = sglang_path_function()
    parallel = SimpleNamespace(tp_size=4, pp_size=1, attn_dp_size=2, moe_ep_size=4, tp_rank=3, pp_rank=0,
                               dp_rank=None)
    ns.update(
        torch=SimpleNamespace(cuda=SimpleNamespace(get_device_capability=lambda device: (10, 0))),
        envs=SimpleNamespace(SGLANG_CACHE_DIR=SimpleNamespace(get=lambda: str(tmp_path))),
        get_model=lambda: SimpleNamespace(model_path="nvidia/Qwen3-30B-A3B-FP4", quantization="modelopt_fp4"),
        get_exec=lambda: SimpleNamespace(moe=SimpleNamespace(moe_runner_backend="flashinfer_trtllm"),
                                         kernel=SimpleNamespace(flashinfer_autotune_skip_ops=["fp8_gemm", "bf16_gemm"])),
        get_parallel=lambda: parallel)
    mr = SimpleNamespace(device="cuda", dtype=torch.bfloat16, is_draft_worker=draft,
                         model_config=SimpleNamespace(hf_config=Qwen3MoeConfig(), quantization="modelopt_fp4"))
    theirs = ns["flashinfer_autotune_cache_path"](mr)
    server = ServerKey("nvidia/Qwen3-30B-A3B-FP4", torch.bfloat16, "modelopt_fp4", "flashinfer_trtllm",
                       "Qwen3MoeConfig", Parallel(tp=4, pp=1, attn_dp=2, ep=4), skip_ops=["bf16_gemm", "fp8_gemm"],
                       draft_quantization="modelopt_fp4" if draft else None)
    ours = sglang_cache_path(tmp_path, server, Rank(tp=3, pp=0, dp=None), sm=100)
    assert ours == theirs
    import flashinfer
    assert ours.relative_to(tmp_path).parts[:4] == ("flashinfer", "autotune", flashinfer.__version__, "sm100")
    assert ours.name == "rank_tp3_pp0_dp0.json"
    assert len(ours.parent.name) == 16


def test_path_layout_and_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    server = ServerKey("m", "bfloat16", None, "auto", "C", Parallel(tp=1))
    p = sglang_cache_path(None, server, sm=90)
    assert p.parent.parent == tmp_path / "flashinfer" / "autotune" / __import__("flashinfer").__version__ / "sm90"
    assert p.name == "rank_tp0_pp0_dp0.json"
    # "torch.bfloat16" either way
    assert p == sglang_cache_path(tmp_path, dataclasses.replace(server, dtype=torch.bfloat16), sm=90)
    assert p != sglang_cache_path(tmp_path, dataclasses.replace(server, skip_ops=["fp4_gemm"]), sm=90)
    rank = Rank(dp=2, gpu_uuid="GPU-1")
    assert sglang_cache_path(tmp_path, server, rank, sm=90).name == "rank_tp0_pp0_dp2_gpuGPU-1.json"
    assert sglang_cache_path(tmp_path, server, sm=121).parent.parent.name == "sm121"


@pytest.mark.parametrize("m", [1, 64, 512, 4096])
def test_bmm_fp8_tactic_pins_under_flashinfers_own_key(runners, m):
    """The entry autotune's bmm_fp8 runner writes for a winning tactic is the key FlashInfer's
    fp8_gemm builds for the operands bmm_fp8 passes, runner class included; a batch between
    buckets gets no entry of its own (its bucket's entry serves it)."""
    from autotune.families.fp8_gemm.flashinfer_cudnn import RUNNER

    problem = SimpleNamespace(N=N, K=K)
    [ours] = RUNNER.cache_entries(problem, m, [3, []])        # the tactic as the study stores it (JSON)
    r = runners["cudnn_fp8"]
    inputs = bmm_fp8_inputs(m)
    key = AutoTuner._get_cache_key(BMM_FP8, r, sizes(inputs), tuning_config_for(BMM_FP8),
                                   r.get_cache_key_extras(inputs))
    assert ours.file_key == key.file_key
    assert ours.runner == type(r).__name__ and ours.tactic == (3, ())
    assert RUNNER.cache_entries(problem, 24, [3, []]) == []


@pytest.mark.parametrize("backend", ["cudnn", "cutlass"])
@pytest.mark.parametrize("m", [1, 64, 128])
def test_mm_fp4_tactic_pins_under_flashinfers_own_key(runners, backend, m):
    """SM120's NVFP4 GEMM (no FP4 GPU here): the entry autotune's mm_fp4 runner writes is the key
    FlashInfer's fp4_gemm builds for the operands SGLang's NVFP4 linear passes, extras included."""
    import importlib

    ours_runner = importlib.import_module(f"autotune.families.fp4_gemm.{backend}").RUNNER
    tactic = [3, []] if backend == "cudnn" else 5
    [ours] = ours_runner.cache_entries(SimpleNamespace(N=N, K=K), m, tactic)
    fi = runners["cudnn_fp4"] if backend == "cudnn" else CutlassFp4GemmRunner()
    inputs = mm_fp4_inputs(m)
    key = AutoTuner._get_cache_key(MM_FP4, fi, sizes(inputs), tuning_config_for(MM_FP4), fi.get_cache_key_extras(inputs))
    assert ours.file_key == key.file_key and ours.runner == type(fi).__name__
    assert ours.policy == AutoTuner._profiling_policy(tuning_config_for(MM_FP4))    # cold L2 + graphs: kept


def moe_runner(weight_dtype, top_k, tp_size, ep_size, **kw):
    """The MoERunner cutlass_fused_moe builds, with the arguments SGLang's flashinfer_cutlass call
    passes unless `kw` says otherwise (its JIT module mocked: the key code never reaches it)."""
    from flashinfer.fused_moe import core
    from flashinfer.fused_moe.core import ActivationType

    mp = pytest.MonkeyPatch()
    mp.setattr(core, "gen_cutlass_fused_moe_sm100_module", lambda use_fast_build=False: MagicMock())
    core.get_cutlass_fused_moe_module.cache_clear()
    try:
        return core.get_cutlass_fused_moe_module("100").MoERunner(
            x_dtype=torch.bfloat16, weight_dtype=weight_dtype, output_dtype=torch.bfloat16, top_k=top_k,
            tp_size=tp_size, ep_size=ep_size, ep_rank=0, cluster_size=1, cluster_rank=0,
            enable_alltoall=False, use_deepseek_fp8_block_scale=False, use_w4_group_scaling=False,
            use_mxfp8_act_scaling=False, min_latency_mode=False, enable_pdl=True,
            activation_type=ActivationType.Swiglu, use_packed_weights=False, use_wfp4afp8_humming=False,
            # SGLang: SGLANG_FLASHINFER_MOE_FUSED_FINALIZE, default off
            **{"tp_rank": 0, "use_fused_finalize": False, **kw})
    finally:
        core.get_cutlass_fused_moe_module.cache_clear()
        mp.undo()


@pytest.mark.parametrize("family,m", [("moe_bf16", 1), ("moe_bf16", 64), ("moe_fp4", 8), ("moe_fp4", 512)])
def test_cutlass_moe_pair_pins_gemm1_and_gemm2_under_flashinfers_own_keys(family, m, monkeypatch, request):
    """A winning [gemm1, gemm2] profile pair becomes two entries, keyed as FlashInfer's MoERunner
    keys the two choose_one calls of cutlass_fused_moe for SGLang's operands (bf16 activations,
    bf16 or int64-packed NVFP4 weights), once per (moe TP, moe EP) the problem is served at; a part
    left at -1 is pinned at -1; SGLang's unselectable FP8 variant writes nothing."""
    from autotune.families.moe_backends.flashinfer_cutlass import GEMM_OPS, RUNNERS
    from autotune.problems.models import Problem

    from flashinfer.fused_moe import core

    monkeypatch.setattr(core, "gen_cutlass_fused_moe_sm100_module", lambda use_fast_build=False: MagicMock())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))   # as on a B200
    core.get_cutlass_fused_moe_module.cache_clear()
    request.addfinalizer(core.get_cutlass_fused_moe_module.cache_clear)      # no mocked module left behind
    runner = next(r for r in RUNNERS if r.family == family)
    problem = Problem(512, 128, 4096, 10, "bf16" if family == "moe_bf16" else "nvfp4",
                      sources=(("qwen3.5-397b-a17b", 8, 1, "main"), ("other", 4, 2, "main")))
    entries = runner.cache_entries(problem, m, [7, -1])
    assert len(entries) == 4
    wdtype = torch.bfloat16 if family == "moe_bf16" else torch.int64
    K, N, E = 4096, 128, 512
    w1, w2 = ((E, 2 * N, K), (E, K, N)) if family == "moe_bf16" else ((E, 2 * N, K // 16), (E, K, N // 16))
    inputs = [meta(m, K, dtype=torch.bfloat16), meta(*w1, dtype=wdtype), None, meta(*w2, dtype=wdtype), None]
    cfg = tuning_config_for(CUTLASS_MOE_GEMM1, tune_max_num_tokens=8192)
    want = []
    for tp, ep in ((2, 2), (8, 1)):                    # moe_tp = tp / ep
        fi = moe_runner(wdtype, 10, tp, ep)
        for op in GEMM_OPS:
            want.append(AutoTuner._get_cache_key(op, fi, sizes(inputs), cfg, fi.get_cache_key_extras(inputs)).file_key)
    assert sorted(e.file_key for e in entries) == sorted(want)
    assert sorted(e.tactic for e in entries) == [-1, -1, 7, 7]
    assert runner.cache_entries(problem, 24, [7, -1]) == []        # 24 is served by its bucket's entry
    fp8 = next(r for r in RUNNERS if r.family == "moe_fp8")
    assert fp8.cache_entries(dataclasses.replace(problem, dtype="fp8_w8a8_block"), m, [7, 3]) == []


@pytest.mark.parametrize("m", [1, 8, 128])
def test_sm120_b12x_tactics_are_listed_keyed_and_blocklisted_as_flashinfer_does(m, monkeypatch, tmp_path):
    """SM120's b12x NVFP4 GEMM without an SM120 GPU: autotune's runner lists the tactics FlashInfer's
    own B12xFp4GemmRunner offers for Qwen3.5-397B's TP8 QKV shape (its can_implement checks run on
    the CPU; the SM count is the RTX PRO 6000's 188), in JSON form the study stores; each one's cache
    entry is FlashInfer's key, and a blocklisted one is dropped by FlashInfer's own filter."""
    from flashinfer.autotuner import _json_to_tactic
    from flashinfer.gemm import gemm_base as gb
    from flashinfer.tactics_blocklist import TacticsBlocklist

    from autotune.export import tactics as tactic_files
    from autotune.families.fp4_gemm import Fp4Inputs
    from autotune.families.fp4_gemm.b12x import RUNNER

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (12, 0))
    monkeypatch.setattr(gb, "get_device_sm_count", lambda device: 188)
    n, k = 2560, 4096
    problem = SimpleNamespace(N=n, K=k)
    f32 = dict(dtype=torch.float32)
    # mm_fp4's operands as the runner builds them from FlashInfer's quantizer (packed e2m1, swizzled
    # scales), on the meta device: what its tactic listing reads are shapes and dtypes
    inputs = Fp4Inputs(problem, m, [meta(m, k, dtype=torch.bfloat16)], {}, None, {})
    inputs.cache["operands", 0] = [meta(m, k // 2), meta(n, k // 2).T, meta(-(-m // 128) * 128, k // 16),
                                   meta(n, k // 16).T, meta(**f32), torch.bfloat16,
                                   meta(m, n, dtype=torch.bfloat16), 16, True, meta(gb.DEFAULT_WORKSPACE_SIZE)]
    listed = RUNNER.tactics(inputs)
    fi = gb._b12x_gemm_fp4_runner(12, 0, True, torch.bfloat16, True)
    theirs = fi.get_valid_tactics(RUNNER._operands(inputs, 0), None)
    assert listed[0] == -1 and [_json_to_tactic(t) for t in listed[1:]] == theirs and len(theirs) >= 8
    assert json.loads(json.dumps(listed)) == listed                             # what the study stores
    for t in listed[1:]:
        [e] = RUNNER.cache_entries(problem, m, t)
        key = AutoTuner._get_cache_key(MM_FP4, fi, sizes(RUNNER._operands(inputs, 0)), tuning_config_for(MM_FP4),
                                       fi.get_cache_key_extras(RUNNER._operands(inputs, 0)))
        assert e.file_key == key.file_key and e.tactic == _json_to_tactic(t)
    [(key, bad)] = RUNNER.blocklist_keys(listed[3])                              # "fp4_gemm::B12xFp4GemmRunner"
    path = tmp_path / tactic_files.BLOCKLIST_FILE
    tactic_files.write_blocklist(path, {key: [bad]}, tactic_files.blocklist_metadata("*"))
    bl = TacticsBlocklist()
    assert bl.load(str(path))
    kept = bl.filter(MM_FP4, fi, theirs)
    assert _json_to_tactic(bad) not in kept and len(kept) == len(theirs) - 1


def test_a_tactic_is_measured_pinned_through_flashinfers_cache(runners, monkeypatch):
    """How a tactic runs through SGLang's layer (runner.flashinfer_pin): the cache file holding it is
    loaded as SGLang loads ours, and FlashInfer's choose_one, the call SGLang's path makes, hands
    it out. A pin whose key is not the call's makes FlashInfer fall back to -1, and the launch fails
    as TacticNotRun instead of crediting the tactic with the default's time."""
    from autotune.contract.runner import TacticNotRun, flashinfer_pin

    tuner = fresh_tuner()
    monkeypatch.setattr(AutoTuner, "get", staticmethod(lambda: tuner))
    for op, runner, inputs, cfg, tactic in cases(runners)[4:6]:                 # cutlass_fused_moe gemm1, gemm2
        with flashinfer_pin([entry(op, runner, inputs, cfg, tactic)], [tactic]):
            assert tuner.choose_one(op, [runner], cfg, inputs)[1] == tactic
        assert "choose_one" not in vars(tuner)                                  # FlashInfer's own method again
    op, runner, inputs, cfg, tactic = cases(runners)[0]                          # mm_fp4, CUTLASS
    elsewhere = CacheEntry.from_call(op, type(runner).__name__, [(4096, s[1]) if i == 0 else s
                                                               for i, s in enumerate(sizes(inputs))], cfg, 7)
    with pytest.raises(TacticNotRun, match=r"ran tactic\(s\) \[-1\] in place of \[7\]"):
        with flashinfer_pin([elsewhere], [7]):
            tuner.choose_one(op, [runner], cfg, inputs)
