"""SGLang's fused-MoE Triton kernel: the gate_up GEMM and the down GEMM, tuned apart.

Everything here calls SGLang's own code: the kernel (`invoke_fused_moe_kernel`), the block
alignment, the default-config heuristic and the config-file loader. What this module adds
is the knowledge the search must not have: which configs can run (shared memory, block-FP8
tile rules, TMA), how SGLang sizes its buffers per GEMM, and the float32 reference.
"""
from __future__ import annotations

from autotune.contract import spaces
from autotune.contract.config import KernelConfig
from autotune.gpus.device import DeviceInfo
from autotune.numerics.fp8 import FP8_MAX
from autotune.problems.models import Problem
from autotune.contract.registry import CONFIGS, MOE
from autotune.families.triton_moe.files import SglangMoeFiles
from autotune.families.triton_moe.inputs import MoeInputs, compute_dtype, expert_weights, quantized, random_routing
from autotune.families.triton_moe.moe_align import cpu_align_block_size, sglang_align_block_size, sglang_alignment_buffers
from autotune.families.triton_moe.tma import tma_capable
from autotune.adapters.sglang_loader import sglang_default_config, sglang_selection

GEMMS = ("gate_up", "down")

# Relative Frobenius error allowed against the float32 reference: bf16 tiles land at
# 2e-3..4e-3 on the H200; fp8 adds the activation quantization the reference mirrors.
TOLERANCE = {"fp32": 1e-4, "bf16": 1e-2, "fp8_w8a8_block": 5e-2, "fp8_w8a8": 5e-2}


# --- the family --------------------------------------------------------------------------------

def smem_estimate(config: KernelConfig, problem: Problem, device: DeviceInfo) -> int:
    """Bytes of shared memory the kernel's software pipeline allocates: one A and one B tile
    per buffered stage (+ an 8-byte barrier per stage for TMA loads).

    Calibrated on the H200 against 31k compiles of the kernel: it splits out-of-resources
    from runnable configs exactly when tiles of 64+ rows, which SM90 runs on wgmma, buffer
    num_stages tiles and smaller tiles (mma.sync) num_stages - 1. SM100 is assumed to buffer
    like SM90 wgmma (the stricter rule) and SM120, which has no wgmma, like mma.sync: both are
    uncalibrated until measured there.
    """
    elem = 1 if problem.dtype.startswith("fp8") else 2
    bm = config["BLOCK_SIZE_M"]
    tile = (bm * config["BLOCK_SIZE_K"] + config["BLOCK_SIZE_K"] * config["BLOCK_SIZE_N"]) * elem
    stages = config.get("num_stages", 3)   # Triton's default when a config leaves it out
    wgmma_like = 90 <= device.sm < 120 and bm >= 64
    buffers = stages if wgmma_like else max(1, stages - 1)
    return buffers * tile + (8 * stages if config.get("USE_TMA") else 0)





