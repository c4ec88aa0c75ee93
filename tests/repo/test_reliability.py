"""Every bad input of docs/RELIABILITY.md: one line on stderr naming the input and what is wrong,
the documented exit code, no traceback, every file that existed byte-identical afterwards and no
tuned file written. Run in-process (`autotune.cli.main`): an uncaught exception fails the test.

The cases that need a process of their own (signals, a storage server, concurrent runs) are in
tests/run/test_shared_study.py; docs/RELIABILITY.md names the test of every case, and the last test
here checks that the table and the tests agree."""
import gzip
import json
import re
from pathlib import Path

import pytest

from autotune.cli import main
from tests.conftest import GRID, ROOT
from tests.fakes.command_lines import EXPORT, small_run, without, worked_storage, write_file
from tests.fakes.tuned_folders import file_hashes, git_state, serving_repo

FULL_SPACE = (ROOT / "search_spaces/triton_moe.yaml").read_text()
RUNS_023 = ROOT / "benchmarks/data/h200_sglang023_arms_2026-12-02.tgz"     # SGLang 0.5.23's arms on the H200


def _cache_header(name="NVIDIA B200", sm=100) -> str:
    return json.dumps({"kind": "autotune-measurement-cache", "version": 1, "device": {
        "name": name, "sm": sm, "smem_optin": 232448, "versions": {"triton": "3.6.0"}}, "problems": {}, "notes": {}}) + "\n"


def _gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt") as f:
        f.write(text)
    return path


def _kernels(argv: list, kernels: str) -> list:
    """`argv` with --kernels KERNELS in place of its own (a flag given twice is refused)."""
    i = argv.index("--kernels")
    return [*argv[:i + 1], kernels, *argv[i + 2:]]


def _tuned(t, corrupt=None):
    """A tuned folder as `run` + `validate --gate` leave it, one of its JSON files then cut short."""
    from tests.fakes.tuned_folders import tuned
    folder = tuned(t, "tuned", {1: 10.0})
    if corrupt:
        (folder / corrupt).write_text('{"files": {')
    return folder


