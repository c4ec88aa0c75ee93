"""`autotune run --kernels ...` for backend choice, end to end against a replayed cache."""
import json

import pytest

from autotune.cli import main
from autotune.models import Problem
from autotune.records import Cache, Measurement, write_cache

H200 = {"name": "NVIDIA H200", "sm": 90, "smem_optin": 232448, "versions": {"triton": "3.6.0", "cuda": "13.0"},
        "kind": "gpu"}
MS = (1, 8, 64, 512, 4096)
# us per M: flashinfer_cutlass wins small M, triton large M; auto (triton) is the baseline
TIMES = {"triton": lambda M: 10 + 0.2 * M, "flashinfer_cutlass": lambda M: 8 + 0.25 * M}


@pytest.fixture
def cache_path(tmp_path):
    p = Problem(512, 128, 4096, 10, "bf16", batch_sizes=MS)
    c = Cache(H200, problems={p.key: p.to_dict()})
    for b, f in TIMES.items():
        for M in MS:
            c.add(Measurement(p.key, "layer", M, {"backend": b, "tactic": -1}, "ok", time_us=f(M), spread=0.01,
                              error=1e-3, bench_s=0.01))
    path = tmp_path / "h200_moe_bf16.jsonl.gz"
    write_cache(path, c)
    return path


def _run(tmp_path, cache_path, *extra):
    return main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "moe_bf16,fp4_gemm",
                 "--replay", str(cache_path), "--out", str(tmp_path / "out"),
                 "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--quiet", *extra])


def test_decode_mix_picks_cutlass_and_writes_server_args(tmp_path, cache_path, capsys):
    assert _run(tmp_path, cache_path) == 0
    out = capsys.readouterr().out
    assert "not on this device: fp4_gemm" in out and "SM90" in out        # listed once, with why
    yaml_text = (tmp_path / "out/NVIDIA_H200/server_args.yaml").read_text()
    assert "\nmoe-runner-backend: flashinfer_cutlass\n" in yaml_text
    assert "gain over SGLang's auto (triton)" in yaml_text
    details = json.loads((tmp_path / "out/NVIDIA_H200/backend_choice.json").read_text())
    per_m = details["families"]["moe_bf16"]["E=512,N=128,K=4096,topk=10,bf16"]["per_M"]
    assert per_m["1"]["config"]["backend"] == "flashinfer_cutlass" and per_m["4096"]["config"]["backend"] == "triton"


def test_prefill_mix_picks_triton(tmp_path, cache_path):
    assert _run(tmp_path, cache_path, "--mix", "prefill") == 0
    assert "\nmoe-runner-backend: triton\n" in (tmp_path / "out/NVIDIA_H200/server_args.yaml").read_text()


def test_unknown_family_and_nothing_runnable_exit_2(tmp_path, cache_path, capsys):
    assert main(["run", "--kernels", "fp3_gemm", "--replay", str(cache_path), "--out", str(tmp_path)]) == 2
    assert "unknown kernel family 'fp3_gemm'" in capsys.readouterr().err
    assert main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "fp4_gemm,moe_fp4",
                 "--replay", str(cache_path), "--out", str(tmp_path)]) == 2
    assert "nothing to tune on this device" in capsys.readouterr().err


def test_skipped_backend_is_never_measured_and_says_why(tmp_path, cache_path, capsys):
    # flashinfer_cutlass wins the decode mix above; left out, it is recorded as skipped, not chosen.
    assert _run(tmp_path, cache_path, "--skip-backends", "flashinfer_cutlass") == 0
    assert "\nmoe-runner-backend: triton\n" in (tmp_path / "out/NVIDIA_H200/server_args.yaml").read_text()
    details = json.loads((tmp_path / "out/NVIDIA_H200/backend_choice.json").read_text())
    choice = details["families"]["moe_bf16"]["server_choice"]["decode"]
    assert choice["skipped"]["flashinfer_cutlass"] == "left out by --skip-backends"
    per_m = details["families"]["moe_bf16"]["E=512,N=128,K=4096,topk=10,bf16"]["per_M"]
    assert {c["config"]["backend"] for c in per_m.values()} == {"triton"}


def test_unknown_skipped_backend_exits_2(tmp_path, cache_path, capsys):
    assert _run(tmp_path, cache_path, "--skip-backends", "flashinfer_cutlas") == 2
    assert "--skip-backends: unknown backend 'flashinfer_cutlas'" in capsys.readouterr().err