class TritonMoe(SglangMoeFiles):
    name = "triton_moe"
    # its declaration (autotune.contract.registry); its files' rules are SglangMoeFiles'
    step, problems, options, order = CONFIGS, MOE, ("space_path", "sglang_versions"), 0
    gemms = GEMMS
    # Triton compiles SGLang's kernel for any NVIDIA target without the GPU: builders do it apart from the
    # measuring process (autotune.measure.builders, autotune.families.triton_moe.apart)
    compiles_apart = True

    def __init__(self, space_path: str | None = None, sglang_versions: tuple[str, ...] = ()):
        self.space_path = space_path
        # The SGLang releases the written files must load and run in (empty: the installed one's rules,
        # which are the newest's: every supported release from 0.5.18 runs anything we measure).
        self.sglang_versions = tuple(sglang_versions)
        # A file the user named is read at once (a bad one is one line before anything else is asked);
        # the shipped one when first needed.
        self._space_doc = spaces.load(self.name, space_path, self.gemms) if space_path else None

    # -- what may run ------------------------------------------------------------------------
    def unsupported_reason(self, problem: Problem, device: DeviceInfo) -> str | None:
        if problem.dtype == "nvfp4":
            return "SGLang's Triton fused MoE has no NVFP4 path (see the moe_fp4 family)"
        if problem.block_shape and problem.N % problem.block_shape[0]:
            # SGLang's Fp8MoEMethod.create_weights refuses the layer (the scales' blocks would straddle shards)
            return (f"SGLang refuses block-FP8 MoE weights whose intermediate size per rank ({problem.N}) is not "
                    f"divisible by the {problem.block_shape[0]}x{problem.block_shape[1]} weight block")
        if device.kind == "cpu-interpreter":
            return None if problem.dtype == "bf16" else f"{problem.dtype} does not run in Triton's CPU interpreter"
        if device.sm < 80:
            return f"SGLang's Triton MoE needs SM80+, this is SM{device.sm}"
        if problem.dtype.startswith("fp8") and device.sm < 89:
            return f"{problem.dtype} needs FP8 tensor cores (SM89+), this is SM{device.sm}"
        return None

    # The keys of SGLang's fused-MoE config and the values its kernel takes: a search-space file
    # must give a ladder for each (USE_TMA may be left out) and nothing else. The tiles are
    # tl.arange ranges (Triton takes powers of two only) of at most Triton's largest tensor, and
    # tl.dot operands (K at least 16 on tensor cores); Triton launches a power of two of warps, at
    # most 32 (1024 threads). A value outside these never compiles: every candidate would fail and
    # SGLang's own config would be written as the winner.
    PARAMS = {"BLOCK_SIZE_M": spaces.Rule(int, 1, 1 << 20, True, "a tl.arange range"),
              "BLOCK_SIZE_N": spaces.Rule(int, 1, 1 << 20, True, "a tl.arange range"),
              "BLOCK_SIZE_K": spaces.Rule(int, 16, 1 << 20, True, "a tl.arange range and tl.dot's K"),
              "GROUP_SIZE_M": spaces.Rule(int, 1),
              "num_warps": spaces.Rule(int, 1, 32, True, "Triton's warps per program"),
              "num_stages": spaces.Rule(int, 1),
              "USE_TMA": spaces.Rule(bool)}
    OPTIONAL = ("USE_TMA",)

    def space(self, problem: Problem, gemm: str, device: DeviceInfo):
        if self._space_doc is None:
            self._space_doc = spaces.load(self.name, self.space_path, self.gemms)
        space = spaces.resolve(self._space_doc, self.name, device.arch, gemm)
        spaces.check_params(space, self._space_doc["path"], gemm, self.PARAMS, self.OPTIONAL)
        if "USE_TMA" in space.params and self._tma_unavailable(problem, gemm, device):
            space = spaces.Space(space.family, {k: v for k, v in space.params.items() if k != "USE_TMA"})
        return space

    def _tma_unavailable(self, problem: Problem, gemm: str, device: DeviceInfo) -> str | None:
        """SGLang reads USE_TMA from both files: on gate_up it loads the weights (B) by TMA, on
        down both operands, and its kernel implements the A side for block-FP8 only. Older
        releases among the targets may not accept the key at all (sglang_versions)."""
        from autotune.adapters.sglang_versions import config_problem
        why = config_problem({"USE_TMA": True}, gemm, self.sglang_versions, tma_capable(device))
        if why:
            return why
        if gemm == "down" and not problem.block_shape:
            return "USE_TMA on the down GEMM (TMA loads of A) is implemented for block-FP8 only"
        if device.sm < 90 or device.kind == "cpu-interpreter":
            return "USE_TMA needs SM90+ tensor memory access"
        if not device.versions.get("triton_tma", True):
            return "the installed Triton has no tensor descriptors"
        return None

    def unwritable(self, config: KernelConfig, gemm: str, device: DeviceInfo) -> str | None:
        """Why `config` must not go into the `gemm` file for the target SGLang releases, or None."""
        from autotune.adapters.sglang_versions import config_problem
        return config_problem(config, gemm, self.sglang_versions, tma_capable(device))

    def check(self, config: KernelConfig, problem: Problem, gemm: str, device: DeviceInfo,
              resources: bool = True) -> str | None:
        if resources:
            why = self._resources(config, problem, gemm, device)
            if why:
                return why
        if problem.dtype.startswith("fp8") and config["BLOCK_SIZE_K"] < 32:
            return f"fp8: BLOCK_SIZE_K {config['BLOCK_SIZE_K']} is below 32, the least K of Triton's 8-bit tl.dot"
        if problem.block_shape:
            bn, bk = problem.block_shape
            # One activation/weight scale per K tile: the K tile must not straddle a quant block.
            if bk % config["BLOCK_SIZE_K"]:
                return f"block FP8: BLOCK_SIZE_K {config['BLOCK_SIZE_K']} must divide block_k {bk}"
            if config["BLOCK_SIZE_N"] <= bn and bn % config["BLOCK_SIZE_N"]:
                return f"block FP8: BLOCK_SIZE_N {config['BLOCK_SIZE_N']} must divide block_n {bn}"
        if config.get("USE_TMA"):
            return self._tma_unavailable(problem, gemm, device)
        return None

    @staticmethod
    def _resources(config: KernelConfig, problem: Problem, gemm: str, device: DeviceInfo) -> str | None:
        """Shared memory: exact where this architecture's configs were compiled with this Triton
        (search_spaces/compiled/, autotune.families.triton_moe.cross_compile), else the estimate."""
        from autotune.families.triton_moe.cross_compile import load, record_key

        compiled = load(device.sm, device.versions.get("triton")) if device.kind != "cpu-interpreter" else None
        rec = compiled["records"].get(record_key(problem.dtype, gemm, config)) if compiled else None
        if rec is not None:
            if "error" in rec:
                return f"does not compile for sm{device.sm} (Triton {compiled['triton']}): {rec['error']}"
            if rec["shared"] > device.smem_optin:
                return (f"compiled for sm{device.sm} (Triton {compiled['triton']}): needs {rec['shared']} B of shared "
                        f"memory > {device.smem_optin} B opt-in limit")
            return None
        need = smem_estimate(config, problem, device)
        if need > device.smem_optin:
            return f"shared memory estimate {need} B > {device.smem_optin} B opt-in limit"
        return None

    def after_search_cost(self, problem: Problem, device: DeviceInfo, per_s: float, workers: int) -> float:
        """Seconds this family needs for a problem after its search, at `per_s` seconds a measurement: the
        finalists' careful re-measurements (autotune.families.triton_moe.pairs) and, on a GPU, the layer check
        that picks among them as SGLang runs the layer (autotune.families.triton_moe.confirm)."""
        from autotune.families.triton_moe.costs import after_search_s

        return after_search_s(len(problem.batch_sizes), per_s, workers, device.kind == "gpu")

    def baselines(self, problem: Problem, M: int, device: DeviceInfo) -> dict:
        """SGLang's default configs, and its shipped file's configs where it has one for this GPU."""
        default = KernelConfig.from_entry(sglang_default_config(problem, M, device))
        out = {"default": {"gate_up": default, "down": default}}
        up, down, found = sglang_selection(problem, M, device)
        if found:
            out["shipped"] = {"gate_up": KernelConfig.from_entry(up), "down": KernelConfig.from_entry(down)}
        return out

    def tolerance(self, problem: Problem, on_cpu: bool = False) -> float:
        return TOLERANCE["fp32" if on_cpu else problem.dtype]

    # -- GPU memory (autotune.gpus.memory_plan) ---------------------------------------------------------
    def footprint(self, problem: Problem, device: DeviceInfo, routings: int = 10):
        """One worker's GPU memory for `problem`: both GEMMs' weights (kept for every M), the inputs,
        outputs and float32 reference the worker keeps (about two of the largest batch's, for the heavier
        GEMM: autotune.measure.measurer evicts the rest), and the transient peak of building them or the weights."""
        from autotune.gpus.memory_plan import FLUSH_BYTES, Footprint

        M = max(problem.batch_sizes)
        held = max(_held_inputs(problem, g, M, routings) for g in GEMMS)
        transient = max(max(_reference_transient(problem, g, M) for g in GEMMS), _weight_build_transient(problem))
        return Footprint(f"{self.name} {problem.key}", {"weights": _weight_bytes(problem), "inputs": 2 * held,
                                                        "workspace": FLUSH_BYTES + transient})

    def task_bytes(self, problem: Problem, gemm: str, M: int, routings: int = 10) -> int:
        """What measuring one batch size of one GEMM allocates beside the weights: its inputs, output and
        float32 reference, the reference's transient and the L2 flush buffer (autotune.measure.measurer.make_room)."""
        from autotune.gpus.memory_plan import FLUSH_BYTES

        return _held_inputs(problem, gemm, M, routings) + _reference_transient(problem, gemm, M) + FLUSH_BYTES

    def main_footprint(self, problem: Problem, device: DeviceInfo):
        """The run's own process making each M's pick as SGLang serves the layer (autotune.families.triton_moe.
        confirm: SGLang's fused_experts, autotune.families.triton_moe.layer_timing) at the largest batch: one layer's
        experts, ten routing sets of activations and routings, the layer's buffers for the calls one timed graph
        holds and one eager call, the float32 layer reference."""
        from autotune.gpus.memory_plan import FLUSH_BYTES, Footprint

        M, p = max(problem.batch_sizes), problem
        T = M * p.top_k
        inputs = 10 * (M * p.K * 2 + T * 8)
        layer = (T * 2 * p.N + T * p.N + T * p.K + M * p.K) * 2
        reference = 4 * (3 * M * p.K + 3 * p.N * p.K)
        return Footprint(f"the layer check of {problem.key}", {
            "weights": _weight_bytes(p), "inputs": inputs, "layer": 3 * layer, "reference": reference,
            "workspace": FLUSH_BYTES + _weight_build_transient(p)})

    # -- inputs --------------------------------------------------------------------------------
    def make_inputs(self, problem: Problem, gemm: str, M: int, *, seed: int = 0, skew: float = 0.0,
                    routings: int = 10, on_cpu: bool = False) -> MoeInputs:
        """Random weights and activations (never zeros), generated on the device; routing =
        softmax top-k of random logits, one set per routing so timed replays do not re-read the
        same experts from L2. `skew` > 0 adds a per-expert bias of that many standard
        deviations to the logits (hot experts). Weights are shared by all M of a problem."""
        import torch

        dev = "cpu" if on_cpu else "cuda"
        E, N, K, k = problem.E, problem.N, problem.K, problem.top_k
        cdt = compute_dtype(problem, on_cpu)
        w = self.weights(problem, gemm, seed, dev, cdt)
        g = torch.Generator(device=dev).manual_seed(seed * 7919 + M * 2 + (gemm == "down"))
        topk_ids, topk_weights = random_routing(g, M, E, k, skew, routings)
        rows, in_dim = (M, K) if gemm == "gate_up" else (M * k, N)
        A = [torch.randn(rows, in_dim, generator=g, device=dev).to(cdt) for _ in range(routings)]
        C = torch.empty((M * k, 2 * N) if gemm == "gate_up" else (M, k, K), dtype=cdt, device=dev)
        return MoeInputs(problem, gemm, M, A, w[0], w[1], w[2], C, topk_ids, topk_weights, on_cpu)

    def weights(self, problem: Problem, gemm: str, seed: int, dev: str, cdt):
        """(B, B_scale, dequant(e) -> float32 [rows, cols] of expert e), cached for one problem."""
        key = (problem.key, gemm, seed, dev)
        cache = self.__dict__.setdefault("_weight_cache", {})
        if key not in cache:
            for k in [k for k in cache if k[0] != problem.key]:
                del cache[k]
            cache[key] = expert_weights(problem, gemm, seed, dev, cdt)
        return cache[key]

    def quantize_weights(self, problem: Problem, w, cdt):
        """bf16 weights as is; FP8 weights with a per-block (128x128) or per-expert scale."""
        return quantized(problem, w, cdt)

    def aligned(self, inputs: MoeInputs, block_m: int, routing: int):
        key = (block_m, routing)
        if key not in inputs._aligned:
            fn = (sglang_alignment_buffers if inputs.stand_in else
                  cpu_align_block_size if inputs.on_cpu else sglang_align_block_size)
            inputs._aligned[key] = fn(inputs.topk_ids[routing], block_m, inputs.problem.E)
        return inputs._aligned[key]

    def _tma_sorted_A(self, inputs: MoeInputs, block_m: int, routing: int):
        """The down GEMM's A in SGLang's TMA layout: rows in expert-sorted, block-padded order
        (what SGLang's gate_up writes with c_sorted). Only the first num_tokens_post_padded ids
        are written by the alignment op (the buffer is sized for the worst case and the rest is
        uninitialised memory, negative values included: seen on the H200 as an out-of-bounds
        gather); padding ids equal the token count. No host sync, so a CUDA graph may hold it."""
        import torch

        key = (block_m, routing)
        if key not in inputs._sorted_A:
            sorted_ids, _, ntp = self.aligned(inputs, block_m, routing)
            A = inputs.A[routing]
            pos = torch.arange(sorted_ids.shape[0], device=sorted_ids.device)
            valid = (pos < ntp.reshape(-1)[0]) & (sorted_ids >= 0) & (sorted_ids < A.shape[0])
            rows = A[torch.where(valid, sorted_ids, 0).long()]
            inputs._sorted_A[key] = torch.where(valid[:, None], rows, torch.zeros((), dtype=A.dtype, device=A.device))
        return inputs._sorted_A[key]

    def prepare(self, config: KernelConfig, inputs: MoeInputs) -> None:
        """The GPU work a config needs before its compile (the block alignment, the TMA layout
        of A), done under the worker's GPU lock so the compile that follows launches nothing of
        ours while another worker times. (SGLang's own per-call activation quantization for FP8
        still runs in the compile step: a few microseconds, inside its call path.)"""
        self.aligned(inputs, config["BLOCK_SIZE_M"], 0)
        if inputs.gemm == "down" and config.get("USE_TMA"):
            self._tma_sorted_A(inputs, config["BLOCK_SIZE_M"], 0)

    def warmup(self, problems: list[Problem], on_cpu: bool = False) -> None:
        """Build, once per machine, the JIT kernels SGLang's path needs for these problems'
        dtypes (alignment for small and large batches, activation quantization)."""
        if on_cpu:
            return
        import torch

        seen = set()
        for p in problems:
            if p.dtype in seen:
                continue
            seen.add(p.dtype)
            for gemm in self.gemms:
                for M in (1, 64):
                    inputs = self.make_inputs(p, gemm, M, routings=1)
                    cfg = KernelConfig.from_entry({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64,
                                                   "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2})
                    self.run(cfg, inputs, 0)
            torch.cuda.synchronize()

    # -- launch and reference ------------------------------------------------------------------
    def compile(self, config: KernelConfig, inputs: MoeInputs):
        """Compile (and cache) the kernel variant `run` would launch, without launching it:
        SGLang's own call path with Triton's warm-up mode switched on for the MoE kernel, so
        the compile key is exactly the one of the real launch. Returns Triton's compiled kernel
        (its metadata holds the shared memory it needs). (Triton's CPU interpreter compiles nothing.)"""
        if inputs.on_cpu:
            return None
        from sglang.kernels.ops.moe import fused_moe_triton_kernels as kmod

        kernel = kmod.fused_moe_kernel
        launch = kernel.run
        compiled = []

        def compile_only(*args, grid, warmup, **kwargs):
            compiled.append(launch(*args, grid=grid, warmup=True, **kwargs))
            return compiled[-1]

        kernel.run = compile_only
        try:
            self.run(config, inputs, 0)
        finally:
            del kernel.run
        return compiled[-1] if compiled else None

    def compiling_for(self, sm: int):
        """A context in which `compile_apart` builds kernels for an sm_XY GPU, in a process without one."""
        from autotune.families.triton_moe.apart import compiling_for
        return compiling_for(sm)

    def compile_apart(self, config: KernelConfig, problem: Problem, gemm: str, M: int):
        """Compile what `run` would launch for `config` at batch size M on the GPU, from stand-in inputs."""
        from autotune.families.triton_moe.apart import compile_apart
        return compile_apart(self, config, problem, gemm, M)

    def run(self, config: KernelConfig, inputs: MoeInputs, routing: int, *, c_sorted: bool = False, a_sorted=None,
            a_scale=None):
        """One GEMM through SGLang's invoke_fused_moe_kernel. The keywords are the TMA-down layer
        (autotune.families.triton_moe.moe_layer): gate_up writing its rows expert-sorted into the padded buffer
        (`c_sorted`), down reading that buffer as it is (`a_sorted`, with `a_scale` where the
        activation was quantized beforehand), as SGLang's fused MoE does; the tuning itself times
        each GEMM alone (down's sorted A built beforehand, outside the timing)."""
        import triton.language as tl
        from sglang.kernels.ops.moe.fused_moe_triton_kernels import invoke_fused_moe_kernel

        p = inputs.problem
        cfg = config.to_entry()      # SGLang's call takes its files' entry
        use_tma = bool(cfg.pop("USE_TMA", False))
        sorted_ids, expert_ids, ntp = self.aligned(inputs, cfg["BLOCK_SIZE_M"], routing)
        ctype = tl.float32 if inputs.on_cpu else tl.bfloat16
        fp8 = p.dtype.startswith("fp8")
        common = dict(compute_type=ctype, use_fp8_w8a8=fp8, use_int8_w8a8=False, use_int8_w8a16=False,
                      use_int4_w4a16=False, per_channel_quant=False,
                      block_shape=list(p.block_shape) if p.block_shape else None,
                      filter_expert=p.ep > 1)
        tw, tid = inputs.topk_weights[routing], inputs.topk_ids[routing]
        if inputs.gemm == "gate_up":
            invoke_fused_moe_kernel(inputs.A[routing], inputs.B, None, inputs.C, None, inputs.B_scale, None,
                                    tw, tid, sorted_ids, expert_ids, ntp, False, p.top_k, cfg,
                                    b_use_tma=use_tma, **common, **({"c_sorted": True} if c_sorted else {}))
        else:
            if a_sorted is not None:
                A = a_sorted
            else:
                A = self._tma_sorted_A(inputs, cfg["BLOCK_SIZE_M"], routing) if use_tma else inputs.A[routing]
            invoke_fused_moe_kernel(A, inputs.B, None, inputs.C, a_scale, inputs.B_scale, None,
                                    tw, tid, sorted_ids, expert_ids, ntp, True, 1, cfg,
                                    a_use_tma=use_tma, b_use_tma=use_tma, router_topk=p.top_k, **common)
        return inputs.C

    def reference(self, inputs: MoeInputs, config=None):
        """Float32 result for routing set 0, grouped by expert (no [M*top_k, N, K] gather)."""
        import torch

        if inputs._ref is not None:
            return inputs._ref
        p = inputs.problem
        ids = inputs.topk_ids[0].reshape(-1).long()
        A = self._quantized_activation(p, inputs.A[0])
        rows = torch.arange(ids.numel(), device=ids.device)
        src = rows // p.top_k if inputs.gemm == "gate_up" else rows
        out = torch.zeros((ids.numel(), inputs.B.shape[1]), dtype=torch.float32, device=ids.device)
        for e in torch.unique(ids).tolist():
            sel = rows[ids == e]
            out[sel] = A[src[sel]] @ inputs.dequant(e).T
        if inputs.gemm == "down":
            out = (out * inputs.topk_weights[0].reshape(-1, 1)).view(inputs.M, p.top_k, -1)
        inputs._ref = out
        return out

    def _quantized_activation(self, p: Problem, A):
        """The activation as the kernel sees it: SGLang quantizes A to fp8 inside the call
        (per token and 128-wide group for block FP8, per tensor otherwise)."""
        import torch

        A = A.float()
        if not p.dtype.startswith("fp8"):
            return A
        if p.block_shape:
            g = p.block_shape[1]
            cols = -(-A.shape[1] // g) * g
            Ag = torch.nn.functional.pad(A, (0, cols - A.shape[1])).view(A.shape[0], -1, g)
            s = Ag.abs().amax(-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
            q = (Ag / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s
            return q.view(A.shape[0], cols)[:, : A.shape[1]]
        s = A.abs().amax().clamp(min=1e-12) / FP8_MAX
        return (A / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s


FAMILY = TritonMoe


def _weight_bytes(p: Problem) -> int:
    """Both GEMMs' expert weights as the kernel takes them (one byte an element for FP8), with scales."""
    elem = 1 if p.dtype.startswith("fp8") else 2
    weights = p.E * 3 * p.N * p.K * elem
    if p.block_shape:
        bn, bk = p.block_shape
        return weights + 4 * p.E * (-(-2 * p.N // bn) * -(-p.K // bk) + -(-p.K // bn) * -(-p.N // bk))
    return weights + (8 * p.E if elem == 1 else 0)


def _weight_build_transient(p: Problem) -> int:
    """The float32 chunk of 32 experts the weights are generated in, and FP8 quantization's copies of it."""
    return 32 * 2 * p.N * p.K * 4 * (3 if p.dtype.startswith("fp8") else 1)


def _held_inputs(p: Problem, gemm: str, M: int, routings: int) -> int:
    """Bytes one batch size's inputs keep for `gemm`: activations per routing set, the output, the routing
    and the float32 reference."""
    T = M * p.top_k
    rows, in_dim, out_dim = (M, p.K, 2 * p.N) if gemm == "gate_up" else (T, p.N, p.K)
    return routings * (rows * in_dim * 2 + T * 8) + T * out_dim * (2 + 4)


def _reference_transient(p: Problem, gemm: str, M: int) -> int:
    """What building the float32 reference holds for a moment: the activation in float32 and, for down,
    the routing-weighted copy of the result."""
    T = M * p.top_k
    if gemm == "gate_up":
        return M * p.K * 4 * (2 if p.dtype.startswith("fp8") else 1)
    return T * p.N * 4 + T * p.K * 4
