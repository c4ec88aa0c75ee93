"""`autotune run --kernels ...` for backend choice, end to end against a replayed cache."""
import json
import re
from pathlib import Path

import pytest

from autotune.contract.config import KernelConfig
from autotune.cli import main
from autotune.export import server_args
from autotune.problems.models import Problem
from autotune.measure.records import Cache, Measurement, write_cache

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
            c.add(Measurement(p.key, "layer", M, KernelConfig.from_entry({"backend": b, "tactic": -1}), "ok", time_us=f(M), spread=0.01,
                              error=1e-3, bench_s=0.01))
    path = tmp_path / "h200_moe_bf16.jsonl.gz"
    write_cache(path, c)
    return path


def _run(tmp_path, cache_path, *extra):
    storage = [] if "--storage" in extra else ["--storage", f"sqlite:///{tmp_path / 'a.db'}"]   # one each
    return main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "moe_bf16,fp4_gemm",
                 "--replay", str(cache_path), "--out", str(tmp_path / "out"), *storage, "--quiet", *extra])


def test_decode_mix_picks_cutlass_and_writes_server_args(tmp_path, cache_path, capsys):
    assert _run(tmp_path, cache_path) == 0
    out = capsys.readouterr().out
    assert "not on this device: fp4_gemm" in out and "SM90" in out        # listed once, with why
    yaml_text = (tmp_path / "out/NVIDIA_H200/server_args.yaml").read_text()
    assert "\nmoe-runner-backend: flashinfer_cutlass\n" in yaml_text
    assert "#   auto -> triton | picked flashinfer_cutlass (1." in yaml_text     # SGLang's auto beside the pick
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


def test_a_rerun_with_other_backends_available_resumes_the_same_studies(tmp_path, cache_path, capsys):
    """What may run changes between runs (--skip-backends, a package installed since): the studies
    hold every declared backend, so the second run resumes them instead of failing in Optuna."""
    assert _run(tmp_path, cache_path, "--skip-backends", "flashinfer_cutlass") == 0
    capsys.readouterr()
    assert _run(tmp_path, cache_path) == 0
    assert "\nmoe-runner-backend: flashinfer_cutlass\n" in (tmp_path / "out/NVIDIA_H200/server_args.yaml").read_text()


def test_unknown_skipped_backend_exits_2(tmp_path, cache_path, capsys):
    assert _run(tmp_path, cache_path, "--skip-backends", "flashinfer_cutlas") == 2
    assert "--skip-backends: unknown backend 'flashinfer_cutlas'" in capsys.readouterr().err
    for bad, line in (("moe_bf17:triton", "unknown family 'moe_bf17'"),
                      ("moe_bf16:marlin", "unknown backend 'marlin' for moe_bf16")):
        assert _run(tmp_path, cache_path, "--skip-backends", bad) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and line in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_backend_is_skipped_in_one_family_only(tmp_path, cache_path):
    """moe_bf16:flashinfer_cutlass leaves out the bf16 CUTLASS MoE (a JIT build this machine cannot
    afford) and nothing else: the other families keep theirs."""
    from autotune.run.opening import skipped_backends

    skip = skipped_backends("moe_bf16:flashinfer_cutlass, marlin")
    assert skip["moe_bf16"] == ("flashinfer_cutlass",) and skip["moe_fp4"] == ("marlin",)
    assert skip["moe_fp8"] == ("marlin",) and skip["fp4_gemm"] == ("marlin",) and skip["fp8_gemm"] == ()
    assert _run(tmp_path, cache_path, "--skip-backends", "moe_bf16:flashinfer_cutlass") == 0
    details = json.loads((tmp_path / "out/NVIDIA_H200/backend_choice.json").read_text())
    assert details["families"]["moe_bf16"]["server_choice"]["decode"]["skipped"]["flashinfer_cutlass"] == \
        "left out by --skip-backends"


# --- one folder collects the families of several runs -----------------------------------------

FP8_GEMM_GPU = Path(__file__).parents[2] / "benchmarks/data/h200_fp8_gemm_2026-12-01.jsonl.gz"


def _fp8_gemm_run(out, db):
    return main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "fp8_gemm", "--replay",
                 str(FP8_GEMM_GPU), "--out", str(out), "--storage", f"sqlite:///{db}", "--quiet"])


