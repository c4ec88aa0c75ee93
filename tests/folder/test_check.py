"""`autotune check` on the serving machine: a changed Triton, a changed GPU and a fresh folder."""
import json
from functools import partial
from pathlib import Path

import pytest

from autotune.adapters import local_gpu
from autotune.gpus import device as devmod
from autotune.cli import main

FOLDER = Path(__file__).resolve().parents[2] / "tuned_configs/NVIDIA_H200"


def machine_as_measured(**change):
    d = json.loads((FOLDER / "provenance.json").read_text())["device"]
    versions = {**d["versions"], **change.pop("versions", {})}
    return devmod.DeviceInfo.from_dict({**d, **change, "versions": versions})


@pytest.mark.parametrize("change,code,says", [
    ({}, 0, "GPU NVIDIA H200 and Triton 3.6.0 as measured"),
    ({"versions": {"triton": "3.8.0"}}, 1, "Triton: measured with 3.6.0, this machine has 3.8.0"),
    ({"name": "NVIDIA H100 80GB HBM3"}, 1, "will not load these files here"),
    ({"versions": {"torch": "2.14.1"}, "driver": "590.1"}, 0, "note: torch: measured with 2.11.0+cu130"),
])
def test_machine_drift(monkeypatch, capsys, change, code, says):
    monkeypatch.setattr(local_gpu, "detect", lambda *a, **k: machine_as_measured(**change))
    assert main(["check", str(FOLDER), "--sglang-version", "0.5.23", "--no-retime"]) == code
    assert says in capsys.readouterr().out


def _rows(tuned, shipped, default, spread=0.005):
    """What layer_timing.time_sides returns, at each sampled M, for the sides check hands it: the tuned folder,
    SGLang's own folder (None) and an empty one (its default config)."""
    def timer(problem, sides, Ms, repeats):
        assert problem.key.startswith("E=512,N=128,K=4096")
        assert sides["tuned"] == str(FOLDER) and sides["shipped"] is None
        assert list((Path(sides["default"]) / "configs").iterdir()) == []
        return [{"M": M, "tuned µs": tuned, "shipped µs": shipped, "default µs": default,
                 "tuned spread": spread, "shipped spread": spread, "default spread": spread} for M in Ms]
    return timer


@pytest.mark.parametrize("times,code,says", [
    ((10.0, 10.5, 14.0), 0, "no slower than either"),
    ((10.0, 10.08, 14.0), 0, "no slower than either"),          # within the 1% floor
    ((11.0, 10.0, 14.0), 1, "slower than shipped by 10.0%"),
    ((11.0, 14.0, 10.0), 1, "slower than default by 10.0%"),
])
def test_on_a_matching_gpu_the_files_are_retimed_against_shipped_and_default(times, code, says):
    from autotune.families.triton_moe.retime import RETIME_MS, retime
    from autotune.folder.check import check_folder

    got, lines = check_folder(FOLDER, "0.5.23", machine_as_measured(), retime=partial(retime, timer=_rows(*times)))
    assert got == code
    timed = [line for line in lines if " M=" in line]
    # each Triton MoE file of the folder (bf16 and block-FP8), at the sampled batch sizes it holds
    assert len(timed) == 2 * len(RETIME_MS) and all(says in line for line in timed)
    assert all("(SGLang's own folder)" in line for line in timed)


def test_batch_sizes_no_file_holds_are_bad_input(monkeypatch, capsys):
    """One line, exit 2, before anything is timed (the re-timing needs a GPU; this is refused first)."""
    monkeypatch.setattr(local_gpu, "detect", lambda *a, **k: machine_as_measured())
    monkeypatch.setattr("autotune.families.triton_moe.layer_timing.time_sides", lambda *a: pytest.fail("timed"))
    assert main(["check", str(FOLDER), "--sglang-version", "0.5.23", "--batch-sizes", "3,5"]) == 2
    err = capsys.readouterr().err
    assert "--batch-sizes 3,5: no Triton MoE file" in err and "Traceback" not in err and err.count("\n") == 1


def test_a_gpu_that_drifted_is_not_retimed(capsys):
    from autotune.families.triton_moe.retime import retime
    from autotune.folder.check import check_folder

    def never(*a):
        raise AssertionError("re-timed on another GPU")
    code, lines = check_folder(FOLDER, "0.5.23", machine_as_measured(name="NVIDIA H100 80GB HBM3"),
                               retime=partial(retime, timer=never))
    assert code == 1


def test_without_a_gpu_only_sglang_is_checked_and_it_says_so(monkeypatch, capsys):
    def none(*a, **k):
        raise devmod.NoDeviceError("no CUDA GPU visible")
    monkeypatch.setattr(local_gpu, "detect", none)
    assert main(["check", str(FOLDER), "--sglang-version", "0.5.23"]) == 0
    assert "no GPU visible here" in capsys.readouterr().out


