"""A tuned folder holding a FlashInfer cache, an NVFP4 model folder, and SGLang's own cache path of each rank."""
import ast
import hashlib
import importlib.util
import json
from pathlib import Path

import torch
from flashinfer.autotuner.autotuner import _collect_metadata

from autotune.cli import main
from autotune.adapters.flashinfer_cache import CacheEntry, write_cache
from autotune.export.tactics import BLOCKLIST_FILE, CACHE_FILE

SM = 120


def sglang_path_function():
    """SGLang's own flashinfer_autotune_cache_path, compiled from the installed source with the
    server's context replaced by stubs (importing its module needs a full server environment)."""
    spec = importlib.util.find_spec("sglang")
    src = Path(spec.submodule_search_locations[0]) / "srt/model_executor/runner/flashinfer_autotune.py"
    tree = ast.parse(src.read_text())
    wanted = {"flashinfer_autotune_cache_path", "get_flashinfer_autotune_skip_ops"}
    body = [n for n in tree.body
            if (isinstance(n, ast.FunctionDef) and n.name in wanted)
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "FLASHINFER_AUTOTUNE_WORKAROUND_SKIPS"
                                                   for t in n.targets))]
    assert len(body) == 3, "SGLang's cache-path code moved; re-check sglang_cache_path"
    ns = {"hashlib": hashlib, "Path": Path, "ModelRunner": object}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(src), "exec"), ns)
    return ns


def tuned_folder(tmp_path: Path, tactic=5) -> Path:
    folder = tmp_path / "tuned" / "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
    folder.mkdir(parents=True)
    meta = {k: "*" for k in _collect_metadata()}
    write_cache(folder / CACHE_FILE, [CacheEntry("fp4_gemm", "CutlassFp4GemmRunner", ((64, 2048),), tactic)], meta)
    (folder / "backend_choice.json").write_text(json.dumps({"device": {"name": "NVIDIA RTX PRO 6000", "sm": SM}}))
    (folder / "server_args.yaml").write_text("moe-runner-backend: flashinfer_cutlass\n")
    (folder / BLOCKLIST_FILE).write_text('{"_metadata": {}, "invalid_tactics": {}}')
    return folder


def model_folder(tmp_path: Path) -> Path:
    out = tmp_path / "model"
    assert main(["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--layers", "4", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def sglang_path(cache_dir, model, tp_rank, tp=2, runner="flashinfer_cutlass", dtype=torch.bfloat16,
                quantization="modelopt_fp4"):
    """SGLang 0.5.23's own flashinfer_autotune_cache_path for this server."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    ns = sglang_path_function()
    parallel = SimpleNamespace(tp_size=tp, pp_size=1, attn_dp_size=1, moe_ep_size=1, tp_rank=tp_rank, pp_rank=0,
                               dp_rank=None)
    ns.update(torch=SimpleNamespace(cuda=SimpleNamespace(get_device_capability=lambda device: divmod(SM, 10))),
              envs=SimpleNamespace(SGLANG_CACHE_DIR=SimpleNamespace(get=lambda: str(cache_dir))),
              get_model=lambda: SimpleNamespace(model_path=str(model), quantization=quantization),
              get_exec=lambda: SimpleNamespace(moe=SimpleNamespace(moe_runner_backend=runner),
                                               kernel=SimpleNamespace(flashinfer_autotune_skip_ops=[])),
              get_parallel=lambda: parallel)
    mr = SimpleNamespace(device="cuda", dtype=dtype, is_draft_worker=False,
                         model_config=SimpleNamespace(hf_config=AutoConfig.from_pretrained(str(model)),
                                                      quantization=quantization))
    return ns["flashinfer_autotune_cache_path"](mr)
