"""Run in a fresh process: what one SGLang release hands its fused-MoE Triton kernel for each entry
of a tuned folder, and which of those keyword arguments the release's kernel rejects.

    python tests/adapters/sglang_release_probe.py RELEASE_ROOT|installed DEVICE_NAME E N K TOPK FOLDER:DTYPE [FOLDER:DTYPE ...]

RELEASE_ROOT holds an unpacked release's `sglang/` tree (scripts/setup.sh puts 0.5.16 in
.venv/sglang-releases/); `installed` uses the installed SGLang. Everything that decides is the
release's own code: its loader (`try_get_optimal_moe_config`, via `_prepare_fused_moe_run`, which
pops or keeps USE_TMA) and its kernel's signature (`fused_moe_kernel.arg_names`), checked with
Triton's own rule (a launch keyword must be a kernel argument or a compile option, else
"Keyword argument ... was specified but unrecognised"). What stands in for the GPU: the device name
the loader sees, "TMA descriptors supported" (an SM90 GPU with Triton's TensorDescriptor), and the
token alignment (`moe_align_block_size`, a CUDA kernel whose output only routes tokens).
Prints one JSON object per FOLDER:DTYPE, one line each, in order (one process per release: importing a
release is most of a check): {"release", "per_M": {M: {"up": [...keys], "down": [...], "rejected": [...]}},
"loaded": [files the loader logged]}.
"""
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys

from autotune.adapters.sglang_versions import KERNELS, LOADER, RUNNER  # where every supported release keeps them

PKG = "sglang.srt.layers.moe.moe_runner"


def stub_package(name, **attrs):
    """Register package `name` without running its __init__ (which pulls in the model configs and, on
    older releases, clashes with this venv's transformers); its submodules import as usual."""
    spec = importlib.util.find_spec(name)
    mod = importlib.util.module_from_spec(spec)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def main(root, device_name, E, N, K, top_k, jobs):
    if root != "installed":
        sys.path.insert(0, root)
    import sglang
    stub_package("sglang.srt.layers.moe")
    stub_package(PKG)
    stub_package(f"{PKG}.triton_utils", get_config=lambda: None)
    if importlib.util.find_spec("sglang.srt.layers.deep_gemm_wrapper") is not None:
        stub_package("sglang.srt.layers.deep_gemm_wrapper")
    sys.modules[PKG].MoeRunnerConfig = importlib.import_module(f"{PKG}.base").MoeRunnerConfig
    cfg = importlib.import_module(LOADER)
    fused = importlib.import_module(RUNNER)
    kernels = importlib.import_module(KERNELS)

    from sglang.srt import runtime_context as rc
    import types
    if hasattr(cfg, "get_exec"):        # 0.5.17+: deterministic-inference flag from the exec config bag
        cfg.get_exec = lambda: types.SimpleNamespace(
            deterministic=types.SimpleNamespace(enable_deterministic_inference=False))
    else:                               # 0.5.16: from the published server args
        rc.get_context().set_server_args(types.SimpleNamespace(enable_deterministic_inference=False))

    # The GPU stand-ins (see the docstring).
    cfg.get_device_name = lambda *a, **k: device_name
    for name in ("support_tensor_descriptor", "_moe_support_tma", "_down_moe_use_tma"):
        if hasattr(fused, name):
            setattr(fused, name, lambda: True)
    fused.moe_align_block_size = lambda topk_ids, block_m, num_experts: (None, None, None)
    loaded = []

    class Grab(logging.Handler):
        def emit(self, record):
            loaded.append(record.getMessage())
    logging.getLogger(cfg.__name__).addHandler(Grab())
    logging.getLogger(cfg.__name__).setLevel(logging.INFO)

    from triton.backends.nvidia.compiler import CUDAOptions
    accepted = set(kernels.fused_moe_kernel.arg_names) | {f.name for f in dataclasses.fields(CUDAOptions)}
    for job in jobs:
        folder, dtype = job.rsplit(":", 1)
        os.environ["SGLANG_MOE_CONFIG_DIR"] = folder
        for f in vars(cfg).values():          # the loader's lru_caches would answer from the last folder
            if hasattr(f, "cache_clear"):
                f.cache_clear()
        loaded.clear()
        print(json.dumps(check(cfg, fused, accepted, root, sglang, folder, dtype, E, N, K, top_k, loaded)))


def check(cfg, fused, accepted, root, sglang, folder, dtype, E, N, K, top_k, loaded):
    import torch

    fp8 = dtype.startswith("fp8")
    block = [128, 128] if dtype == "fp8_w8a8_block" else None
    meta = dict(device="meta")
    w1 = torch.empty(E, 2 * N, K, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, **meta)
    w2 = torch.empty(E, K, N, dtype=w1.dtype, **meta)
    up_name = cfg.get_config_file_name(E, N, "fp8_w8a8" if fp8 else None, block)
    found = [d for d in os.listdir(os.path.join(folder, "configs"))
             if os.path.exists(os.path.join(folder, "configs", d, up_name))]
    keys = json.load(open(os.path.join(folder, "configs", found[0], up_name)))
    per_m = {}
    for M in sorted(int(k) for k in keys):
        hidden = torch.empty(M, K, dtype=torch.bfloat16, **meta)
        out = fused._prepare_fused_moe_run(
            hidden, w1, w2, torch.zeros(M, top_k, dtype=torch.int32), use_fp8_w8a8=fp8, use_int8_w8a8=False,
            use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False, block_shape=block)
        up, down = out[0], out[1]
        down = down or up                 # the kernel sequence runs the down GEMM with `down_config or config`
        per_m[M] = {"up": sorted(up), "down": sorted(down),
                    "rejected": sorted((set(up) | set(down)) - accepted)}
    return {"release": importlib.metadata.version("sglang") if root == "installed"
            else os.path.basename(root.rstrip("/")), "sglang_file": sglang.__file__,
            "per_M": per_m, "loaded": list(loaded)}


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), a[6:])
