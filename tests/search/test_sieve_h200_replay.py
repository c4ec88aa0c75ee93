"""The H200 sieve of 2026-12-04 (benchmarks/data/h200_sieve_2026-12-04{c,d}.jsonl.gz, real timings and
failures recorded through SGLang 0.5.23's layers), replayed: the run must reach the verdict the GPU
run reached, by itself. Two things it found that no table held: SGLang's experimental_sgl_marlin
"beat" auto's marlin by 1.001x, inside the timings' noise, so auto must be kept and the reason said;
and SGLang's own fp8 marlin MoE path dies with an AttributeError whose evidence names the SGLang line."""
import json
from pathlib import Path

import pytest

from autotune.cli import main

DATA = Path(__file__).resolve().parents[2] / "benchmarks/data"


# two device calls of session 18: in the first SGLang's `cutlass` MoE runner hung (killed at 150 s),
# in the second it was refused at once; the verdict is the same
@pytest.mark.parametrize("record", ["h200_sieve_2026-12-04c.jsonl.gz", "h200_sieve_2026-12-04d.jsonl.gz"])
def test_the_h200_sieve_replayed_keeps_auto_inside_noise(tmp_path, capsys, record):
    rc = main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "moe_fp4,fp4_gemm,moe_bf16,moe_fp8",
               "--batch-sizes", "1,64", "--skip-backends", "moe_bf16:flashinfer_cutlass",
               "--replay", str(DATA / record), "--out", str(tmp_path / "out"), "--storage", f"sqlite:///{tmp_path / 'a.db'}",
               "--checkpoint", "moe_fp4", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    folder = tmp_path / "out" / "NVIDIA_H200"
    text = (folder / "server_args.yaml").read_text()
    assert "\nmoe-runner-backend: marlin\n" in text
    assert "\nfp4-gemm-backend: marlin\n" in text
    assert "picked marlin (experimental_sgl_marlin 1.00" in text and "faster, within noise)" in text
    assert "kept over experimental_sgl_marlin (faster by less than the noise)" in out
    # the failure's evidence points into SGLang, not into autotune
    assert "disqualified marlin: runtime_error at M=1" in text
    assert "(raised at sglang/srt/layers/quantization/fp8.py:" in text
    # SGLang's listed values that no declaration covers all failed here: one note naming them, not fourteen
    [note] = [ln for ln in text.splitlines() if "nothing declared expects them to" in ln and "aiter" in ln]
    assert "lora_cutedsl" in note and "megamoe" in note and "flashinfer_trtllm" not in note   # declared: not a surprise
    choice = json.loads((folder / "backend_choice.json").read_text())["families"]["moe_fp4"]["server_choice"]
    assert choice["decode"]["backend"] == "marlin"
    assert choice["decode"]["within_noise"] == "experimental_sgl_marlin"
