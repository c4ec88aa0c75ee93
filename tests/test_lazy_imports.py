"""The commands on a tuned folder import no SGLang, torch, transformers or FlashInfer where their answer
does not need them (issue 44, item 7: SGLang's import alone is 6-10 s of CPU): `check` of a folder on
a machine without a GPU (SGLang's loader run from its own source), `publish` and `merge-choices` (the
runners a module declares, SGLang's list asked only for a name none declares), and `install` once the
installed stack's answers are remembered. Each is asserted on the set of modules a fresh process holds
after the command's library call, never on a time; the light loader's answers are asserted equal to
those of the loader SGLang's import gives."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune.adapters import local_gpu, sglang_loader
from autotune.gpus.device import DeviceInfo
from autotune.problems.models import Problem
from tests.conftest import ROOT

HEAVY = ("sglang", "torch", "transformers", "flashinfer", "triton")
H200 = ROOT / "tuned_configs/NVIDIA_H200"

# One fresh process: each command's library call, then the heavy packages it left imported. The
# commands run in turn, so a leak shows at the first command that made it (and every later one).
_AFTER_EACH = """
import json, sys
from autotune import folder_commands as fc
from autotune.export.flashinfer import Parallel
from autotune.export.install import ServerFlags

heavy, a = {heavy!r}, json.loads(sys.argv[1])
calls = {{
    "check": lambda: fc.check(a["check"]),
    "merge-choices": lambda: fc.merge_choices([a["check"]], a["merged"]),
    "publish": lambda: fc.publish(a["serving"], a["check"]),
    "install": lambda: fc.install(a["tuned"], ServerFlags(a["model"], Parallel(2, 1, 1, 1)), a["cache"]),
}}
out = {{}}
for name in a["commands"]:
    calls[name]()
    out[name] = sorted(m for m in heavy if m in sys.modules)
