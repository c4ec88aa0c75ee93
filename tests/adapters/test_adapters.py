"""Every door of autotune/adapters/ opens on the installed SGLang and FlashInfer: a release that moves
one of their internals fails here, on the CPU, instead of on a GPU in the middle of a run."""
from __future__ import annotations

import pytest

from autotune.adapters import flashinfer_gemm, flashinfer_tuner, sglang_server


def test_a_tactic_survives_flashinfers_own_json_round_trip():
    tactic = (3, (128, 64), "sm90")
    as_json = flashinfer_tuner.tactic_to_json(tactic)
    assert as_json == [3, [128, 64], "sm90"]
    assert flashinfer_tuner.json_to_tactic(as_json) == tactic


def test_flashinfers_metadata_names_its_own_version():
    meta = flashinfer_tuner.metadata_fields()
    assert meta["flashinfer_version"] == flashinfer_tuner.version()
    assert "gpu" in meta                           # the field a blocklist keeps while the rest are "*"


def test_the_tuning_configs_bucket_batch_sizes_as_flashinfer_does():
    """M=1 is a bucket of its own for both ops (the pinned entries at M=1 depend on it), and a batch
    between buckets is another bucket's, which is its own (the runners write no entry for it)."""
    for cfg in (flashinfer_gemm.fp4_tuning_config(), flashinfer_gemm.fp8_tuning_config()):
        to_bucket = cfg.dynamic_tensor_specs[0].map_to_tuning_buckets
        assert to_bucket(1) == 1
        assert to_bucket(3) != 3 and to_bucket(to_bucket(3)) == to_bucket(3)
    assert flashinfer_gemm.workspace_size() > 0


def test_the_gemm_runners_private_names_exist_in_this_flashinfer():
    from flashinfer.gemm import gemm_base

    for name in ("_cudnn_gemm_fp4_runner", "_b12x_gemm_fp4_runner", "get_cutlass_fp4_gemm_module",
                 "_cudnn_gemm_fp8_runner", "get_gemm_module", "_get_cache_buf"):
        assert callable(getattr(gemm_base, name)), name


def test_the_tuner_reads_input_sizes_from_the_operands():
    import torch

    assert flashinfer_tuner.input_sizes([torch.empty(3, 4, device="meta"), torch.empty(5, device="meta")]) == \
        ((3, 4), (5,))


def test_flashinfers_declarations_answer_for_its_public_calls():
    assert flashinfer_tuner.declares_support("no_such_call", None, 90) is False
    assert flashinfer_tuner.declares_support("mm_fp4", "cudnn", 120) in (True, False)
    assert flashinfer_tuner.blocklist_type().__name__ == "TacticsBlocklist"


def test_sglangs_flag_values_are_its_own_lists():
    flags = sglang_server.flag_choices(("--moe-runner-backend", "--dtype"))
    assert flags["--moe-runner-backend"] == list(sglang_server.choices_list("MOE_RUNNER_BACKEND_CHOICES"))
    assert "triton" in flags["--moe-runner-backend"] and "bfloat16" in flags["--dtype"]
    with pytest.raises(AttributeError):
        sglang_server.choices_list("NO_SUCH_LIST")


def test_sglangs_compile_caches_follow_its_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    folders = sglang_server.compile_cache_defaults()
    assert folders["TRITON_CACHE_DIR"].startswith(str(tmp_path))
    assert {"SGLANG_DG_CACHE_DIR", "SGLANG_CUTE_AOT_CACHE_DIR"} <= set(folders)


def test_sglangs_server_parser_and_config_classes_are_reached():
    assert sglang_server.server_args_preparer().__name__ == "prepare_server_args"
    names = sglang_server.registered_config_classes()
    assert names and all(isinstance(n, str) and "Config" in n for n in names)