def test_only_drifted_retunes_the_files_a_release_cannot_run_and_then_nothing(tmp_path, capsys):
    """A folder tuned for SGLang 0.5.23 (up-projection USE_TMA) drifts for 0.5.16; `run
    --only-drifted` re-tunes just its files for 0.5.16, after which check passes and a second
    --only-drifted has nothing to do (and measures nothing)."""
    import hashlib

    from autotune.cli import main
    from tests.conftest import GRID

    folder, db = tmp_path / "out/NVIDIA_H200", tmp_path / "a.db"
    common = ["--replay", str(GRID), "--trials", "10", "--quiet", "--storage", f"sqlite:///{db}"]
    assert main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                 "--batch-sizes", "1,8", "--out", str(tmp_path / "out"), "--sglang-version", "0.5.23", *common]) == 0
    assert main(["check", str(folder), "--sglang-version", "0.5.16"]) == 1
    capsys.readouterr()
    assert main(["run", "--only-drifted", str(folder), "--sglang-version", "0.5.16", *common]) == 0
    out = capsys.readouterr().out
    assert "drifted: E=512,N=128,device_name=NVIDIA_H200.json: does not run in SGLang 0.5.16" in out
    assert main(["check", str(folder), "--sglang-version", "0.5.16"]) == 0
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    capsys.readouterr()
    assert main(["run", "--only-drifted", str(folder), "--sglang-version", "0.5.16", *common]) == 0
    assert "nothing drifted" in capsys.readouterr().out
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


BF16 = "configs/triton_3_6_0/E=512,N=128,device_name=NVIDIA_H200.json"


def _edit(path: Path, fn) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("case,damage,says", [
    ("non-integer-key", lambda f: _edit(f, lambda d: d.update({"one": d["1"]})), "key 'one' is not a batch size"),
    ("negative-block", lambda f: _edit(f, lambda d: d["1"].update(BLOCK_SIZE_N=-64)),
     "M=1: BLOCK_SIZE_N: Input should be greater than 0"),
    ("not-a-power-of-two", lambda f: _edit(f, lambda d: d["8"].update(BLOCK_SIZE_K=96)), "96 is not a power of two"),
    ("no-num-warps", lambda f: _edit(f, lambda d: d["1"].pop("num_warps")), "M=1: no num_warps"),
    ("unknown-key", lambda f: _edit(f, lambda d: d["1"].update(num_ctas=2)), "num_ctas: Extra inputs are not permitted"),
    ("truncated", lambda f: f.write_text(f.read_text()[:200]), "not valid JSON"),
    ("deleted", lambda f: f.unlink(), "listed in provenance.json but missing"),
])
def test_check_reads_every_file_it_checks(tmp_path, capsys, case, damage, says):
    """A folder whose bf16 file is damaged was called fresh: check only read provenance.json."""
    import shutil

    folder = tmp_path / "NVIDIA_H200"
    shutil.copytree(FOLDER, folder)
    damage(folder / BF16)
    assert main(["check", str(folder), "--sglang-version", "0.5.23"]) == 1
    out = capsys.readouterr().out
    assert f"drift: {Path(BF16).name}: " in out and says in out, out
    assert out.strip().endswith("drifted: re-tune or re-export (see above)")


def test_a_hand_edit_is_seen_by_the_sha256_recorded_at_export(tmp_path, capsys):
    from tests.conftest import GRID

    out = tmp_path / "out"
    assert main(["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                 "--quiet", "--trials", "2", "--batch-sizes", "8,64", "--replay", str(GRID), "--out", str(out),
                 "--storage", f"sqlite:///{tmp_path / 'a.db'}"]) == 0
    folder = out / "NVIDIA_H200"
    assert main(["check", str(folder), "--sglang-version", "0.5.23"]) == 0      # as exported: every file reads
    prov = json.loads((folder / "provenance.json").read_text())
    up = next(iter(prov["files"]))
    assert set(prov["files"][up]["sha256"]) == {up, prov["files"][up]["down_file"]}
    path = next(folder.glob(f"configs/triton_*/{up}"))
    _edit(path, lambda d: d["8"].update(num_stages=2 if d["8"]["num_stages"] != 2 else 3))   # valid, but not ours
    capsys.readouterr()
    assert main(["check", str(folder), "--sglang-version", "0.5.23"]) == 1
    assert f"drift: {up}: changed since export" in capsys.readouterr().out


def test_sglangs_loader_reads_each_file(tmp_path):
    """The loader step on its own: a file SGLang's loader would not find under its name is drift."""
    import shutil

    from autotune.folder.tuned import TunedFolder
    from autotune.families.triton_moe.schema import sglang_loads
    from autotune.folder.config_files import file_problems

    folder = tmp_path / "NVIDIA_H200"
    shutil.copytree(FOLDER, folder)
    prov = TunedFolder(folder).recorded()
    assert file_problems(folder, prov, sglang_loads) == {}
    entry = prov["files"][Path(BF16).name]
    entry["device"] = "NVIDIA B200"          # SGLang looks for device_name=NVIDIA_B200: not this file
    why = sglang_loads(entry, folder / BF16, json.loads((folder / BF16).read_text()))
    assert why and "does not find it" in why


def test_a_provenance_of_no_files_is_said_not_called_fresh_in_silence(tmp_path, capsys):
    """A folder whose provenance lists no tuned file (a backend-choices-only export) printed a bare
    "fresh", as if its Triton files had been read."""
    import shutil

    folder = tmp_path / "NVIDIA_H200"
    shutil.copytree(FOLDER, folder)
    prov = json.loads((folder / "provenance.json").read_text())
    (folder / "provenance.json").write_text(json.dumps({**prov, "files": {}}))
    for name, entry in prov["files"].items():          # as such an export leaves it: no tuned file either
        for f in (name, entry.get("down_file")):          # (one left there is drift: SGLang would load it)
            if f:
                (folder / f"configs/triton_{entry['triton'].replace('.', '_')}" / f).unlink()
    assert main(["check", str(folder), "--sglang-version", "0.5.23"]) == 0
    out = capsys.readouterr().out
    assert "lists no tuned config files" in out and "runs in SGLang" not in out, out