print(json.dumps(out))
"""


def _fresh_process(args: dict, env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", _AFTER_EACH.format(heavy=HEAVY), json.dumps(args)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _serving_repo(path):
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (path / "README").write_text("serving\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    return path


def test_folder_commands_import_no_sglang_torch_transformers_or_flashinfer(tmp_path, monkeypatch):
    from autotune.cli import main
    from tests.fakes.flashinfer_folders import model_folder, tuned_folder

    cache = tmp_path / "memo"
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(cache))
    monkeypatch.setattr(sglang_loader, "_memo", None)
    tuned, model = tuned_folder(tmp_path), model_folder(tmp_path)
    # install asks the installed stack once (SGLang's flag values, transformers' config classes, torch's
    # dtypes, FlashInfer's file keys) and remembers; that first ask is here, in this process
    assert main(["install", str(tuned), "--model-path", str(model), "--tp", "2", "--cache-dir",
                 str(tmp_path / "warm")]) == 0
    args = {"check": str(H200), "merged": str(tmp_path / "merged"), "serving": str(_serving_repo(tmp_path / "serving")),
            "tuned": str(tuned), "model": str(model), "cache": str(tmp_path / "sglang-cache"),
            "commands": ["merge-choices", "publish", "install"]}
    if local_gpu.no_cuda_driver():          # check re-times on a GPU, which imports torch as it should
        args["commands"].insert(0, "check")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), AUTOTUNE_CACHE_DIR=str(cache))
    got = _fresh_process(args, env)
    assert got == {name: [] for name in args["commands"]}
    assert (tmp_path / "merged/NVIDIA_H200/server_args.yaml").is_file()          # each did its work
    assert len(list((tmp_path / "sglang-cache").rglob("rank_*.json"))) == 2


@pytest.mark.slow        # a fresh process importing SGLang: 10 s of CPU to show the check above can fail
def test_the_module_set_check_sees_a_command_that_imports_sglang(tmp_path, monkeypatch):
    """The check above fails where a command imports SGLang: install with nothing remembered asks it."""
    from tests.fakes.flashinfer_folders import model_folder, tuned_folder

    tuned, model = tuned_folder(tmp_path), model_folder(tmp_path)
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), AUTOTUNE_CACHE_DIR=str(tmp_path / "empty-memo"))
    got = _fresh_process({"tuned": str(tuned), "model": str(model), "cache": str(tmp_path / "c"),
                          "commands": ["install"]}, env)
    assert "sglang" in got["install"]


def test_no_cuda_driver_is_answered_without_torch(monkeypatch):
    import ctypes

    def refuse(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(ctypes, "CDLL", refuse)
    assert local_gpu.no_cuda_driver() is True
    with pytest.raises(local_gpu.NoDeviceError):
        local_gpu.detect()
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *a, **k: object())
    assert local_gpu.no_cuda_driver() is False


# --- the light loader: SGLang's loader file run from its source gives the imported loader's answers ----

RTX = DeviceInfo("NVIDIA RTX PRO 6000 Blackwell Server Edition", 120, 101376, versions={"triton": "3.6.0"})
SMALL_SMEM = DeviceInfo("NVIDIA GeForce RTX 4090", 89, 99 * 1024, versions={"triton": "3.5.1"})
PROBLEMS = [Problem(512, 256, 4096, 10, "bf16", (1,)), Problem(512, 128, 4096, 10, "fp8_w8a8_block", (1,)),
            Problem(128, 768, 2048, 8, "fp8_w8a8", (1,)), Problem(64, 1408, 2048, 6, "bf16", (1,))]


def _questions(mod, p: Problem):
    bs = list(p.block_shape) if p.block_shape else None
    out = {"file": mod.get_config_file_name(p.E, p.N, p.sglang_dtype, bs),
           "down_file": mod.get_config_file_name(p.E, p.N, p.sglang_dtype, bs, down_moe=True),
           "configs": mod.get_moe_configs(p.E, p.N, p.sglang_dtype, bs[0] if bs else 0, bs[1] if bs else 0)}
    for M in (1, 64, 600, 4096):
        out[f"default {M}"] = mod.get_default_config(M, p.E, p.N, p.K, p.top_k, p.sglang_dtype, False, bs)
        out[f"pick {M}"] = mod.try_get_optimal_moe_config((p.E, 2 * p.N, p.K), (p.E, p.K, p.N), p.top_k,
                                                          p.sglang_dtype, M, block_shape=bs, return_down_config=True)
    return out


@pytest.mark.parametrize("folder", [None, "tuned_configs/NVIDIA_H200", "tuned_configs/sglang-0.5.16/NVIDIA_H200"])
def test_the_light_loader_answers_as_the_imported_one(h200, folder):
    """SGLang's shipped folder (its Triton-version fallback), and our two committed folders (a `_down`
    file, block-FP8), on three GPUs (the low-shared-memory FP8 default among them)."""
    config_dir = str(ROOT / folder) if folder else None
    for device in (h200, RTX, SMALL_SMEM):
        for p in PROBLEMS:
            with sglang_loader.sglang_view(device, config_dir, light=True) as mod:
                light = _questions(mod, p)
            with sglang_loader.sglang_view(device, config_dir) as mod:
                real = _questions(mod, p)
            assert light == real, (device.name, p)


def test_a_question_the_light_loader_cannot_answer_is_asked_of_sglangs_import(h200, monkeypatch):
    """A name the light loader does not answer raises there, and the imported loader answers instead."""
    light = sglang_loader.light_config_module()
    monkeypatch.setattr(light, "get_default_config", lambda *a, **k: light.torch.cuda)     # torch is empty
    got = sglang_loader.loader_answer(h200, lambda mod: mod.get_default_config(1, 512, 128, 4096, 10, None, False))
    with sglang_loader.sglang_view(h200) as mod:
        assert got == mod.get_default_config(1, 512, 128, 4096, 10, None, False)
