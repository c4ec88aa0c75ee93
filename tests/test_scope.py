"""`run --dry-run`: the scope and cost said before anything is measured, nothing written."""
from autotune.cli import main
from autotune.scope import REFERENCE, mean_cost
from autotune.records import read_cache
from tests.conftest import GRID

BASE = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe"]


def test_dry_run_counts_the_studies_and_prices_them_from_the_recording(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(BASE + ["--replay", str(REFERENCE), "--dry-run", "--out", str(out), "--trials", "10",
                        "--storage", f"sqlite:///{tmp_path / 'a.db'}"]) == 0
    text = capsys.readouterr().out
    # 18 batch sizes x 2 GEMMs = 36 studies; 10 trials, each at its M and one neighbour each side,
    # plus 10 careful re-measurements per M
    n = 36 * 10 * 3 + 18 * 10
    assert "36 studies of 10 trials" in text and f"{n} measurements planned" in text
    cost = n * mean_cost(read_cache(REFERENCE))
    assert f"~{cost / 60:.0f} min" in text or f"~{cost:.0f} s" in text
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