# id -> (argv from the temp folder (which it may fill with the bad input), exit code, what the line says)
CASES = {
    "record-not-a-cache": (lambda t: small_run(t, "--record", write_file(t / "notes.txt", "my notes\n")),
                           2, "refusing to overwrite it"),
    "record-other-gpu": (lambda t: small_run(t, "--record", str(_gz(t / "b200.jsonl.gz", _cache_header()))),
                         2, "holds measurements of NVIDIA B200"),
    "record-truncated": (lambda t: small_run(t, "--record", _cut(GRID, t / "cut.jsonl.gz")), 2, "refusing to overwrite it"),
    "config-json-list": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", "[1, 2]")],
                         2, "holds a list, not a JSON object"),
    "config-json-binary": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", b"\x89PNG\x00\xff")],
                           2, "config.json"),
    "replay-truncated": (lambda t: small_run(t, replay=False) + ["--replay", _cut(GRID, t / "cut.jsonl.gz")], 2, "cut.jsonl.gz"),
    "replay-empty-name": (lambda t: small_run(t, replay=False) + ["--replay", f"{GRID},"], 2, "empty name"),
    "replay-missing": (lambda t: small_run(t, replay=False) + ["--replay", str(t / "nothing.jsonl.gz")], 2, "nothing.jsonl.gz"),
    "space-unknown-key": (lambda t: small_run(t, "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "  num_warps:", "  BLOCK_SIZE_Q: [1]\n  num_warps:"))), 2, "unknown parameter(s) ['BLOCK_SIZE_Q']"),
    "space-not-integer": (lambda t: small_run(t, "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "BLOCK_SIZE_M: [16,", "BLOCK_SIZE_M: [sixteen,"))), 2, "BLOCK_SIZE_M must hold positive integers"),
    "space-missing-key": (lambda t: small_run(t, "--search-space", write_file(t / "s.yaml", re.sub(
        r"  GROUP_SIZE_M: .*\n", "", FULL_SPACE))), 2, "no ladder for ['GROUP_SIZE_M']"),
    "space-nothing-runs": (lambda t: small_run(t, "--search-space", write_file(t / "s.yaml", (
        "family: triton_moe\nparams:\n  BLOCK_SIZE_M: [256]\n  BLOCK_SIZE_N: [256]\n  BLOCK_SIZE_K: [256]\n"
        "  GROUP_SIZE_M: [1]\n  num_warps: [4]\n  num_stages: [5]\n"))), 2, "no gate_up config of it runs on NVIDIA H200"),
    "batch-sizes-repeated": (lambda t: small_run(t, bs="1,1,8,8"), 2, "lists a value twice"),
    "batch-size-absurd": (lambda t: small_run(t, bs="100000000"), 2, "100000000 is above 131072"),
    "batch-size-not-recorded": (lambda t: small_run(t, bs="3"), 2, "the replay recorded none of batch sizes 3"),
    "neighbours-negative": (lambda t: small_run(t, "--neighbours", "-1"), 2, "--neighbours must be at least 0"),
    "workers-zero": (lambda t: small_run(t, "--workers", "0"), 2, "--workers must be at least 1"),
    "trials-zero": (lambda t: small_run(t, "--trials", "0"), 2, "--trials must be at least 1"),
    "budget-unreadable": (lambda t: small_run(t, "--budget", "soon"), 2, "--budget"),
    "kernel-unknown": (lambda t: _kernels(small_run(t), "fp3_gemm"), 2, "unknown kernel family 'fp3_gemm'"),
    "out-is-a-file": (lambda t: [*small_run(t)[:-8], "--out", write_file(t / "f", "x"), "--storage", f"sqlite:///{t}/a.db",
                                 "--replay", str(GRID), "--batch-sizes", "8"], 2, "is not writable"),
    "json-is-a-folder": (lambda t: small_run(t, "--json", str(t)), 2, "is a folder"),
    "no-gpu-no-replay": (lambda t: small_run(t, replay=False), 2, "no GPU visible and no --replay"),
    "sglang-version-unknown": (lambda t: small_run(t, "--sglang-version", "0.4.0"), 2, "0.4.0"),
    "storage-not-a-database": (lambda t: [*small_run(t)[:-8], "--out", str(t / "out"), "--storage",
                                          f"sqlite:///{write_file(t / 'x.db', 'not a database')}", "--replay", str(GRID),
                                          "--batch-sizes", "8"], 2, "x.db"),
    "publish-validation-malformed": (lambda t: ["publish", "--to", str(serving_repo(t)), "--from",
                                                str(_tuned(t, "validation.json"))], 2, "validation.json"),
    "publish-provenance-malformed": (lambda t: ["publish", "--to", str(serving_repo(t)), "--from",
                                                str(_tuned(t, "provenance.json"))], 2, "provenance.json"),
    "publish-path-is-a-file": (lambda t: ["publish", "--to", str(serving_repo(t)), "--from", str(_tuned(t)),
                                          "--path", "README"], 2, "README"),
    "merge-choices-out-is-a-file": (lambda t: ["merge-choices", str(_tuned(t)), "--out", write_file(t / "f", "x")],
                                    2, "is a file"),
    "check-no-provenance": (lambda t: ["check", str(_dir(t / "empty"))], 2, "provenance.json"),
    "model-unknown": (lambda t: ["shapes", "--model", "qwen9-huge"], 2, "unknown model preset"),
    "shape-family-unknown": (lambda t: ["shapes", "--shapes", "llama"], 2, "unknown shape family"),
    "tp-not-dividing": (lambda t: ["shapes", "--model", "qwen3.5-35b-a3b", "--tp", "3"], 2, "does not divide"),
    "dtype-unknown": (lambda t: ["shapes", "--dtype", "fp4"], 2, "unknown dtype"),
    "config-no-moe-fields": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", json.dumps(
        {"hidden_size": 4096, "intermediate_size": 11008}))], 2, "no MoE fields"),
    "skip-backend-unknown": (lambda t: _kernels(small_run(t, bs=None)[:-6], "moe_bf16") + [
        "--replay", str(ROOT / "benchmarks/data/h200_backends_2026-12-01.jsonl.gz"),
        "--skip-backends", "flashinfer_cutlas"], 2, "unknown backend 'flashinfer_cutlas'"),
    "rank-model-tp-does-not-split": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "3", "--out",
                                                str(t / "rank")], 2, "does not split"),
    "rank-model-fp8-block-not-dividing": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "16",
                                                     "--fp8-block", "--out", str(t / "rank")], 2,
                                          "mlp.experts has moe_intermediate_size = 64 per rank"),
    "rank-model-out-holds-weights": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--out",
                                                str(_weights(t / "real"))], 2, "holds weight files"),
    "validate-model-no-config": (lambda t: ["validate", "--engine", "sglang", "--model-path", str(_dir(t / "model")),
                                            "--configs", str(_tuned(t))], 2, "has no config.json"),
    "validate-empty-configs": (lambda t: ["validate", "--engine", "sglang", "--model-path", str(_model(t / "model")),
                                          "--configs", str(_dir(t / "empty"))], 2, "holds nothing SGLang would load"),
    "warm-start-other-family": (lambda t: small_run(t, "--warm-start", str(ROOT / "benchmarks/data/h200_backends_2026-12-01.jsonl.gz")),
                                2, "holds no triton_moe measurements to start from"),
    "warm-start-missing": (lambda t: small_run(t, "--warm-start", str(t / "nothing.jsonl.gz")), 2, "nothing.jsonl.gz"),
    "only-drifted-no-provenance": (lambda t: without(small_run(t, "--only-drifted", str(_dir(t / "folder"))),
                                                      "--model", "--tp", "--dtype", "--batch-sizes"), 2,
                                   "--only-drifted: "),
    "storage-read-only": (lambda t: [*small_run(t)[:-8], "--out", str(t / "out"), "--storage",
                                     f"sqlite:///file:{_sqlite_db(t / 'ro.db')}?mode=ro&uri=true", "--replay", str(GRID),
                                     "--batch-sizes", "8"], 2, "is read-only (mode=ro): it cannot hold a run"),
    "storage-read-only-studies": (lambda t: [*small_run(t)[:-8], "--out", str(t / "out"), "--storage",
                                             f"sqlite:///file:{_optuna_db(t / 'ro.db')}?mode=ro&uri=true", "--replay",
                                             str(GRID), "--batch-sizes", "8"], 2, "is read-only (mode=ro): it cannot hold a run"),
    # issue 23: inputs none of the rows above named, each now refused by construction
    "config-text-config-list": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", json.dumps(
        {"text_config": [1, 2]}))], 2, "text_config holds a list, not a JSON object"),
    "config-layers-not-an-integer": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", json.dumps(
        {**MOE_CONFIG, "num_hidden_layers": "sixty"}))], 2, "num_hidden_layers = 'sixty'"),
    "config-experts-bool": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", json.dumps(
        {**MOE_CONFIG, "num_experts": True}))], 2, "num_experts = True"),
    "config-top-k-above-experts": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", json.dumps(
        {**MOE_CONFIG, "num_experts_per_tok": 200}))], 2, "top_k 200 is above the number of experts 128"),
    "target-sm-unknown": (lambda t: ["shapes", "--target-sm", "75"], 2, "--target-sm must be a known compute capability"),
    "space-is-a-folder": (lambda t: small_run(t, "--search-space", str(_dir(t / "spaces"))), 2, "is a folder"),
    "rank-model-out-is-a-file": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--out",
                                            write_file(t / "f", "x")], 2, "is a file"),
    "rank-model-out-users-folder": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--out",
                                               str(_model(t / "mine"))], 2, "not a file autotune wrote"),
    "record-shard-unreadable": (lambda t: ["record", "--cache", str(t / "c.jsonl.gz"), "--shard", "abc"], 2,
                                "--shard must look like i/n"),
    "record-shard-out-of-range": (lambda t: ["record", "--cache", str(t / "c.jsonl.gz"), "--shard", "3/2"], 2,
                                  "--shard must have 0 <= i < n"),
    "merge-caches-out-users-file": (lambda t: ["merge-caches", str(GRID), "-o", write_file(t / "notes.txt", "mine\n")], 2,
                                    "not a file autotune wrote"),
    "compile-limits-out-users-json": (lambda t: ["compile-limits", "--target-sm", "120", "--model", "qwen3.5-35b-a3b",
                                                 "--out", write_file(t / "mine.json", "{}")], 2, "not a file autotune wrote"),
    "device-name-over-users-file": (lambda t: small_run(t, "--device-name", "NVIDIA H200 NVL") if _users_sku_file(t) else [],
                                    2, "not a file autotune wrote"),
    "out-empty": (lambda t: small_run(t, "--out", ""), 2, "--out must name a path"),
    "timeout-negative": (lambda t: small_run(t, "--timeout", "-1"), 2, "--timeout must be above 0"),
    "skew-nan": (lambda t: small_run(t, "--skew", "nan"), 2, "--skew must be a finite number"),
    "validate-min-effect-negative": (lambda t: ["validate", "--engine", "harness", "--model", "qwen3.5-35b-a3b",
                                                "--min-effect", "-1"], 2, "--min-effect must be at least 0"),
    "budget-no-unit": (lambda t: small_run(t, "--budget", "20"), 2, "--budget has no unit in '20'"),
    "validate-engine-mix-up": (lambda t: ["validate", "--engine", "harness", "--configs", str(_dir(t / "empty"))],
                               2, "needs one of --model"),
    # issue 23, second sweep (at 260a431): refused by construction (autotune/fileio/reading.py, inputs.py, storage.py)
    "config-nested-too-deep": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", _deep("{\"a\": ", "}"))],
                               2, "is not valid JSON: nested too deeply to read"),
    "space-nested-too-deep": (lambda t: small_run(t, "--search-space", write_file(t / "s.yaml", "family: triton_moe\nparams: "
                                                                         + _deep("[", "]", 5000))),
                              2, "not valid YAML: nested too deeply to read"),
    "replay-nested-too-deep": (lambda t: small_run(t, replay=False) + ["--replay", str(_gz(t / "r.jsonl.gz", _header_of(GRID)
                                                                                       + _deep("[", "]") + "\n"))],
                               2, "nested too deeply to read"),
    "warm-start-nested-too-deep": (lambda t: small_run(t, "--warm-start", str(_gz(t / "w.jsonl.gz", _header_of(GRID)
                                                                               + _deep("[", "]") + "\n"))),
                                   2, "--warm-start: "),
    "config-a-fifo": (lambda t: ["shapes", "--model-config", _fifo(t / "config.json")], 2, "is not a regular file"),
    "config-folder-holds-a-fifo": (lambda t: ["shapes", "--model-config", str(Path(_fifo(t / "config.json")).parent)],
                                   2, "is not a regular file"),
    "space-a-fifo": (lambda t: ["shapes", "--search-space", _fifo(t / "s.yaml")], 2, "is not a regular file"),
    "replay-a-fifo": (lambda t: small_run(t, replay=False) + ["--replay", _fifo(t / "r.jsonl.gz")], 2, "is not a regular file"),
    "json-out-a-fifo": (lambda t: small_run(t, "--json", _fifo(t / "summary.json")), 2, "is not a regular file"),
    "json-out-dangling-link": (lambda t: small_run(t, "--json", _link(t / "summary.json", t / "gone.json")), 2,
                               "which does not exist: not replaced"),
    "space-ladder-of-lists": (lambda t: ["shapes", "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "num_warps: [4, 8]", "num_warps: [[4], 8]"))], 2, "a ladder holds numbers or true/false, got [4]"),
    "space-ladder-of-mappings": (lambda t: ["shapes", "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "num_warps: [4, 8]", "num_warps: [{a: 1}, 8]"))], 2, "a ladder holds numbers or true/false, got {'a': 1}"),
    "space-arch-misspelt": (lambda t: ["shapes", "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "  sm120:", "  sm_120:"))], 2, "arch.sm_120 is not an architecture section"),
    "space-arch-never-read": (lambda t: ["shapes", "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "  sm120:", "  sm121:"))], 2, "arch.sm121 is never read: SM121 devices read section sm120"),
    "space-gemm-misspelt": (lambda t: ["shapes", "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "  gate_up:", "  gate_upp:"))], 2, "gemm_params names unknown GEMM(s) ['gate_upp']"),
    "validate-server-args-unbalanced-quote": (lambda t: ["validate", "--engine", "sglang", "--model-path", str(t),
                                                         "--configs", str(t), "--server-args", '--x "0.85'],
                                              2, "--server-args is not a list of arguments (no closing quotation)"),
    "validate-python-missing": (lambda t: ["validate", "--engine", "sglang", "--model-path", str(t), "--configs", str(t),
                                           "--python", str(t / "nope" / "python")], 2, "--python must name an executable"),
    "storage-foreign-tables": (lambda t: [*small_run(t)[:-8], "--out", str(t / "out"), "--storage",
                                          f"sqlite:///{_sqlite_db(t / 'mine.db', table='mine')}", "--replay", str(GRID),
                                          "--batch-sizes", "8"], 2, "holds tables that are not Optuna's (mine)"),
    "storage-old-schema": (lambda t: [*small_run(t)[:-8], "--out", str(t / "out"), "--storage",
                                      f"sqlite:///{_old_optuna_db(t / 'old.db')}", "--replay", str(GRID),
                                      "--batch-sizes", "8"], 2, "is an Optuna storage without its tables"),
    "export-storage-empty": (lambda t: [*EXPORT, "--storage", f"sqlite:///{t / 'none.db'}", "--out", str(t / "out")], 2,
                             "holds no studies (nothing was measured into it)"),
    "export-foreign-storage": (lambda t: [*EXPORT, "--storage", f"sqlite:///{_sqlite_db(t / 'mine.db', table='mine')}",
                                          "--out", str(t / "out")], 2, "holds tables that are not Optuna's"),
    "export-study-misspelt": (lambda t: [*EXPORT, "--storage", f"sqlite:///{worked_storage(t)}", "--study", "typo",
                                         "--out", str(t / "out")], 2, "holds no run 'typo~replay' (it holds NVIDIA_H200~replay)"),
    "export-problem-never-measured": (lambda t: [*EXPORT[:-2], "1", "--quiet", "--storage", f"sqlite:///{worked_storage(t)}",
                                                 "--out", str(t / "out")], 2, "holds no studies of it; nothing exported"),
    "export-study-partial": (lambda t: [*EXPORT, "--trials", "50", "--storage", f"sqlite:///{worked_storage(t)}",
                                        "--out", str(t / "out")], 2, "study is partial (6 of 100 trials); nothing exported"),
    "run-over-an-empty-tuned-file": (lambda t: small_run(t) if _emptied_tuned_file(t) else [], 2,
                                     "not valid JSON"),
    "run-over-an-emptied-overlay-copy": (lambda t: small_run(t) if _emptied_overlay_copy(t) else [], 2,
                                         "SGLang's shipped file copied here was changed since and not valid JSON"),
    "warm-start-storage-missing": (lambda t: small_run(t, "--warm-start", f"sqlite:///{t / 'missing.db'}"), 2,
                                   "missing.db holds no studies"),
    "config-size-absurd": (lambda t: ["shapes", "--model-config", write_file(t / "config.json", json.dumps(
        {**MOE_CONFIG, "hidden_size": 10**30}))], 2, "hidden_size = 1000000000000000000000000000000: Input should be less than or equal to 1048576"),
    "trials-absurd": (lambda t: small_run(t, "--trials", "1" + "0" * 30), 2, "--trials must be at most 100000"),
    "seed-absurd": (lambda t: small_run(t, "--seed", str(2**32)), 2, "--seed must be at most 4294967295, got 4294967296"),
    "timeout-absurd": (lambda t: small_run(t, "--timeout", "1e300"), 2, "--timeout must be at most 2592000, got '1e300'"),
    "routings-absurd": (lambda t: small_run(t, "--routings", "1000000000"), 2, "--routings must be at most 1000"),
    "skew-absurd": (lambda t: small_run(t, "--skew", "1e300"), 2, "--skew must be at most 100, got '1e300'"),
    "workers-absurd": (lambda t: small_run(t, "--workers", "1000000"), 2, "--workers must be at most 240"),
    "neighbours-absurd": (lambda t: small_run(t, "--neighbours", "1000000"), 2, "--neighbours must be at most 64"),
    "heartbeat-absurd": (lambda t: ["worker", "--storage", f"sqlite:///{t / 'w.db'}", "--heartbeat", "1" + "0" * 50],
                         2, "--heartbeat must be at most 3600, got 100000000000... (51 characters)"),
    "replay-where-every-config-failed": (lambda t: small_run(t, replay=False) + ["--replay", str(_all_failed(t))], 1,
                                         "no config of triton_moe ran correctly at any batch size: nothing written"),
    "device-name-twice": (lambda t: small_run(t, "--device-name", "NVIDIA H200 NVL", "--device-name", "NVIDIA H200 NVL"), 2,
                          "--device-name 'NVIDIA H200 NVL' is given twice; each SKU is written once"),
    "json-and-record-the-same-file": (lambda t: small_run(t, "--record", str(t / "x.json"), "--json", str(t / "x.json")), 2,
                                      "--json and --record name the same file"),
    "record-is-the-storage": (lambda t: small_run(t, "--record", str(t / "a.db")), 2,
                              "--record and --storage name the same file"),
    "json-inside-the-tuned-folder": (lambda t: small_run(t, "--json", str(t / "out/NVIDIA_H200/provenance.json")), 2,
                                     "is inside the tuned folder"),
    "record-under-a-file": (lambda t: small_run(t, "--record", str(Path(write_file(t / "f", "x")) / "rec.jsonl.gz")), 2,
                            "f is a file, not a folder"),
    "worker-log-a-users-file": (lambda t: small_run(t, "--worker-log", write_file(t / "notes.txt", "my notes\n")), 2,
                                "notes.txt is not a file autotune wrote (--worker-log)"),
    "worker-log-a-folder-under-replay": (lambda t: small_run(t, "--worker-log", str(_dir(t / "logs"))), 2,
                                         "logs: not a writable file"),
    "replay-triton-version-a-path": (lambda t: small_run(t, replay=False) + ["--replay", str(_header_changed(
        t, lambda d: d["versions"].update(triton="3.6.0/../../x")))], 2,
        "its header's device.versions.triton: '3.6.0/../../x' is not a Triton version"),
    "batch-sizes-underscore": (lambda t: small_run(t, bs="8_0"), 2, "--batch-sizes must be a comma-separated list of integers, got '8_0'"),
    "batch-sizes-trailing-comma": (lambda t: small_run(t, bs="8,"), 2, "--batch-sizes has an empty entry in '8,'"),
    "count-other-digits": (lambda t: small_run(t, "--trials", "\uff18"), 2, "--trials must be an integer"),
    "replay-time-zero": (lambda t: small_run(t, replay=False) + ["--replay", str(_records_changed(
        t, lambda r: r.update(time_us=0.0) if r["status"] == "ok" and r["M"] == 8 else None))], 2,
        "an ok measurement's time_us must be above 0, got 0.0"),
    "replay-spread-nan": (lambda t: small_run(t, replay=False) + ["--replay", str(_records_changed(
        t, lambda r: r.update(spread=float("nan")) if r["status"] == "ok" else None))], 2,
        "measurement spread must be a finite non-negative number, got nan"),
    "kernels-only-commas": (lambda t: _kernels(small_run(t), ","), 2, "--kernels names no kernel family (got ',')"),
    "kernels-all-and-a-family": (lambda t: _kernels(small_run(t), "all,triton_moe"), 2,
                                 "'all' is every family, on its own"),
    "kernels-repeated": (lambda t: _kernels(small_run(t), "triton_moe,triton_moe"), 2,
                         "--kernels lists triton_moe twice"),
    "block-fp8-shape-sglang-refuses": (lambda t: ["run", "--model-config", write_file(t / "config.json", json.dumps(
        {**MOE_CONFIG, "moe_intermediate_size": 100})), "--tp", "1", "--dtype", "fp8_w8a8_block", "--kernels",
        "triton_moe", "--dry-run", "--target-device", "NVIDIA H200"], 2,
        "SGLang refuses block-FP8 MoE weights whose intermediate size per rank (100) is not divisible"),
    "flag-value-a-lone-dashes": (lambda t: ["merge-choices", str(_dir(t / "src")), "--out=--"], 2,
                                 "--out must name a value, got '--'"),
    "replay-realtime-absurd": (lambda t: small_run(t, "--replay-realtime", "1e308"), 2, "--replay-realtime must be at most 100"),
    "skip-backends-leaves-none-that-ran": (lambda t: [*_backends_run(t), "--skip-backends", "moe_bf16:triton"], 1,
                                           "no backend of moe_bf16 ran correctly at a measured batch size"),
    # issue 23, second sweep: the names a tuned folder gives publish (t/victim.json is where they reached)
    "publish-provenance-name-traversal": (lambda t: _publish_edited(t, _rename_up(f"{OUT_OF_SERVING}victim.json")),
                                          2, "files: '../../../../../victim.json' is not a plain file name"),
    "publish-down-file-traversal": (lambda t: _publish_edited(t, _set_up("down_file", str(t / "victim.json"))),
                                    2, "down_file: '/"),
    "publish-listed-file-missing": (lambda t: _publish_edited(t, lambda folder, prov: _up_file(folder).unlink()),
                                    2, "(its entry names Triton 3.6.0) but missing: re-export the folder"),
    "publish-triton-mismatch-missing": (lambda t: _publish_edited(t, _set_up("triton", "3.5.1")),
                                        2, "configs/triton_3_5_1/E=512,N=128,device_name=NVIDIA_RTX_PRO_6000_Blackwell"
                                           "_Server_Edition.json is listed in"),
    "publish-refused-leaves-repo-as-it-was": (lambda t: _publish_edited(t, _no_backend_choices), 2,
                                              "holds no backend choices"),
    "publish-overlay-traversal": (lambda t: _publish_edited(t, lambda folder, prov: prov.update(
        shipped_overlay={"files": ["../../../victim.json"]})), 2,
        "shipped_overlay.files.0: '../../../victim.json' is not a path inside the folder"),
    # issue 23, second sweep: install and rank-model values checked against SGLang's own
    "install-runner-unknown": (lambda t: _install(t, "--moe-runner-backend", "flashinfer_cutlas"), 2,
                               "--moe-runner-backend 'flashinfer_cutlas' is not a value SGLang"),
    "install-runner-unknown-in-server-args": (lambda t: _install(t, server_args="moe-runner-backend: made_up\n"), 2,
                                              "server_args.yaml: moe-runner-backend 'made_up' is not a value SGLang"),
    "install-runner-megamoe": (lambda t: _install(t, "--moe-runner-backend", "flashinfer_megamoe"), 2,
                               "SGLang names that runner's files by each GPU's UUID"),
    "install-quantization-unknown": (lambda t: _install(t, "--quantization", "fp9"), 2,
                                     "--quantization 'fp9' is not a value SGLang"),
    "install-dtype-unknown": (lambda t: _install(t, "--dtype", "bf16"), 2, "--dtype 'bf16' is not a value SGLang"),
    "install-dtype-auto": (lambda t: _install(t, "--dtype", "auto"), 2,
                           "--dtype auto is resolved by the server from the checkpoint"),
    "install-hf-config-class-unknown": (lambda t: _install(t, "--hf-config-class", "Qwen3_5MoeConfg"), 2,
                                        "--hf-config-class 'Qwen3_5MoeConfg' is not a config class transformers"),
    "install-tp-absurd": (lambda t: _install(t, tp="5000"), 2, "--tp must be at most 1024, got 5000"),
    "install-pp-absurd": (lambda t: _install(t, "--pp", "5000"), 2, "--pp must be at most 1024, got 5000"),
    "install-gpus-absurd": (lambda t: _install(t, "--pp", "512", tp="4"), 2,
                            "--tp 4 x --pp 512 is 2048 GPUs (one rank file each), above 1024"),
    "install-tp-above-heads": (lambda t: _install(t, tp="8"), 2, "--tp 8 is above the model's 4 attention heads"),
    "install-ep-above-tp": (lambda t: _install(t, "--ep", "4"), 2, "--ep 4 is above --tp 2"),
    "install-ep-above-experts": (lambda t: _install(t, "--attn-dp", "1024", "--ep", "1024", tp="1024"), 2,
                                 "--ep 1024 is above the model's 512 experts"),
    "rank-model-layers-above-the-model": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8",
                                                     "--layers", "500", "--out", str(t / "rank")], 2,
                                          "--layers 500 is above the model's 60 layers"),
    "rank-model-layers-zero": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--layers", "0",
                                          "--out", str(t / "rank")], 2, "--layers must be at least 1, got 0"),
    "rank-model-layers-negative": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--layers",
                                              "-3", "--out", str(t / "rank")], 2, "--layers must be at least 1, got -3"),
    "rank-model-config-layers-above": (lambda t: ["rank-model", "--model-config", write_file(t / "config.json", json.dumps(
        {**MOE_CONFIG, "num_attention_heads": 32, "num_key_value_heads": 4})), "--tp", "2", "--layers", "49", "--out",
        str(t / "rank")], 2, "--layers 49 is above the model's 48 layers (num_hidden_layers)"),
    "rank-model-tp-absurd": (lambda t: ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "5000", "--out",
                                        str(t / "rank")], 2, "--tp must be at most 1024, got 5000"),
    # issue 37: inputs parsed by the library that owns their format
    "storage-query-string-hid-the-file": (lambda t: [*small_run(t)[:-8], "--out", str(t / "out"), "--storage",
                                                     f"sqlite:///{_sqlite_db(t / 'mine.db', table='mine')}?timeout=30",
                                                     "--replay", str(GRID), "--batch-sizes", "8"], 2,
                                          "mine.db?timeout=30 holds tables that are not Optuna's (mine)"),
    "replay-header-no-versions": (lambda t: small_run(t, replay=False) + ["--replay", str(_header_changed(
        t, lambda d: d.pop("versions")))], 2, "its header's device.versions: Field required"),
    "replay-header-no-smem-optin": (lambda t: small_run(t, replay=False) + ["--replay", str(_header_changed(
        t, lambda d: d.pop("smem_optin")))], 2, "its header's device.smem_optin: Field required"),
    "replay-header-triton-a-number": (lambda t: small_run(t, replay=False) + ["--replay", str(_header_changed(
        t, lambda d: d["versions"].update(triton=3.6)))], 2, "its header's device.versions.triton: Input should be a valid string"),
    "replay-header-name-newline": (lambda t: small_run(t, replay=False) + ["--replay", str(_header_changed(
        t, lambda d: d.update(name="NVIDIA\nH200")))], 2, "its header's device.name: 'NVIDIA\\nH200' is not a plausible CUDA device name"),
    "replay-header-name-tab": (lambda t: small_run(t, replay=False) + ["--replay", str(_header_changed(
        t, lambda d: d.update(name="NVIDIA\tH200")))], 2, "its header's device.name: 'NVIDIA\\tH200' is not a plausible CUDA device name"),
    "space-block-k-not-a-power-of-two": (lambda t: small_run(t, "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "BLOCK_SIZE_K: [", "BLOCK_SIZE_K: [48, "))), 2, "BLOCK_SIZE_K must hold powers of two, got 48"),
    "space-num-warps-three": (lambda t: small_run(t, "--search-space", write_file(t / "s.yaml", FULL_SPACE.replace(
        "num_warps: [", "num_warps: [3, "))), 2, "num_warps must hold powers of two, got 3"),
    "model-and-model-config": (lambda t: ["shapes", "--model", "qwen3.5-35b-a3b", "--model-config",
                                          write_file(t / "config.json", json.dumps(MOE_CONFIG))], 2,
                               "--model and --model-config exclude each other: give one"),
    "shapes-and-model": (lambda t: small_run(t, "--shapes", "qwen3-next"), 2, "--model and --shapes exclude each other"),
    "replay-given-twice": (lambda t: small_run(t, "--replay", str(GRID)), 2,
                           "--replay is given twice: give it once (the second replaced the first)"),
    "dtype-empty": (lambda t: ["shapes", "--dtype", ""], 2, "--dtype has an empty entry in ''"),
    "model-empty": (lambda t: ["shapes", "--model", ""], 2, "--model must name a value, got ''"),
    "replay-realtime-without-replay": (lambda t: small_run(t, "--replay-realtime", "2", replay=False), 2,
                                       "--replay-realtime needs --replay (it paces a replay's answers)"),
    "target-device-and-replay": (lambda t: small_run(t, "--dry-run", "--target-device", "NVIDIA H200"), 2,
                                 "--target-device and --replay exclude each other (both name the device)"),
    "only-drifted-and-tp": (lambda t: without(small_run(t, "--only-drifted", str(_dir(t / "folder"))), "--model"), 2,
                            "--only-drifted and --tp exclude each other"),
    "only-drifted-and-model": (lambda t: without(small_run(t, "--only-drifted", str(_dir(t / "folder"))), "--tp", "--dtype",
                                                  "--batch-sizes"), 2, "--model and --only-drifted exclude each other"),
    "check-no-retime-and-batch-sizes": (lambda t: ["check", str(ROOT / "tuned_configs/NVIDIA_H200"), "--no-retime",
                                                   "--batch-sizes", "8"], 2,
                                        "--no-retime and --batch-sizes exclude each other"),
    "merge-caches-same-recording-twice": (lambda t: ["merge-caches", str(GRID), f"{GRID.parent}/./{GRID.name}", "-o",
                                                     str(t / "m.jsonl.gz")], 2, f"caches names {str(GRID)!r} twice"),
    "worker-gpu-and-gpus": (lambda t: ["worker", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16",
                                       "--replay", str(GRID), "--storage", f"sqlite:///{t / 'a.db'}", "--gpus", "0",
                                       "--gpu", "1"], 2, "--gpu is given with --gpus, which sets the same: give one"),
    "gpus-listed-twice": (lambda t: small_run(t, "--gpus", "0,0"), 2, "--gpus lists a GPU twice in '0,0'"),
    "search-space-without-its-family": (lambda t: _kernels(small_run(t, "--search-space", write_file(t / "s.yaml", FULL_SPACE)),
                                                           "fp8_gemm"), 2,
                                        "--search-space is read by triton_moe, which --kernels fp8_gemm does not run"),
    "checkpoint-of-a-family-not-run": (lambda t: small_run(t, "--checkpoint", "moe_bf16"), 2,
                                       "--checkpoint moe_bf16 names a family --kernels triton_moe does not run"),
    "provenance-file-name-newline": (lambda t: _check_edited(t, lambda prov: prov["files"].update(
        {"E=512,N=128,device_name=NVIDIA_H200\n.json": prov["files"].popitem()[1]})), 2,
        "'E=512,N=128,device_name=NVIDIA_H200\\n.json' is not a plain file name (printable ASCII, no control character)"),
    "provenance-down-file-tab": (lambda t: _check_edited(t, lambda prov: _first_entry(prov).update(
        down_file="E=512\t_down.json")), 2, "down_file: 'E=512\\t_down.json' is not a plain file name"),
    "provenance-overlay-path-newline": (lambda t: _check_edited(t, lambda prov: prov["shipped_overlay"]["files"].insert(
        0, "configs/triton_3_1_0/x\n.json")), 2, "shipped_overlay.files.0: 'configs/triton_3_1_0/x\\n.json' is not a plain file name"),
    "provenance-measured-on-newline": (lambda t: _check_edited(t, lambda prov: _first_entry(prov).update(
        measured_on="gpu\nreplay")), 2, "measured_on: Input should be 'gpu', 'replay', 'cpu-interpreter' or 'planned'"),
    "provenance-sglang-version-newline": (lambda t: _check_edited(t, lambda prov: _first_entry(prov).update(
        sglang_versions=["0.5.23\n0.5.16"])), 2, "sglang_versions.0: '0.5.23\\n0.5.16' is not a version"),
    "provenance-driver-control-character": (lambda t: _check_edited(t, lambda prov: prov["device"].update(
        driver="580.1\r")), 2, "device.driver: '580.1\\r' holds a control character"),
    "provenance-version-not-text": (lambda t: _check_edited(t, lambda prov: prov["device"]["versions"].update(
        triton=3.6)), 2, "device.versions.triton: 3.6 is not text"),
    # issue 44: inputs named twice, a recording of another stack, one line for a refused validation
    "validate-from-runs-twice": (lambda t: ["validate", "--engine", "sglang", "--from-runs", str(RUNS_023),
                                            "--from-runs", f"{RUNS_023.parent}/./{RUNS_023.name}", "--configs",
                                            str(_committed_copy(t))], 2, f"--from-runs names {str(RUNS_023)!r} twice"),
    "validate-from-runs-a-copy-twice": (lambda t: ["validate", "--engine", "sglang", "--from-runs", str(RUNS_023),
                                                   "--from-runs", _copy(RUNS_023, t / "again.tgz"), "--configs",
                                                   str(_committed_copy(t))], 2, "holds the very runs of --from-runs"),
    "validate-from-runs-other-folder": (lambda t: ["validate", "--engine", "sglang", "--from-runs", str(RUNS_023),
                                                   "--configs", str(_committed_copy(t)), "--gate"], 2,
                                        "a tuned run did not load the tuned folder's files: one_batch_bf16_r1_tuned"),
    "replay-same-recording-twice": (lambda t: small_run(t, replay=False) + ["--replay", f"{GRID},{GRID.parent}/./{GRID.name}"],
                                    2, "is named twice (also as"),
    "record-other-triton": (lambda t: small_run(t, "--record", str(_header_changed(
        t, lambda d: d["versions"].update(triton="3.5.1")))), 2,
        "holds measurements made with triton 3.5.1, this run measures with triton 3.6.0"),
    "record-other-sglang": (lambda t: small_run(t, "--record", str(_header_changed(
        t, lambda d: d["versions"].update(sglang="0.5.16")))), 2,
        "holds measurements made with sglang 0.5.16, this run measures with sglang 0.5.23"),
}


def _committed_copy(t: Path) -> Path:
    """The committed H200 folder copied elsewhere: the 0.5.23 arms' tuned runs loaded the committed one."""
    import shutil
    shutil.copytree(ROOT / "tuned_configs/NVIDIA_H200", t / "copy" / "NVIDIA_H200")
    return t / "copy" / "NVIDIA_H200"


def _copy(src: Path, dst: Path) -> str:
    dst.write_bytes(src.read_bytes())
    return str(dst)


def _first_entry(prov: dict) -> dict:
    return next(iter(prov["files"].values()))


def _check_edited(t: Path, edit) -> list:
    """check of a copy of the committed H200 folder whose provenance.json `edit(provenance)` changed."""
    import shutil
    folder = t / "NVIDIA_H200"
    shutil.copytree(ROOT / "tuned_configs/NVIDIA_H200", folder)
    prov = json.loads((folder / "provenance.json").read_text())
    edit(prov)
    (folder / "provenance.json").write_text(json.dumps(prov))
    return ["check", str(folder), "--no-retime"]


def _install(t: Path, *extra, tp="2", server_args=None) -> list:
    """install of a tuned folder (FlashInfer tactics, moe-runner-backend flashinfer_cutlass) for a
    one-rank model folder of Qwen3.5-397B at TP8 (4 attention heads, 512 experts), into t/cache."""
    from tests.fakes.flashinfer_folders import model_folder, tuned_folder
    folder, model = tuned_folder(t), model_folder(t)
    if server_args is not None:
        (folder / "server_args.yaml").write_text(server_args)
    return ["install", str(folder), "--model-path", str(model), "--tp", tp, "--cache-dir", str(t / "cache"), *extra]

# from a serving repo's configs/triton_*/ folder up to the test's temp folder
OUT_OF_SERVING = "../" * 5


def _publish_edited(t: Path, edit) -> list:
    """publish from a tuned folder `edit(folder, provenance)` changed, into a fresh serving repo; the
    user's t/victim.json is where a name that reaches out of the serving repo lands."""
    folder = _tuned(t)
    (t / "victim.json").write_text('{"mine": true}\n')
    prov = json.loads((folder / "provenance.json").read_text())
    edit(folder, prov)
    (folder / "provenance.json").write_text(json.dumps(prov))
    return ["publish", "--to", str(serving_repo(t)), "--from", str(folder)]


def _up_file(folder: Path) -> Path:
    from tests.fakes.tuned_folders import UP
    return folder / "configs/triton_3_6_0" / UP


def _set_up(key, value):
    def edit(folder, prov):
        prov["files"][_up_file(folder).name][key] = value
    return edit


def _rename_up(name):
    def edit(folder, prov):
        prov["files"][name] = prov["files"].pop(_up_file(folder).name)
    return edit


def _no_backend_choices(folder: Path, prov: dict) -> None:
    """A backend_choice.json of no family: it used to be refused after the branch was made."""
    from tests.fakes.tuned_folders import DEV
    (folder / "backend_choice.json").write_text(json.dumps({"device": DEV.to_dict(), "families": {}}))


def _backends_run(t: Path) -> list:
    """A moe_bf16 run on the H200 backend recording into a folder holding the user's server_args.yaml."""
    folder = t / "out" / "NVIDIA_H200"
    folder.mkdir(parents=True)
    (folder / "server_args.yaml").write_text("tp-size: 8\nmem-fraction-static: 0.85\n")
    return ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--kernels", "moe_bf16", "--replay",
            str(ROOT / "benchmarks/data/h200_backends_2026-12-01.jsonl.gz"), "--batch-sizes", "1", "--quiet",
            "--out", str(t / "out"), "--storage", f"sqlite:///{t / 'a.db'}"]


def _deep(open_: str, close: str, depth: int = 100_000) -> str:
    return open_ * depth + "1" + close * depth


def _header_of(recording: Path) -> str:
    with gzip.open(recording, "rt") as f:
        return f.readline()


def _fifo(path: Path) -> str:
    import os
    os.mkfifo(path)
    return str(path)


def _link(path: Path, to: Path) -> str:
    path.symlink_to(to)
    return str(path)


def _old_optuna_db(path: Path) -> Path:
    """An Optuna storage missing a table, as an older release's schema (or a damaged one) is."""
    import sqlite3
    _optuna_db(path)
    with sqlite3.connect(path) as c:
        c.execute("DROP TABLE trial_heartbeats")
    return path


def _emptied_tuned_file(t: Path) -> bool:
    """A run's tuned gate_up file, then emptied (a disk filled mid-copy by another tool, a hand edit)."""
    assert main(small_run(t)) == 0
    prov = json.loads(next((t / "out").glob("*/provenance.json")).read_text())
    name = next(iter(prov["files"]))
    next((t / "out").glob(f"*/configs/*/{name}")).write_text("")
    return True


def _all_failed(t: Path) -> Path:
    """The grid recording with every measurement a compile error (a Triton that builds none of them)."""
    lines = gzip.open(GRID, "rt").read().splitlines()
    failed = [lines[0]] + [json.dumps({**json.loads(l), "status": "compile_error", "time_us": None,
                                       "reason": "RuntimeError: PassManager::run failed"}) for l in lines[1:]]
    return _gz(t / "failed.jsonl.gz", "\n".join(failed) + "\n")


def _header_changed(t: Path, change) -> Path:
    """The grid recording with its header's device changed by `change`."""
    lines = gzip.open(GRID, "rt").read().splitlines()
    head = json.loads(lines[0])
    change(head["device"])
    return _gz(t / "changed.jsonl.gz", "\n".join([json.dumps(head), *lines[1:]]) + "\n")


def _records_changed(t: Path, change) -> Path:
    """The grid recording with `change` applied to each record (a dict, changed in place)."""
    lines = gzip.open(GRID, "rt").read().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    for r in records:
        change(r)
    return _gz(t / "changed.jsonl.gz", "\n".join([lines[0], *map(json.dumps, records)]) + "\n")


def _emptied_overlay_copy(t: Path) -> bool:
    """A run's copy of one of SGLang's shipped files, then emptied (SGLang would fail loading the folder)."""
    assert main(small_run(t)) == 0
    prov = json.loads(next((t / "out").glob("*/provenance.json")).read_text())
    rel = prov["shipped_overlay"]["files"][0]
    next((t / "out").glob("*/provenance.json")).parent.joinpath(rel).write_text("")
    return True


MOE_CONFIG = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "hidden_size": 2048,
              "num_hidden_layers": 48}


def _users_sku_file(t: Path) -> bool:
    """A user's file where --device-name 'NVIDIA H200 NVL' would write its copy of the tuned file."""
    from autotune.gpus.device import DeviceInfo
    from autotune.adapters.sglang_loader import sglang_file_name
    from autotune.problems.models import Problem
    from autotune.measure.records import read_cache

    dev = DeviceInfo.from_dict(read_cache(GRID).device)
    name = sglang_file_name(Problem(512, 128, 4096, 10, "bf16"), dev).replace("NVIDIA_H200", "NVIDIA_H200_NVL")
    folder = t / "out" / dev.file_name / "configs" / f"triton_{dev.versions['triton'].replace('.', '_')}"
    folder.mkdir(parents=True)
    (folder / name).write_text('{"1": {"BLOCK_SIZE_M": 16}}')
    return True


def _sqlite_db(path: Path, table: str | None = None) -> Path:
    """A SQLite file: empty (a header, no tables), or holding a user's table."""
    import sqlite3
    with sqlite3.connect(path) as c:
        c.execute(f"CREATE TABLE {table} (x)" if table else "PRAGMA user_version = 7")
    return path


def _optuna_db(path: Path) -> Path:
    import optuna
    optuna.create_study(study_name="someone else's", storage=f"sqlite:///{path}")
    return path


def _weights(path: Path) -> Path:
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"x")
    return path


def _model(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    return path


def _dir(path: Path) -> Path:
    path.mkdir()
    return path


def _cut(src: Path, dst: Path) -> str:
    dst.write_bytes(src.read_bytes()[:5000])
    return str(dst)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_changes_nothing(tmp_path, capsys, case):
    argv_of, code, says = CASES[case]
    argv = argv_of(tmp_path)
    before = file_hashes(tmp_path)
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code, err
    assert len(err) == 1 and err[0].startswith("autotune: error: " if code == 2 else "autotune: ") and says in err[0], err
    after = file_hashes(tmp_path)
    assert {p: h for p, h in after.items() if p in before} == before       # nothing that existed changed
    assert not [p for p in after if p.suffix == ".json" and p not in before]   # no tuned file written
    assert code != 2 or not [p for p in after if p.suffix == ".db" and p not in before]   # no storage made
    if case == "no-gpu-no-replay":
        assert not (tmp_path / "out").exists()                              # not even an empty folder


PUBLISH_CASES = [c for c in CASES if c.startswith("publish-")]


@pytest.mark.parametrize("case", PUBLISH_CASES)
def test_a_refused_publish_leaves_the_serving_repo_as_it_was(tmp_path, capsys, case):
    argv_of, code, says = CASES[case]
    argv = argv_of(tmp_path)
    repo, before = tmp_path / "serving", file_hashes(tmp_path)
    state = git_state(repo)
    assert main(argv) == code
    assert says in capsys.readouterr().err
    assert git_state(repo) == state
    outside = {p: h for p, h in before.items() if repo not in p.parents}
    assert {p: h for p, h in file_hashes(tmp_path).items() if repo not in p.parents} == outside


def _refuse_commits(repo: Path) -> None:
    hook = repo / ".git/hooks/pre-commit"
    hook.write_text("#!/bin/sh\necho 'pre-commit: no commit without a review' >&2\nexit 1\n")
    hook.chmod(0o755)


def _interrupt_after_one_file(monkeypatch):
    """Ctrl-C after publish wrote its first file into the serving repo."""
    import autotune.publish as publish
    from autotune.fileio.writing import write_bytes

    def write_all(files):
        path, (data, _) = next(iter(files.items()))
        write_bytes(path, data)
        raise KeyboardInterrupt
    monkeypatch.setattr(publish, "write_all", write_all)


@pytest.mark.parametrize("failure", ["commit-hook", "ctrl-c-mid-write"])
def test_a_publish_that_fails_after_its_branch_is_made_puts_the_repo_back(tmp_path, capsys, monkeypatch, failure):
    """The serving repo already holds an earlier publish (merged into main), so the second one
    changes tracked files and adds new ones before it fails: every one is put back, the branch too."""
    import subprocess
    from tests.fakes.tuned_folders import tuned

    repo = serving_repo(tmp_path)
    assert main(["publish", "--to", str(repo), "--from", str(tuned(tmp_path, "first", {1: 10.0})), "--branch", "t1"]) == 0
    for args in (["checkout", "-q", "main"], ["merge", "-q", "t1"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    src = tuned(tmp_path, "second", {1: 5.0, 64: 50.0})       # faster at M=1, and a new M
    state = git_state(repo)
    capsys.readouterr()
    if failure == "commit-hook":
        _refuse_commits(repo)
        assert main(["publish", "--to", str(repo), "--from", str(src), "--branch", "t2"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("autotune: error: git commit failed in ") and \
            err[0].endswith("pre-commit: no commit without a review"), err
    else:
        _interrupt_after_one_file(monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            from autotune.publish import publish
            publish(src, str(repo), "t2")
    assert git_state(repo) == state


def _doc_rows() -> dict[str, list[str]]:
    """The table of docs/RELIABILITY.md: id -> its cells."""
    rows = {}
    for line in (ROOT / "docs/RELIABILITY.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
        if cells and re.fullmatch(r"[a-z0-9-]+", cells[0]) and cells[0] != "id":
            rows[cells[0]] = cells
    return rows


def test_reliability_doc_lists_every_case_with_its_exit_code_and_a_test_that_exists():
    rows = _doc_rows()
    for case, (_, code, _) in CASES.items():
        assert case in rows, f"docs/RELIABILITY.md does not list {case}"
        assert rows[case][2] == str(code), (case, rows[case])
    for case, row in rows.items():
        for test in re.findall(r"`(tests/[^`]+)`", row[-1]):
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), (case, test)
            name = name.split("[")[0]
            assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), (case, test)
            if name == "test_bad_input_is_one_line_and_changes_nothing":
                assert case in CASES, (case, test)
        assert re.search(r"`tests/", row[-1]), (case, "names no test")


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """SIGINT reaches the run as KeyboardInterrupt, the path SIGTERM takes too (exit 143 there:
    tests/run/test_shared_study.py stops a real run with it)."""
    import autotune.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["shapes"].set_defaults(fn=interrupted)
    assert main(["shapes", "--shapes", "qwen3.5"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autotune: stopped by SIGINT")


def test_an_unwritable_worker_log_is_one_line_before_any_worker_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOTUNE_CPU_INTERPRETER", "1")        # a measuring pool without a GPU
    before = file_hashes(tmp_path)
    rc = main([*small_run(tmp_path, replay=False), "--worker-log", str(tmp_path / "no/such/dir/w.log")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--worker-log" in err[0] and "not a writable file" in err[0], err
    assert file_hashes(tmp_path) == before and not (tmp_path / "out").exists()


def test_a_recording_is_read_whatever_its_name(tmp_path, capsys):
    """merge-caches writes gzip under any name; --replay reads it by its bytes, not its suffix."""
    assert main(["merge-caches", str(GRID), "-o", str(tmp_path / "m.txt")]) == 0
    assert (tmp_path / "m.txt").read_bytes()[:2] == b"\x1f\x8b"
    assert main(small_run(tmp_path, replay=False) + ["--replay", str(tmp_path / "m.txt")]) == 0
    assert list((tmp_path / "out").glob("*/configs/*/*.json"))


@pytest.mark.parametrize("url", ["postgresql://bob@127.0.0.1:1/db?password=s3cretPW",
                                 "postgresql://bob:s3c@ret:PW@127.0.0.1:1/db",
                                 "postgresql://bob:pa/ss@127.0.0.1:1/db"])
def test_a_storage_password_is_never_printed(tmp_path, capsys, url):
    """A password holding '@' or '/', or given as a query parameter, was printed (whole, or the part
    the driver's error quoted)."""
    assert main(small_run(tmp_path)[:-8] + ["--out", str(tmp_path / "out"), "--storage", url,
                                      "--replay", str(GRID), "--batch-sizes", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("autotune: error:") == 1 and "postgresql://bob" in err, err
    assert not any(secret in err for secret in ("s3c", "PW", "pa/ss", "ss@")), err


@pytest.mark.parametrize("var", ["HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR"])
def test_a_cache_home_that_is_a_file_is_one_line_before_any_import(tmp_path, capsys, monkeypatch, var):
    """HOME naming a file was a NotADirectoryError traceback from inside torch's import."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv(var, write_file(tmp_path / "file", "x") + ("" if var == "HOME" else "/cache"))
    before = file_hashes(tmp_path)
    assert main(small_run(tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"autotune: error: {var}=") and "is a file" in err[0], err
    assert file_hashes(tmp_path) == before
