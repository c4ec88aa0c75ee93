"""`run --dry-run`: the scope and cost said before anything is measured, nothing written."""
import gzip
import json

from autotune.cli import main
from autotune.scope import REFERENCE
from tests.conftest import GRID

BASE = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe"]


def _recording(path, costs, compile_workers):
    """A measurement recording in the file format (gzip JSON lines): the H200 run's header with
    `compile_workers` in its notes, then per recorded (GEMM, M) one measurement per entry of `costs`
    ({status, bench_s, compile_s}), each of another config."""
    with gzip.open(REFERENCE, "rt") as f:
        header = json.loads(f.readline())
    header["notes"] = {"compile_workers": compile_workers}
    [(key, problem)] = header["problems"].items()
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(header) + "\n")
        for gemm in ("gate_up", "down"):
            for M in problem["batch_sizes"]:
                for i, cost in enumerate(costs):
                    row = {"problem": key, "gemm": gemm, "M": M, "reason": "", "time_us": 10.0, "spread": 0.01,
                           "error": 0.0, "samples": 7, **cost,
                           "config": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32 * (i + 1), "BLOCK_SIZE_K": 64,
                                      "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}}
                    f.write(json.dumps(row) + "\n")


def test_dry_run_counts_the_studies_and_prices_them_from_the_recording(tmp_path, capsys):
    out = tmp_path / "out"
    # A measurement costs its timing seconds plus its compile seconds shared by the recording's 4
    # compilers; failed measurements are not in the mean: (0.6 + 1.6 / 4) and (1.0 + 0 / 4) -> 1.0 s each.
    rec = tmp_path / "rec.jsonl.gz"
    _recording(rec, [{"status": "ok", "bench_s": 0.6, "compile_s": 1.6},
                     {"status": "ok", "bench_s": 1.0, "compile_s": 0.0},
                     {"status": "compile_error", "reason": "out of resources", "bench_s": 50.0, "compile_s": 50.0}], 4)
    assert main(BASE + ["--replay", str(rec), "--dry-run", "--out", str(out), "--trials", "10",
                        "--storage", f"sqlite:///{tmp_path / 'a.db'}"]) == 0
    text = capsys.readouterr().out
    # 18 batch sizes x 2 GEMMs = 36 studies; 10 trials, each at its M and one neighbour each side,
    # plus 10 careful re-measurements per M: 1260 measurements of 1.0 s = 21 min
    assert "36 studies of 10 trials" in text and "1260 measurements planned, ~21 min of recorded" in text
    assert not out.exists() and not (tmp_path / "a.db").exists()


def test_a_budget_below_the_estimate_is_said(tmp_path, capsys):
    assert main(BASE + ["--replay", str(GRID), "--dry-run", "--budget", "5s", "--out", str(tmp_path / "o")]) == 0
    assert "--budget 5 s stops it before that" in capsys.readouterr().out


def test_no_gpu_and_no_replay_is_one_line(tmp_path, capsys):
    assert main(BASE + ["--dry-run", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no GPU visible" in err[0] and not (tmp_path / "o").exists()


FP8_GEMM = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "fp8_gemm", "--batch-sizes", "1,8,64,512",
            "--replay", str(REFERENCE.parent / "h200_fp8_gemm_2026-12-01.jsonl.gz"), "--dry-run"]


def test_backend_runs_count_flashinfers_tactics(tmp_path, capsys):
    """The H200 fp8_gemm run of these 4 shapes x 4 M made 544 measurements, most of them tactics of the
    cuBLAS and cuDNN runners: an estimate of defaults only (128) was 4x short."""
    assert main(FP8_GEMM + ["--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "for its 2 backends with tactics" in text and "544 measurements planned" in text
    assert main(FP8_GEMM + ["--out", str(tmp_path / "o"), "--skip-backends", "flashinfer_cudnn"]) == 0
    text = capsys.readouterr().out
    assert "for its 1 backend with tactics" in text and f"{16 * (8 + 13)} measurements planned" in text