@pytest.mark.slow      # three whole runs; the same merge (server_args.merge) is quick in the merge-choices test
def test_a_later_run_of_another_family_keeps_the_moe_choice(tmp_path, cache_path):
    assert _run(tmp_path, cache_path) == 0                                  # moe_bf16 (+ fp4_gemm, not here)
    assert _fp8_gemm_run(tmp_path / "out", tmp_path / "b.db") == 0         # the H200's recorded fp8_gemm
    folder = tmp_path / "out/NVIDIA_H200"
    values = server_args.read_values(folder / "server_args.yaml")
    assert values == {"moe-runner-backend": "flashinfer_cutlass", "fp8-gemm-backend": "triton"}
    details = json.loads((folder / "backend_choice.json").read_text())
    assert list(details["families"]) == ["fp8_gemm", "moe_bf16"] and details["checkpoint"] == "moe_bf16"
    fp8 = details["families"]["fp8_gemm"]["server_choice"]["decode"]
    assert fp8["backend"] == "triton" and fp8["sglang_values"]["torch_scaled_mm"] is None
    # a re-run of one family replaces its section only
    assert _run(tmp_path, cache_path, "--mix", "prefill", "--storage", f"sqlite:///{tmp_path / 'c.db'}") == 0
    values = server_args.read_values(folder / "server_args.yaml")
    assert values == {"moe-runner-backend": "triton", "fp8-gemm-backend": "triton"}
    text = (folder / "server_args.yaml").read_text()
    assert text.count("measured on replay") == 2 and "prefill mix (M >= 512)" in text


def test_a_folder_of_another_gpu_or_unreadable_is_refused_and_kept(tmp_path, cache_path, capsys):
    folder = tmp_path / "out/NVIDIA_H200"
    folder.mkdir(parents=True)
    other = {"device": {"name": "NVIDIA B200", "sm": 100, "smem_optin": 232448}, "date": "x", "families": {}}
    mangled = {**other, "device": H200, "families": {"moe_fp8": {"server_choice": {}}}}
    for text, msg in ((json.dumps(other), "holds choices for NVIDIA B200, not NVIDIA H200"),
                      ("{not json", "cannot be read"), (json.dumps(mangled), "without a readable choice")):
        (folder / "backend_choice.json").write_text(text)
        assert _run(tmp_path, cache_path) == 2
        out, err = capsys.readouterr()
        assert msg in err and err.count("\n") == 1
        assert "moe_bf16 E=512" not in out                        # refused before anything was measured
        assert (folder / "backend_choice.json").read_text() == text and not (folder / "server_args.yaml").exists()


def test_merge_choices_folds_separate_runs_into_one_file(tmp_path, cache_path, capsys):
    assert _run(tmp_path / "a", cache_path) == 0
    assert _fp8_gemm_run(tmp_path / "b", tmp_path / "b.db") == 0
    # files written before sections stored their SGLang values and provenance still merge
    old = tmp_path / "b/NVIDIA_H200/backend_choice.json"
    d = json.loads(old.read_text())
    for entry in d["families"].values():
        entry.pop("measured"), entry.pop("chosen_mix")
        for rec in entry["server_choice"].values():
            rec.pop("sglang_values")
    old.write_text(json.dumps(d))
    assert main(["merge-choices", str(tmp_path / "a/out/NVIDIA_H200"), str(old), "--out", str(tmp_path / "m")]) == 0
    yaml_path = tmp_path / "m/NVIDIA_H200/server_args.yaml"
    assert server_args.read_values(yaml_path) == {"moe-runner-backend": "flashinfer_cutlass",
                                                  "fp8-gemm-backend": "triton"}
    # the old file's "not selectable" tags come from the backend table
    assert re.search(r"torch_scaled_mm: [0-9.]+ us \(1\.[0-9]+x the chosen\)  \[not selectable in SGLang\]",
                     yaml_path.read_text())
    before = yaml_path.read_text()
    empty, broken = tmp_path / "empty.json", tmp_path / "broken.json"
    empty.write_text(json.dumps({"device": {"name": "NVIDIA H200", "sm": 90, "smem_optin": 1}, "families": {}}))
    broken.write_text('{"device": ')
    for src, msg in ((empty, "holds no backend choices"), (broken, "cannot be read"), (tmp_path / "nope", "no such")):
        assert main(["merge-choices", str(src), "--out", str(tmp_path / "m")]) == 2
        assert msg in capsys.readouterr().err and yaml_path.read_text() == before


