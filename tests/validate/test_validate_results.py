"""Reading SGLang's benchmark result files (tests/data/validate/README.md says where each came
from): real sglang bench_serving output from a public H200 benchmark repository, and SGLang
0.5.23-format lines produced by SGLang's own result-writing code on synthetic timings."""
import importlib.util
import json
from pathlib import Path

import pytest

from autotune.validate import BenchmarkError
from autotune.validate.sglang_server import read_one_batch_result, read_serving_result

DATA = Path(__file__).parents[1] / "data" / "validate"


def test_real_h200_serving_output_last_line_is_read():
    f = DATA / "sglang_serving_h200_llama-3.3-70b_online.jsonl"
    r = read_serving_result(f)
    assert r["output_throughput"] == pytest.approx(1471.0864833760852)
    assert r["median_itl_ms"] == pytest.approx(17.667690059170127)
    assert r["median_e2e_latency_ms"] == pytest.approx(3291.7507080128416)
    assert r["completed"] == 2400 and r["max_concurrency"] is None
    # every line of the file is a run SGLang appended; each parses on its own
    assert [json.loads(line)["request_rate"] for line in f.read_text().splitlines()] == [1, 2, 4, 8, 16, 4, 8]


def test_real_output_with_infinity_request_rate():
    f = DATA / "sglang_serving_h200_deepseek_dp_mla.jsonl"
    assert '"request_rate": Infinity' in f.read_text()      # not RFC 8259, what SGLang writes
    r = read_serving_result(f)
    assert r["output_throughput"] == pytest.approx(12412.394674113431)
    assert r["random_output_len"] == 512 and r["median_ttft_ms"] == pytest.approx(10014.104524045251)


def test_sglang_0523_serving_line_has_every_metric_we_read():
    r = read_serving_result(DATA / "sglang_serving_0.5.23_generated.jsonl")
    assert r["max_concurrency"] == 32 and r["completed"] == 128
    for k in ("median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_ttft_ms",
              "median_e2e_latency_ms", "concurrency", "total_throughput"):
        assert isinstance(r[k], float) and r[k] > 0, k
    # output tokens over the run's duration, as SGLang computes it
    assert r["output_throughput"] == pytest.approx(r["total_output_tokens"] / r["duration"])


def test_sglang_0523_one_batch_line():
    r = read_one_batch_result(DATA / "sglang_one_batch_0.5.23_generated.jsonl")
    assert (r["batch_size"], r["input_len"], r["output_len"]) == (1, 1024, 256)
    assert r["output_throughput"] == 77.91 and r["last_ttft"] == 0.084


def test_fixtures_match_what_the_installed_sglang_writes(tmp_path):
    """Regenerate with SGLang's code paths now: same keys as the committed lines (an SGLang
    upgrade that renames a metric fails here)."""
    spec = importlib.util.spec_from_file_location("make_fixtures", DATA / "make_fixtures.py")
    mf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mf)
    line = json.loads(mf.serving_line(concurrency=4, num_prompts=8, input_len=16, output_len=8, itl_s=0.01,
                                      ttft_s=0.05))
    committed = json.loads((DATA / "sglang_serving_0.5.23_generated.jsonl").read_text().splitlines()[0])
    assert set(line) == set(committed)
    assert line["output_throughput"] == pytest.approx(8 * 8 / line["duration"])
    out = tmp_path / "ob.jsonl"
    mf.write_one_batch(out, run_name="x", batch_size=1, input_len=4, output_len=4, latency=1.0, input_throughput=1.0,
                       output_throughput=2.0, overall_throughput=3.0, last_ttft=0.1, last_gen_throughput=2.0,
                       acc_length=-1)
    assert set(json.loads(out.read_text())) == set(json.loads((DATA / "sglang_one_batch_0.5.23_generated.jsonl")
                                                              .read_text()))
    assert read_one_batch_result(out)["output_throughput"] == 2.0


def test_missing_empty_broken_and_useless_results_are_errors(tmp_path):
    with pytest.raises(BenchmarkError, match="wrote no result file"):
        read_serving_result(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(BenchmarkError, match="empty result file"):
        read_serving_result(tmp_path / "empty.jsonl")
    (tmp_path / "cut.jsonl").write_text('{"output_throughput": 12.5, "median_itl')
    with pytest.raises(BenchmarkError, match="not JSON"):
        read_serving_result(tmp_path / "cut.jsonl")
    (tmp_path / "zero.jsonl").write_text('{"output_throughput": 0.0}\n')
    with pytest.raises(BenchmarkError, match="no usable output_throughput"):
        read_one_batch_result(tmp_path / "zero.jsonl")
