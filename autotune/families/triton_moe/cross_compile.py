"""Exact resource limits for a GPU we do not have: SGLang's fused-MoE kernel compiled for sm_XY here.

Triton compiles for any NVIDIA target without the GPU (`GPUTarget("cuda", 120, 32)`); what the
compiled kernel needs (`metadata.shared`, bytes of shared memory per block) and whether it compiles
at all are facts, where the family's shared-memory estimate is a model calibrated on the H200.
`cross_target(sm)` makes Triton's runtime answer "this is an sm_XY GPU" and turns every launch into
a compile (warm-up mode), so SGLang's own call path (`TritonMoe.compile`: `invoke_fused_moe_kernel`,
its activation quantization included) produces the exact kernel a real launch would, on the CPU.

`record` compiles every config of an architecture's search space and writes
`search_spaces/compiled/sm<XY>.json`; `TritonMoe.check` then judges that architecture by the
record (for the Triton version it was compiled with) instead of the estimate. GROUP_SIZE_M only
reorders tiles, so one compile stands for every GROUP_SIZE_M of a config.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from pathlib import Path

from autotune.fileio.writing import read_json, write_json
from autotune.contract.config import KernelConfig
from autotune.contract.spaces import SPACES_DIR

COMPILED_DIR = SPACES_DIR / "compiled"
NOT_SHARED = ("GROUP_SIZE_M",)   # config keys that do not change what the kernel allocates


def record_key(dtype: str, gemm: str, config: KernelConfig) -> str:
    """What the compiled record keys a config by (the file's key)."""
    c = {k: v for k, v in config.items() if k not in NOT_SHARED}
    return f"{dtype}|{gemm}|" + json.dumps(c, separators=(",", ":"), sort_keys=True)


@contextlib.contextmanager
def cross_target(sm: int):
    """Triton's runtime answering for an sm_XY GPU; every kernel launch compiles and returns."""
    import os

    import torch
    from triton.backends.compiler import GPUTarget

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: Triton's interpreter compiles nothing (unset it to cross-compile)")
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class CrossTarget:
        target = GPUTarget("cuda", sm, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return self.target

        def get_active_torch_device(self):
            return torch.device("cpu")

    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    saved = driver._active        # reset_active() would build the default driver: none exists on a CPU
    driver.set_active(CrossTarget())
    JITFunction.run = compile_only
    try:
        yield
    finally:
        JITFunction.run = launch
        driver._active = saved


def small_problem(problem):
    """Same N, K, top-k and dtype with few experts: the compiled kernel is the same (E is no kernel
    argument) and the CPU builds the inputs in milliseconds."""
    return dataclasses.replace(problem, E=max(16, problem.top_k))


def compile_one(family, problem, gemm: str, config: KernelConfig, inputs_cache: dict) -> dict:
    """{"shared": bytes} or {"error": one line}, for `config` compiled inside `cross_target`."""
    import torch

    from autotune.families.triton_moe.moe_align import cpu_align_block_size

    p = small_problem(problem)
    key = (p.key, gemm)
    if key not in inputs_cache:
        x = family.make_inputs(p, gemm, 64, routings=1, on_cpu=True)
        bf = torch.bfloat16
        inputs_cache[key] = dataclasses.replace(
            x, on_cpu=False, A=[a.to(bf) for a in x.A], C=x.C.to(bf),
            B=x.B if p.dtype.startswith("fp8") else x.B.to(bf))
    inputs = inputs_cache[key]
    bm = config["BLOCK_SIZE_M"]
    inputs._aligned.setdefault((bm, 0), cpu_align_block_size(inputs.topk_ids[0], bm, p.E))
    try:
        kernel = family.compile(config, inputs)
    except Exception as e:       # Triton's compile errors: what the GPU's own compile would raise
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"}
    return {"shared": int(kernel.metadata.shared)}


@functools.lru_cache(maxsize=8)
def load(sm: int, triton_version: str | None = None) -> dict | None:
    """The record for sm_XY compiled with `triton_version` (its major.minor), or None."""
    path = COMPILED_DIR / f"sm{sm}.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    if triton_version and doc.get("triton", "").split(".")[:2] != triton_version.split(".")[:2]:
        return None
    return doc


def record(sm: int, problems, family, out: Path | None = None, log=print) -> Path:
    """Compile every config of the arch section's space for each problem's dtype and GEMM; resumable
    (an existing record for the same Triton version is extended)."""
    import triton

    from autotune.gpus.device import planned
    out = out or COMPILED_DIR / f"sm{sm}.json"
    device = planned(sm)
    doc = {"triton": triton.__version__, "sm": sm, "records": {}}
    old = read_json(out, default=None)       # compile_limits (folder_commands) refused a file there that is not a record
    if isinstance(old, dict) and old.get("triton") == triton.__version__ and isinstance(old.get("records"), dict):
        doc = old
    try:
        import importlib.metadata as md
        doc["sglang"] = md.version("sglang")
    except Exception:
        pass
    todo, queued = [], set(doc["records"])
    for p in problems:
        for gemm in family.gemms:
            for c in family.space(p, gemm, device).configs():
                k = record_key(p.dtype, gemm, c)
                if k not in queued and not _rule_rejects(family, c, p, gemm, device):
                    queued.add(k)
                    todo.append((p, gemm, c))
    log(f"sm{sm}: {len(todo)} configs to compile with Triton {triton.__version__} ({len(doc['records'])} recorded)")
    cache: dict = {}
    with cross_target(sm):
        for i, (p, gemm, c) in enumerate(todo, 1):
            doc["records"][record_key(p.dtype, gemm, c)] = compile_one(family, p, gemm, c, cache)
            if i % 50 == 0 or i == len(todo):
                write_json(out, doc, indent=0)
                log(f"  {i}/{len(todo)}")
    write_json(out, doc, indent=0)
    return out


def _rule_rejects(family, config, problem, gemm, device) -> bool:
    """Rules that are not about resources (block-FP8 tiles, TMA availability) still apply first."""
    return family.check(config, problem, gemm, device, resources=False) is not None

