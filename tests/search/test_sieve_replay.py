"""The NVFP4 sieve on an SM120 GPU we cannot reach, from a replayed outcome set: the hand
investigation's findings on 8x RTX PRO 6000 (trtllm kills the process, CuTe DSL loads and gives NaN,
CUTLASS MoE and cuDNN GEMM work) as measurements, and `autotune run` must reach the hand
investigation's answer by itself, saying what SGLang's `auto` would have done. No SM120 number is
claimed: the times are made up for the test, only their order matters."""
import json

import pytest

from autotune.contract.config import KernelConfig
from autotune.cli import main
from autotune.problems.models import PRESETS, Problem, dense_gemms
from autotune.measure.records import Cache, Measurement, write_cache

RTX = {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "sm": 120, "smem_optin": 101376,
       "versions": {"triton": "3.6.0", "cuda": "13.0"}, "kind": "gpu"}
MS = (1, 8, 64)
CRASH = ("crash", "worker died: killed by SIGKILL (the launch took the process down)")
NAN = ("wrong_result", "4096 of 4096 outputs NaN/Inf or never written (100%; first at (0, 0): nan)")
REFUSED = ("refused", "SGLang's triton MoE runner refused: NotImplementedError: Unsupported moe_runner_backend "
                      "for NVFP4 MoE: triton")
# backend -> (status, reason) or us per M
MOE = {"flashinfer_trtllm": CRASH, "flashinfer_trtllm_routed": CRASH, "flashinfer_cutedsl": NAN, "triton": REFUSED,
       "flashinfer_cutlass": lambda M: 20 + 0.5 * M, "marlin": lambda M: 30 + 0.9 * M}
GEMM = {"cudnn": lambda M: 9 + 0.01 * M, "cutlass": lambda M: 10 + 0.01 * M, "b12x": lambda M: 8.5 + 0.01 * M,
        "marlin": lambda M: 14 + 0.02 * M, "cute-dsl": NAN,
        "trtllm": ("refused", "SGLang's flashinfer_trtllm FP4 GEMM refused: ValueError: ...")}


def _add(cache, key, outcomes):
    for b, what in outcomes.items():
        for M in MS:
            cfg = KernelConfig.from_entry({"backend": b, "tactic": -1})
            if callable(what):
                cache.add(Measurement(key, "layer", M, cfg, "ok", time_us=what(M), spread=0.01, error=0.05, bench_s=0.01))
            else:
                cache.add(Measurement(key, "layer", M, cfg, what[0], reason=what[1]))


def make_cache(path, moe_outcomes=MOE):
    moe = Problem(512, 128, 4096, 10, "nvfp4", batch_sizes=MS)
    gemms = dense_gemms(PRESETS["qwen3.5-397b-a17b"], 8, "nvfp4", MS)
    c = Cache(RTX, problems={p.key: p.to_dict() for p in [moe, *gemms]})
    _add(c, moe.key, moe_outcomes)
    for g in gemms:
        _add(c, g.key, GEMM)
    write_cache(path, c)
    return path


@pytest.fixture
def sm120_cache(tmp_path):
    return make_cache(tmp_path / "sm120_sieve.jsonl.gz")


def run(tmp_path, cache):
    return main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "moe_fp4,fp4_gemm",
                 "--replay", str(cache), "--out", str(tmp_path / "out"), "--storage", f"sqlite:///{tmp_path / 'a.db'}",
                 "--quiet", "--checkpoint", "moe_fp4"])


def test_the_sieve_finds_the_hand_investigations_pair(tmp_path, sm120_cache, capsys):
    assert run(tmp_path, sm120_cache) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "out" / RTX["name"].replace(" ", "_")
    yaml_text = (folder / "server_args.yaml").read_text()
    assert "\nmoe-runner-backend: flashinfer_cutlass\n" in yaml_text
    assert "\nfp4-gemm-backend: flashinfer_cudnn\n" in yaml_text      # b12x is faster, but no flag selects it
    # SGLang 0.5.23's own auto on SM120 (asked of its code): cutlass for both, which works here
    assert "#   auto -> flashinfer_cutlass | picked flashinfer_cutlass" in yaml_text
    assert "#   auto -> flashinfer_cutlass | picked flashinfer_cudnn (1.1" in yaml_text
    # every failure carries its evidence and the prediction it confirms
    assert "#   disqualified flashinfer_trtllm: crash at M=1" in yaml_text and "SIGKILL" in yaml_text
    assert "(expected: known failure on SM120" in yaml_text
    assert "#   disqualified flashinfer_cutedsl: wrong_result at M=1" in yaml_text and "NaN" in yaml_text
    assert "#   disqualified triton: refused at M=1" in yaml_text
    assert "SGLang's --moe-runner-backend auto ->" not in out          # auto works: no warning line
    details = json.loads((folder / "backend_choice.json").read_text())
    assert details["families"]["moe_fp4"]["server_choice"]["decode"]["backend"] == "flashinfer_cutlass"


def test_an_auto_that_fails_is_said_first_with_the_flag_that_works(tmp_path, sm120_cache, capsys, monkeypatch):
    """With an SGLang whose `auto` still resolves NVFP4 MoE to flashinfer_trtllm on SM120 (the field
    report, sglang 39807), the run says so first, in one line, with the flag that works instead."""
    from autotune.contract import capabilities

    real = capabilities.sglang_auto_value
    monkeypatch.setattr(capabilities, "sglang_auto_value",
                        lambda family, sm: "flashinfer_trtllm" if family == "moe_fp4" else real(family, sm))
    assert run(tmp_path, sm120_cache) == 0
    out = capsys.readouterr().out
    [line] = [ln for ln in out.splitlines() if "SGLang's --moe-runner-backend auto ->" in ln]
    assert line.startswith("moe_fp4: SGLang's --moe-runner-backend auto -> flashinfer_trtllm: crash at M=1")
    assert line.endswith("| picked flashinfer_cutlass")
    yaml_text = (tmp_path / "out" / RTX["name"].replace(" ", "_") / "server_args.yaml").read_text()
    assert "#   auto -> flashinfer_trtllm: crash at M=1" in yaml_text


def test_a_backend_that_beats_its_prediction_is_noted(tmp_path, capsys):
    """A CuTe DSL release that fixes SM120 would run correctly where the declaration says NaN: the
    run notes it instead of trusting the table."""
    fixed = make_cache(tmp_path / "fixed.jsonl.gz", {**MOE, "flashinfer_cutedsl": lambda M: 25 + 0.6 * M})
    assert run(tmp_path, fixed) == 0
    out = capsys.readouterr().out
    assert "note: flashinfer_cutedsl ran correctly though its declaration expects it to fail here" in out
