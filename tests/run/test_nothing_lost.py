"""Nothing measured is lost: a step after the search that fails (the layer check, the files of a problem,
--record, --json) is one line and exit 4, the other steps still run, and the same command does the step
again without measuring; every batch size gets a key, or a line that says why not and an exit code."""
import gzip
import json

from autotune.cli import main
from tests.conftest import GRID

RUN = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe", "--quiet",
       "--trials", "2"]


def _run(t, *extra, bs="1,8", replay=GRID):
    return [*RUN, "--batch-sizes", bs, "--replay", str(replay), "--out", str(t / "out"),
            "--storage", f"sqlite:///{t / 'a.db'}", *extra]


def _incomplete(capsys, rc, *says) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 4 and len(err) == 1 and err[0].startswith("autotune: incomplete: "), (rc, err)
    for s in says:
        assert s in err[0], err[0]
    return err[0]


def _files(t) -> dict:
    return {p.relative_to(t / "out").as_posix(): p.read_bytes() for p in (t / "out").rglob("*") if p.is_file()}


def test_a_failed_record_costs_the_recording_only_and_the_same_command_writes_it(tmp_path, capsys, monkeypatch):
    from autotune.measure import records

    real = records.write_cache

    def broken(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(records, "write_cache", broken)
    rec = tmp_path / "rec.jsonl.gz"
    _incomplete(capsys, main(_run(tmp_path, "--record", str(rec))), "--record", "No space left on device")
    files = _files(tmp_path)
    assert any(name.endswith("device_name=NVIDIA_H200.json") for name in files)      # the tuned files are there
    monkeypatch.setattr(records, "write_cache", real)
    assert main(_run(tmp_path, "--record", str(rec))) == 0
    assert "(0 device measurements by this run" in capsys.readouterr().out and rec.exists()
    configs = {n: b for n, b in files.items() if n.endswith(".json") and "/configs/" in n}
    assert {n: b for n, b in _files(tmp_path).items() if n in configs} == configs    # the same picks, from the storage


def test_a_failed_summary_is_one_line_after_the_files(tmp_path, capsys, monkeypatch):
    from autotune.run import sinks

    def broken(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(sinks.Summary, "write", broken)
    _incomplete(capsys, main(_run(tmp_path, "--json", str(tmp_path / "s.json"))), "--json", "Permission denied")
    assert any(name.endswith("_down.json") for name in _files(tmp_path))


def test_a_failed_layer_check_keeps_the_picks_and_says_so(capsys):
    import functools
    from types import SimpleNamespace

    import torch

    from autotune.families.triton_moe import TritonMoe, confirm
    from autotune.gpus.device import DeviceInfo
    from autotune.problems.models import Problem
    from autotune.run.sinks import Summary, after_search

    def out_of_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    summary = Summary()
    tuner = SimpleNamespace(problem=Problem(512, 128, 4096, 10, "bf16"), pool=None,
                            device=DeviceInfo("NVIDIA H100 80GB HBM3", 90, 232448))
    real = confirm.confirm_by_layer
    confirm.confirm_by_layer = out_of_memory
    try:
        checked = TritonMoe().confirm(tuner, {}, functools.partial(after_search, summary))
    finally:
        confirm.confirm_by_layer = real
    assert checked.records == {} and checked.columns == {}
    assert summary.failures == ["the layer check of E=512,N=128,K=4096,topk=10,bf16 failed: OutOfMemoryError: "
                                     "CUDA out of memory. Tried to allocate 1.00 GiB"]
    assert "the same command does it again without measuring" in capsys.readouterr().out


def _failing_at(t, M: int):
    """The grid recording with every record at batch size M a runtime error."""
    lines = gzip.open(GRID, "rt").read().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        r = json.loads(line)
        if r["M"] == M:
            r.update(status="runtime_error", reason="first launch: RuntimeError: boom", time_us=None, spread=None)
        out.append(json.dumps(r))
    path = t / "failing.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(out) + "\n")
    return path


def test_a_batch_size_no_config_ran_at_gets_a_line_and_exit_4_and_the_others_their_keys(tmp_path, capsys):
    rc = main(_run(tmp_path, replay=_failing_at(tmp_path, 8)))
    out = capsys.readouterr()
    assert rc == 4 and "has no key for M=8" in out.err
    assert "M=8: no key written: no gate_up config ran correctly (" in out.out and "boom" in out.out
    up = next((tmp_path / "out").rglob("E=512,N=128,device_name=NVIDIA_H200.json"))
    assert list(json.loads(up.read_text())) == ["1"]


def test_every_batch_size_of_the_problem_has_a_key(tmp_path, capsys):
    from autotune.folder.config_files import config_folder

    assert main([*RUN, "--replay", str(GRID), "--out", str(tmp_path / "out"),
                 "--storage", f"sqlite:///{tmp_path / 'a.db'}"]) == 0
    # (a replay with the default batch sizes tunes those its recording holds)
    folder = tmp_path / "out/NVIDIA_H200"
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["files"]
    for up, entry in prov["files"].items():          # ours: each tuned file and its _down file
        Ms = entry["problem"]["batch_sizes"]
        assert Ms == [1, 8, 32, 64, 256, 1024, 4096]
        for name in (up, entry["down_file"]):
            keys = json.loads((folder / config_folder(entry["triton"]) / name).read_text())
            assert [int(k) for k in keys] == Ms, name