def test_careful_remeasurements_are_recorded_and_replayed(tmp_path, cache_path):
    """Backend choice re-times its finalists with more repeats and decides on those numbers; the
    record keeps them apart, so a replay of the record makes the GPU run's decisions again."""
    from autotune.measure.records import read_cache

    c = read_cache(cache_path)
    for m in list(c.records.values()):                 # re-timed: triton is the faster one everywhere
        if m.config["backend"] == "flashinfer_cutlass":
            c.add(Measurement(**{**m.__dict__, "time_us": TIMES["triton"](m.M) * 1.1, "samples": 21}), careful=True)
    write_cache(cache_path, c)
    rec = tmp_path / "rec.jsonl.gz"
    assert _run(tmp_path, cache_path, "--record", str(rec)) == 0
    first = (tmp_path / "out/NVIDIA_H200/server_args.yaml").read_text()
    assert "\nmoe-runner-backend: triton\n" in first           # the careful numbers decided, not the first pass
    again = read_cache(rec)
    # every careful number the run decided on is in its record (triton's: the first pass, all this cache had)
    assert {k: again.careful[k].time_us for k in c.careful} == {k: m.time_us for k, m in c.careful.items()}
    assert len(again.careful) == 2 * len(MS)
    assert _run(tmp_path / "2", rec, "--storage", f"sqlite:///{tmp_path / 'r.db'}") == 0
    second = (tmp_path / "2/out/NVIDIA_H200/server_args.yaml").read_text()
    def numbers(text):   # all but the lines naming a date or the folder
        return [l for l in text.splitlines() if not l.startswith(("# autotune:", "# load with:", "#   measured on"))]
    assert numbers(second) == numbers(first) and "#   flashinfer_cutlass: 49.1 us (1.100x the chosen)" in first


def test_several_recordings_replay_as_one_and_unrecorded_backends_say_so(tmp_path, cache_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "moe_bf16,fp8_gemm",
                 "--replay", f"{cache_path},{FP8_GEMM_GPU}", "--out", str(out),
                 "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--quiet"]) == 0
    text = (out / "NVIDIA_H200/server_args.yaml").read_text()
    assert server_args.read_values(out / "NVIDIA_H200/server_args.yaml") == {
        "moe-runner-backend": "flashinfer_cutlass", "fp8-gemm-backend": "triton"}
    # deep_gemm was never recorded (not installed on the H200 that made the recording)
    assert "#   skipped deep_gemm: not in the replay cache" in text
    assert main(["run", "--kernels", "moe_bf16", "--replay", f"{cache_path},{tmp_path / 'nope.jsonl.gz'}",
                 "--out", str(out)]) == 2
    assert "measurement cache not found" in capsys.readouterr().err


def test_a_run_of_decode_batch_sizes_only_says_the_prefill_mix_was_not_measured(tmp_path, capsys):
    # Found on the H200: `--batch-sizes 1,64` left the prefill mix with zero totals and the run died
    # dividing by them, after writing FlashInfer's files but before server_args.yaml.
    assert main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "fp8_gemm", "--batch-sizes", "1,64",
                 "--replay", str(FP8_GEMM_GPU), "--out", str(tmp_path / "out"),
                 "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "decode mix: triton" in out and "prefill mix: no batch size of it measured" in out
    folder = tmp_path / "out/NVIDIA_H200"
    assert server_args.read_values(folder / "server_args.yaml") == {"fp8-gemm-backend": "triton"}
    choice = json.loads((folder / "backend_choice.json").read_text())["families"]["fp8_gemm"]["server_choice"]
    assert choice["prefill"]["backend"] is None and choice["prefill"]["gain_vs_auto"] is None


def test_a_recording_read_again_is_its_current_content_and_each_reader_owns_its_copy(cache_path):
    """read_cache keeps what it parsed for later runs in the same process: a rewritten file is read
    anew, and what one reader adds is not in the next reader's cache."""
    from autotune.measure.records import read_cache

    first = read_cache(cache_path)
    n = len(first.records)
    extra = Measurement("E=1,N=1,K=1,topk=1,bf16", "layer", 1, KernelConfig.from_entry({"backend": "triton", "tactic": -1}), "ok",
                        time_us=1.0)
    first.add(extra)
    first.device["name"] = "changed by its reader"
    second = read_cache(cache_path)
    assert len(second.records) == n and second.device["name"] == "NVIDIA H200"
    write_cache(cache_path, first)                  # the file itself changes: the next read sees it
    third = read_cache(cache_path)
    assert len(third.records) == n + 1 and third.device["name"] == "changed by its reader"
