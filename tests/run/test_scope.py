"""`run --dry-run`: the scope and cost said before anything is measured, nothing written."""
import gzip
import json

from autotune.cli import main
from autotune.run.scope import REFERENCE
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


QWEN = ["run", "--shapes", "qwen3.5", "--dry-run"]


def test_dry_run_plans_for_a_named_gpu_on_a_machine_without_one(tmp_path, capsys, monkeypatch):
    """The issue's done-when: on this CPU machine the default scope of qwen3.5 for an H200 is printed with
    a device-time estimate from the H200's own recordings, and the defaults are said with what narrows them."""
    monkeypatch.chdir(tmp_path)
    assert main([*QWEN, "--target-device", "NVIDIA H200"]) == 0
    text = capsys.readouterr().out
    assert "plan for NVIDIA H200 (SM90" in text and "nothing is measured here" in text
    head = next(line for line in text.splitlines() if line.startswith("scope: TP 1,2,4,8; "))
    assert " min of recorded compile and timing seconds (from h200_run_bf16_2026-12-01.jsonl.gz, recorded on " \
           "NVIDIA H200" in head and "borrowed" not in head
    # 27 fused-MoE shapes, one of which SGLang refuses (qwen3.5-35b-a3b's block-FP8 experts at TP 8: 64 per rank)
    assert "triton_moe: 26 problems x 2 GEMMs x batch sizes (18 each) = 936 studies of 40 trials" in text
    assert ("skip triton_moe E=256,N=64,K=2048,topk=8,fp8_w8a8_block: SGLang refuses block-FP8 MoE weights whose "
            "intermediate size per rank (64) is not divisible by the 128x128 weight block") in text
    assert "default scope: the qwen3.5 family" in text and "--tp 8" in text and "--budget 1h" in text
    assert list(tmp_path.iterdir()) == []                          # nothing written, no storage


def test_dry_run_for_a_gpu_without_recordings_says_whose_costs_it_borrows(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert main([*QWEN, "--target-device", name]) == 0
    text = capsys.readouterr().out
    assert f"plan for {name} (SM120, 101376 B" in text
    assert (f"h200_run_bf16_2026-12-01.jsonl.gz, borrowed from NVIDIA H200: no Triton MoE recording of {name} is "
            "committed") in text
    assert f"borrowed from NVIDIA H200: no backend recording of {name}" in text
    assert "fp4_gemm: " in text                                   # SM120 runs the FP4 families the H200 cannot
    assert list(tmp_path.iterdir()) == []


def test_a_target_device_must_be_known_and_only_plans(tmp_path, capsys):
    assert main([*QWEN, "--target-device", "NVIDIA GeForce 256"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    from autotune.gpus.catalog import CATALOG
    assert len(err) == 1 and "is not a GPU autotune can plan for; known: " in err[0]
    assert all(repr(g.name) in err[0] for g in CATALOG)          # the catalog, every name
    assert main(["run", "--shapes", "qwen3.5", "--target-device", "NVIDIA H200", "--out", str(tmp_path / "o")]) == 2
    assert "--target-device needs --dry-run" in capsys.readouterr().err and not (tmp_path / "o").exists()
