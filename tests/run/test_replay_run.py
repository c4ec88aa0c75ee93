"""`autotune run` end to end against the recorded H200 grid (the labelled stand-in for a GPU)."""
import json

import pytest

from autotune.contract.config import KernelConfig
from autotune.cli import main
from tests.conftest import GRID

BASE = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--replay", str(GRID),
        "--batch-sizes", "1,8,4096", "--quiet"]


def _run(tmp_path, *extra, db="a.db"):
    return main(BASE + ["--out", str(tmp_path / "out"), "--storage", f"sqlite:///{tmp_path / db}", *extra])


def _prov(tmp_path):
    prov = json.loads((tmp_path / "out/NVIDIA_H200/provenance.json").read_text())
    (entry,) = prov["files"].values()
    return entry


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    assert _run(tmp, "--trials", "6", "--json", str(tmp / "summary.json")) == 0
    return tmp


def test_replay_writes_sglang_files_and_labels_itself(first_run, capsys):
    folder = first_run / "out/NVIDIA_H200/configs/triton_3_6_0"
    up = json.loads((folder / "E=512,N=128,device_name=NVIDIA_H200.json").read_text())
    down = json.loads((folder / "E=512,N=128,device_name=NVIDIA_H200_down.json").read_text())
    assert set(up) == set(down) == {"1", "8", "4096"}
    assert all(down[M]["BLOCK_SIZE_M"] == up[M]["BLOCK_SIZE_M"] for M in up)
    e = _prov(first_run)
    assert e["measured_on"] == "replay" and "replayed" in e["replay_note"]
    assert e["triton"] == "3.6.0" and e["compute_capability"] == 90


def test_tuned_is_never_slower_than_sglangs_default_or_shipped(first_run, grid_cache, h200, qwen397_bf16):
    from autotune.families.triton_moe import TritonMoe

    folder = first_run / "out/NVIDIA_H200/configs/triton_3_6_0"
    up = json.loads((folder / "E=512,N=128,device_name=NVIDIA_H200.json").read_text())
    down = json.loads((folder / "E=512,N=128,device_name=NVIDIA_H200_down.json").read_text())
    pk = qwen397_bf16.key

    def pair(M, g, d):
        a, b = grid_cache.get(pk, "gate_up", M, KernelConfig.from_entry(g)), grid_cache.get(pk, "down", M, KernelConfig.from_entry(d))
        return a.time_us + b.time_us if a and b and a.ok and b.ok else float("inf")
    for M in (1, 8, 4096):
        tuned = pair(M, up[str(M)], down[str(M)])
        for name, cfgs in TritonMoe().baselines(qwen397_bf16, M, h200).items():
            assert tuned <= pair(M, cfgs["gate_up"], cfgs["down"]), (M, name)
        prov = _prov(first_run)["per_M"][str(M)]
        assert prov["tuned_us"] <= min(x for x in (prov["default_us"], prov["shipped_us"]) if x)


def test_json_summary_says_what_was_tuned_and_written(first_run):
    from pathlib import Path

    s = json.loads((first_run / "summary.json").read_text())
    assert s["device"] == "NVIDIA H200" and s["replay"] is True
    (problem,) = s["triton_moe"]
    prov = _prov(first_run)["per_M"]
    assert [r["M"] for r in problem["per_M"]] == [1, 8, 4096]
    for row in problem["per_M"]:
        assert row["tuned µs"] == pytest.approx(prov[str(row["M"])]["tuned_us"], abs=1e-3)
        assert row["winner"] in ("tuned", "shipped", "default")
    assert problem["files"] and all(Path(f).is_file() for f in problem["files"])


def test_rerun_resumes_without_remeasuring(first_run, capsys):
    capsys.readouterr()
    assert _run(first_run, "--trials", "6") == 0
    assert "(0 device measurements by this run" in capsys.readouterr().out
    assert _prov(first_run)["run"]["measured_this_run"] == 0


def test_more_trials_measure_only_the_new_ones(tmp_path):
    assert _run(tmp_path, "--trials", "3") == 0
    before = _prov(tmp_path)["run"]["evaluations"]
    assert _run(tmp_path, "--trials", "6") == 0
    run = _prov(tmp_path)["run"]
    new_search = run["evaluations"] - before
    assert 0 < new_search <= run["measured_this_run"] < run["evaluations"]


@pytest.mark.slow
def test_budget_stops_the_search(tmp_path):
    assert _run(tmp_path, "--trials", "500", "--budget", "6s") == 0
    run = _prov(tmp_path)["run"]
    assert run["device_seconds"] < 16        # the budget, plus the in-flight trial and the top-3 re-measurement
    assert run["evaluations"] < 3 * 2 * 40   # far short of 500 trials per study


def test_bad_inputs_exit_2(tmp_path, capsys):
    assert main(BASE[:-3] + ["--out", "/etc/passwd/sub", "--batch-sizes", "8"]) == 2
    assert "not writable" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not a cache")
    assert main(["run", "--model", "qwen3.5-35b-a3b", "--replay", str(bad), "--out", str(tmp_path)]) == 2
    assert "unreadable measurement cache" in capsys.readouterr().err
    assert main(["run", "--model", "qwen3.5-35b-a3b", "--out", str(tmp_path)]) == 2
    assert "no GPU visible and no --replay" in capsys.readouterr().err
    assert main(BASE + ["--out", str(tmp_path), "--budget", "soon"]) == 2
