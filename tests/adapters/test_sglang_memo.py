"""SGLang's loader answers remembered on disk (autotune/adapters/sglang_loader.py): a remembered
answer is SGLang's own, a change to the files SGLang would read is seen, a broken memo costs
nothing, and a process with the answers remembered never imports SGLang."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.adapters import sglang_loader
from autotune.adapters.sglang_loader import builtin_config_dir, memo_path, sglang_default_config, sglang_selection
from autotune.problems.models import Problem
from tests.conftest import GRID, ROOT

QWEN_TP4 = Problem(512, 256, 4096, 10, "bf16", (1, 8))      # SGLang 0.5.23 ships an H200 file for it
SHIPPED = "E=512,N=256,device_name=NVIDIA_H200.json"


@pytest.fixture
def fresh_memo(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "memo"))
    monkeypatch.setattr(sglang_loader, "_memo", None)
    return tmp_path / "memo"


def forbid_asking_sglang(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("asked SGLang for an answer the memo holds")
    monkeypatch.setattr(sglang_loader, "sglang_view", refuse)


def shipped_copy(tmp_path) -> tuple:
    """A config folder holding SGLang's shipped file for QWEN_TP4, in the Triton folder it ships in."""
    src = sorted((Path(builtin_config_dir()) / "configs").glob(f"triton_*/{SHIPPED}"))[-1]
    dst = tmp_path / "cfg/configs" / src.parent.name / SHIPPED
    dst.parent.mkdir(parents=True)
    dst.write_text(src.read_text())
    return tmp_path / "cfg", dst


def test_remembered_answers_are_sglangs_and_a_changed_file_is_seen(fresh_memo, tmp_path, h200, monkeypatch):
    folder, shipped = shipped_copy(tmp_path)
    asked = {M: sglang_selection(QWEN_TP4, M, h200, str(folder)) for M in (1, 8, 512)}
    default = sglang_default_config(QWEN_TP4, 8, h200)
    assert all(found for _, _, found in asked.values())
    assert asked[8][0] == json.loads(shipped.read_text())["8"]          # SGLang read the shipped file
    assert len(json.loads(memo_path().read_text())) == 4

    with monkeypatch.context() as m:       # a new process: only the file on disk
        m.setattr(sglang_loader, "_memo", None)
        forbid_asking_sglang(m)
        assert {M: sglang_selection(QWEN_TP4, M, h200, str(folder)) for M in (1, 8, 512)} == asked
        got = sglang_default_config(QWEN_TP4, 8, h200)
        assert got == default
        got["BLOCK_SIZE_M"] = -1            # what a caller does with its copy stays its own
        assert sglang_default_config(QWEN_TP4, 8, h200) == default

    edited = {k: {**v, "BLOCK_SIZE_N": 32} for k, v in json.loads(shipped.read_text()).items()}
    shipped.write_text(json.dumps(edited))
    up, _, found = sglang_selection(QWEN_TP4, 8, h200, str(folder))
    assert found and up == edited["8"]
    shipped.unlink()                         # gone: SGLang falls back to its default
    assert sglang_selection(QWEN_TP4, 8, h200, str(folder))[2] is False


def test_a_broken_memo_is_started_afresh(fresh_memo, h200):
    assert sglang_selection(QWEN_TP4, 8, h200)[2]
    memo_path().write_text(memo_path().read_text()[:40])          # cut short by something else
    sglang_loader._memo = None
    assert sglang_selection(QWEN_TP4, 8, h200)[2]
    assert len(json.loads(memo_path().read_text())) == 1


def test_a_users_file_where_the_memo_would_go_is_left_as_it_was(fresh_memo, h200):
    """AUTOTUNE_CACHE_DIR naming a folder of the user's, which holds a file of the memo's name."""
    memo_path().parent.mkdir(parents=True)
    for users in ('{"answers": "mine"}', "my notes\n", '{"truncated'):
        memo_path().write_text(users)
        sglang_loader._memo = None
        assert sglang_selection(QWEN_TP4, 8, h200)[2]           # SGLang's answer all the same
        assert memo_path().read_text() == users


@pytest.mark.slow
def test_a_run_with_the_answers_remembered_never_imports_sglang_and_exports_the_same(tmp_path):
    """Two replay runs, each a new process on one memo: the first asks SGLang's loader (run from its
    source: no SGLang import either), the second finds every answer remembered (export and its shipped
    overlay included) and writes the same files."""
    code = ("import sys; from autotune.cli import main; rc = main(sys.argv[1:]); "
            "print('sglang imported:', 'sglang' in sys.modules); "
            "from autotune.adapters.sglang_loader import light_config_module as loader; "
            "print('loader run:', loader.cache_info().currsize == 1); sys.exit(rc)")
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path / "memo")}
    outs = []
    for run in ("cold", "warm"):
        args = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                "--replay", str(GRID), "--batch-sizes", "1,8", "--trials", "4", "--quiet",
                "--storage", f"sqlite:///{tmp_path / run}.db", "--out", str(tmp_path / run)]
        p = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        outs.append(p.stdout)
    assert all("sglang imported: False" in out for out in outs)
    assert "loader run: True" in outs[0] and "loader run: False" in outs[1]
    files = sorted(p.relative_to(tmp_path / "cold") for p in (tmp_path / "cold").rglob("E=*.json"))
    assert len(files) > 2                   # ours and SGLang's shipped overlay
    assert files == sorted(p.relative_to(tmp_path / "warm") for p in (tmp_path / "warm").rglob("E=*.json"))
    for f in files:
        assert (tmp_path / "cold" / f).read_bytes() == (tmp_path / "warm" / f).read_bytes()


def test_a_remembered_answer_of_the_wrong_form_is_asked_again(fresh_memo, h200):
    """A memo damaged or edited by hand: each answer that is not of its question's form is SGLang's
    again, and replaced in the file."""
    right = (sglang_selection(QWEN_TP4, 8, h200), sglang_default_config(QWEN_TP4, 8, h200))
    memo_path().write_text(json.dumps({k: "garbage" for k in json.loads(memo_path().read_text())}))
    sglang_loader._memo = None
    assert (sglang_selection(QWEN_TP4, 8, h200), sglang_default_config(QWEN_TP4, 8, h200)) == right
    assert "garbage" not in json.loads(memo_path().read_text()).values()
