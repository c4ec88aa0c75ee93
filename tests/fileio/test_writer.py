"""The one writer (autotune/fileio/writing.py), per writing command: a user's file of one of our names in
an output folder is byte-identical afterwards (one line, exit 2, nothing measured) unless --force;
merges keep every line the user wrote; files come out 0666 less the umask; a failed write leaves
what was there. Every command runs in-process, as tests/repo/test_reliability.py does."""
import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from autotune.cli import main
from tests.conftest import GRID, ROOT

BACKENDS = ROOT / "benchmarks/data/h200_backends_2026-12-01.jsonl.gz"
USER = b"my own notes, not autotune's\n"


def _snapshot(root: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def _user(path: Path, data: bytes = USER) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _refused(capsys, rc) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("autotune: error: "), (rc, err)
    return err[0]


def _triton_file(h200) -> str:
    from autotune.adapters.sglang_loader import sglang_file_name
    from autotune.problems.models import Problem
    return sglang_file_name(Problem(512, 128, 4096, 10, "bf16"), h200)


def _run(t, *extra, kernels="triton_moe", replay=GRID, model="qwen3.5-397b-a17b"):
    return ["run", "--model", model, "--tp", "8", "--dtype", "bf16", "--kernels", kernels, "--quiet",
            "--trials", "2", "--batch-sizes", "8", "--replay", str(replay), "--out", str(t / "out"),
            "--storage", f"sqlite:///{t / 'a.db'}", *extra]


def _config_dir(t, h200) -> Path:
    return t / "out" / h200.file_name / "configs" / f"triton_{h200.versions['triton'].replace('.', '_')}"


@pytest.mark.parametrize("where", ["config", "down-config", "provenance", "json-summary", "sku-copy"])
def test_run_refuses_a_users_file_before_measuring(tmp_path, capsys, h200, where):
    name = _triton_file(h200)
    target = {"config": lambda: _config_dir(tmp_path, h200) / name,
              "down-config": lambda: _config_dir(tmp_path, h200) / name.replace(".json", "_down.json"),
              "provenance": lambda: tmp_path / "out" / h200.file_name / "provenance.json",
              "json-summary": lambda: tmp_path / "summary.json",
              "sku-copy": lambda: _config_dir(tmp_path, h200) / name.replace("NVIDIA_H200", "NVIDIA_H200_NVL")}[where]()
    _user(target, b'{"1": {"BLOCK_SIZE_M": 16}}' if where != "json-summary" else USER)
    _user(tmp_path / "out" / "notes.txt")          # a file of another name in the output folder
    before = _snapshot(tmp_path)
    rc = main(_run(tmp_path, "--json", str(tmp_path / "summary.json"), "--device-name", "NVIDIA H200 NVL"))
    line = _refused(capsys, rc)
    assert "not a file autotune wrote" in line and str(target) in line and "--force" in line
    assert _snapshot(tmp_path) == before
    assert not (tmp_path / "a.db").exists()                      # refused before the storage was opened


def test_force_replaces_it_and_a_rerun_merges_into_its_own_files(tmp_path, capsys, h200):
    target = _user(_config_dir(tmp_path, h200) / _triton_file(h200), b'{"1": {"BLOCK_SIZE_M": 16}}')
    assert main(_run(tmp_path, "--force")) == 0
    assert "8" in json.loads(target.read_text()) and target.read_bytes() != b'{"1": {"BLOCK_SIZE_M": 16}}'
    assert main(_run(tmp_path)) == 0                              # its own files: no --force needed


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_tuned_files_are_0666_less_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        assert main(_run(tmp_path)) == 0
    finally:
        os.umask(old)
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert written and {stat.S_IMODE(p.stat().st_mode) for p in written} == {mode}


def test_a_failed_copy_leaves_no_partial_file(tmp_path, monkeypatch):
    """The shipped overlay's copies go through the writer: a full disk leaves the old file (or
    none), never a 0-byte SGLang JSON, and no temp file."""
    from autotune.fileio import writing

    src = _user(tmp_path / "src.json", b'{"1": {}}')
    dst = tmp_path / "out" / "E=1,N=1,device_name=X.json"

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(writing.os, "fsync", full)
    with pytest.raises(writing.WriteError, match="No space left on device"):
        writing.copy_file(src, dst)
    assert not dst.exists() and not list(dst.parent.iterdir())


def test_a_full_disk_mid_run_is_one_line_and_the_same_command_writes_without_measuring(tmp_path, capsys, monkeypatch):
    from autotune.fileio import writing

    real = writing.os.fsync

    def full(fd):
        if os.fstat(fd).st_size:        # the first file with content: ENOSPC
            raise OSError(28, "No space left on device")
        return real(fd)
    monkeypatch.setattr(writing.os, "fsync", full)
    rc = main(_run(tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 4 and len(err) == 1 and err[0].startswith("autotune: incomplete: "), (rc, err)
    assert "No space left on device" in err[0] and "the same command redoes the step without measuring" in err[0]
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file() and p.stat().st_size == 0]
    monkeypatch.setattr(writing.os, "fsync", real)              # the disk has room again
    assert main(_run(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "(0 device measurements by this run" in out and "wrote " in out


# --- backend choices: server_args.yaml keeps the user's lines ---------------------------------------

HAND_WRITTEN = "# my server\ntp-size: 8\nmem-fraction-static: 0.85   # measured by hand\n"


def test_run_keeps_every_line_of_a_hand_written_server_args(tmp_path, capsys):
    from autotune.export.server_args import read_values

    yaml_path = _user(tmp_path / "out/NVIDIA_H200/server_args.yaml", HAND_WRITTEN.encode())
    assert main(_run(tmp_path, kernels="moe_bf16", replay=BACKENDS)) == 0
    text = yaml_path.read_text()
    assert text.startswith(HAND_WRITTEN)
    values = read_values(yaml_path)
    assert values["tp-size"] == 8 and values["mem-fraction-static"] == 0.85 and values.get("moe-runner-backend")
    assert main(_run(tmp_path, kernels="moe_bf16", replay=BACKENDS)) == 0   # again: still every line, once
    assert yaml_path.read_text().count("tp-size: 8") == 1 and yaml_path.read_text().startswith(HAND_WRITTEN)


def test_a_flag_the_user_set_stays_the_users(tmp_path):
    from autotune.export.server_args import read_values

    yaml_path = _user(tmp_path / "out/NVIDIA_H200/server_args.yaml", b"moe-runner-backend: triton\n")
    assert main(_run(tmp_path, kernels="moe_bf16", replay=BACKENDS)) == 0
    assert read_values(yaml_path) == {"moe-runner-backend": "triton"}
    assert "# moe-runner-backend: " in yaml_path.read_text()          # ours, as a comment under it


@pytest.mark.parametrize("name", ["backend_choice.json", "flashinfer_tactics_blocklist.json",
                                  "flashinfer_autotune_cache.json"])
def test_run_refuses_a_users_file_among_the_backend_outputs(tmp_path, capsys, name):
    _user(tmp_path / "out/NVIDIA_H200" / name, b'{"mine": 1}')
    before = _snapshot(tmp_path)
    rc = main(_run(tmp_path, kernels="moe_bf16", replay=BACKENDS))
    assert name in _refused(capsys, rc)
    assert _snapshot(tmp_path) == before and not (tmp_path / "a.db").exists()


def test_merge_choices_keeps_the_users_lines_and_refuses_mixing(tmp_path, capsys):
    from autotune.export.server_args import read_values

    assert main(_run(tmp_path, kernels="moe_bf16", replay=BACKENDS)) == 0
    src = tmp_path / "out/NVIDIA_H200"
    dest = _user(tmp_path / "serving/NVIDIA_H200/server_args.yaml", HAND_WRITTEN.encode())
    assert main(["merge-choices", str(src), "--out", str(tmp_path / "serving")]) == 0
    assert dest.read_text().startswith(HAND_WRITTEN) and read_values(dest).get("moe-runner-backend")
    # a GPU-measured folder does not take replayed choices (run refuses the same mix)
    gpu = tmp_path / "gpu/NVIDIA_H200"
    gpu.mkdir(parents=True)
    details = json.loads((src / "backend_choice.json").read_text())
    for entry in details["families"].values():
        entry["measured"]["on"] = "gpu"
    (gpu / "backend_choice.json").write_text(json.dumps(details))
    before = _snapshot(tmp_path)
    rc = main(["merge-choices", str(src), "--out", str(tmp_path / "gpu")])
    assert "replayed is not mixed into it" in _refused(capsys, rc) and _snapshot(tmp_path) == before
    # two GPU models in one merge
    b200 = tmp_path / "b200/NVIDIA_B200"
    b200.mkdir(parents=True)
    (b200 / "backend_choice.json").write_text(json.dumps({**details, "device": {**details["device"],
                                                                                "name": "NVIDIA B200", "sm": 100}}))
    rc = main(["merge-choices", str(src), str(b200), "--out", str(tmp_path / "merged")])
    assert "2 GPU models" in _refused(capsys, rc) and not (tmp_path / "merged").exists()


# --- the commands on files --------------------------------------------------------------------------

def test_merge_caches_refuses_a_users_output(tmp_path, capsys):
    notes = _user(tmp_path / "notes.txt")
    rc = main(["merge-caches", str(GRID), "-o", str(notes)])
    assert "notes.txt" in _refused(capsys, rc) and notes.read_bytes() == USER
    assert main(["merge-caches", str(GRID), "-o", str(notes), "--force"]) == 0
    from autotune.measure.records import is_cache
    assert is_cache(notes)


def test_compile_limits_refuses_a_users_json_before_compiling(tmp_path, capsys):
    mine = _user(tmp_path / "limits.json", b'{"my": "limits"}')
    rc = main(["compile-limits", "--target-sm", "120", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16",
               "--out", str(mine)])
    assert "limits.json" in _refused(capsys, rc) and mine.read_bytes() == b'{"my": "limits"}'


def test_rank_model_refuses_a_users_model_folder_and_replaces_its_own(tmp_path, capsys):
    folder = tmp_path / "model"
    _user(folder / "config.json", b'{"my": "model"}')
    _user(folder / "tokenizer.json", b'{"my": "tokenizer"}')
    before = _snapshot(tmp_path)
    argv = ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--layers", "4", "--out", str(folder)]
    assert "config.json" in _refused(capsys, main(argv)) and _snapshot(tmp_path) == before
    assert main([*argv, "--force"]) == 0
    assert main(argv) == 0                      # its own files now: replaced without --force
    rc = main(["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--out", str(_user(tmp_path / "f"))])
    assert "is a file" in _refused(capsys, rc)


def test_install_refuses_a_users_rank_file_and_a_cache_dir_that_is_a_file(tmp_path, capsys):
    from tests.fakes.flashinfer_folders import model_folder, sglang_path, tuned_folder

    folder, model = tuned_folder(tmp_path), model_folder(tmp_path)
    cache = tmp_path / "cache"
    rank0 = _user(Path(sglang_path(cache, model, 0)), b'{"mine": 1}')
    before = _snapshot(tmp_path)
    argv = ["install", str(folder), "--model-path", str(model), "--tp", "2", "--cache-dir", str(cache)]
    assert "not a file autotune wrote" in _refused(capsys, main(argv)) and _snapshot(tmp_path) == before
    assert not (Path(sglang_path(cache, model, 1))).exists()       # no rank written
    rank0.unlink()
    rc = main([*argv[:-1], str(_user(tmp_path / "a-file"))])
    assert "is a file" in _refused(capsys, rc)


def test_install_refuses_an_sglang_cache_dir_that_is_a_file(tmp_path, capsys, monkeypatch):
    from tests.fakes.flashinfer_folders import model_folder, tuned_folder

    folder, model = tuned_folder(tmp_path), model_folder(tmp_path)
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(_user(tmp_path / "not-a-folder")))
    rc = main(["install", str(folder), "--model-path", str(model), "--tp", "2"])
    assert "SGLANG_CACHE_DIR must name a folder" in _refused(capsys, rc)
    assert (tmp_path / "not-a-folder").read_bytes() == USER


def test_validate_refuses_a_users_report_before_any_run(tmp_path, capsys):
    from tests.fakes.tuned_folders import tuned

    configs = tuned(tmp_path, "tuned", {1: 10.0})
    out = tmp_path / "report"
    _user(out / "report.md", b"# my report\n")
    before = _snapshot(tmp_path)
    rc = main(["validate", "--engine", "harness", "--model", "qwen3.5-35b-a3b", "--configs", str(configs),
               "--out", str(out), "--batch-sizes", "1"])
    assert "report.md" in _refused(capsys, rc) and _snapshot(tmp_path) == before


def test_publish_refuses_a_file_the_serving_repo_did_not_get_from_autotune(tmp_path, capsys):
    from tests.fakes.tuned_folders import tuned

    src = tuned(tmp_path, "tuned", {1: 10.0})
    repo = tmp_path / "serving"
    dest = repo / "tuned_configs" / src.name
    _user(dest / "validation.json", b'{"my": "results"}')
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"],
                ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, capture_output=True)
    before = _snapshot(repo)
    rc = main(["publish", "--to", str(repo), "--from", str(src)])
    assert "validation.json" in _refused(capsys, rc) and _snapshot(repo) == before
    branches = subprocess.run(["git", "-C", str(repo), "branch"], capture_output=True, text=True).stdout
    assert "tuned/" not in branches


def test_record_refuses_a_users_cache_before_any_worker(tmp_path, capsys):
    notes = _user(tmp_path / "notes.txt")
    rc = main(["record", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--cache", str(notes)])
    assert "refusing to overwrite it" in _refused(capsys, rc) and notes.read_bytes() == USER


def test_export_refuses_a_users_file(tmp_path, capsys, h200):
    assert main(_run(tmp_path)) == 0
    mine = _user(tmp_path / "out2" / h200.file_name / "provenance.json", b'{"my": 1}')
    capsys.readouterr()
    rc = main(["export", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--trials", "2",
               "--batch-sizes", "8", "--replay", str(GRID), "--storage", f"sqlite:///{tmp_path / 'a.db'}",
               "--out", str(tmp_path / "out2")])
    assert "provenance.json" in _refused(capsys, rc) and mine.read_bytes() == b'{"my": 1}'


def test_a_run_with_nothing_to_tune_leaves_the_storage_as_it_was(tmp_path, capsys):
    """The README's main job, then one whose scope the replay does not hold: the storage is not opened."""
    assert main(_run(tmp_path)) == 0
    db = tmp_path / "a.db"
    before = db.read_bytes(), db.stat().st_mtime_ns
    rc = main(_run(tmp_path, model="qwen3.5-35b-a3b"))
    assert "nothing to tune" in _refused(capsys, rc)
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
