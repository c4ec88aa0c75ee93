"""SGLang's own MoE block and NVFP4 linear layer, built as its server builds them, outside a server.

A launch through these is SGLang's code from end to end: the quant method's create_weights, the
layer's checkpoint-format weight_loader, process_weights_after_loading (each backend's shuffled,
interleaved or swizzled layouts, made by SGLang with FlashInfer's functions), the MoE runner
SGLang picks for the flag and the layer's forward. autotune writes no layout code.

What a server sets up before any layer can be built is set up here, once per process, as
SGLang's own layer tests do (sglang/test/layer_ut_utils.py `init_single_process_dist`, used by
its NVFP4 FusedMoE backend test; that module itself imports SGLang's benchmark stack, so the same
four calls are made here):
- a world of one process: `init_distributed_environment(world_size=1)` and
  `initialize_model_parallel` (gloo; TP = EP = 1: the layer is one rank's shard, so the model's
  per-rank shapes E, N, K are built directly);
- a published `ServerArgs(model_path="dummy")`; each layer is then built inside
  `get_context().override_server_args(...)` and `get_flags().moe.override(runner_backend=...)`
  with its own flag values (SGLang's test does the same);
- on a machine that is not the GPU in question (CPU tests, planning), SGLang told which GPU it
  is on: its own `override_platform`, plus the capability probes two quant modules bound by name
  at import (`platform_view`).
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket

from autotune.gpus.catalog import SM100S, SM120S

# Modules that bound `get_device_capability` / `is_cuda` by name at import, and read them when
# they resolve `auto` (modelopt_quant: the NVFP4 MoE runner; fp4_utils: the FP4 GEMM backend).
_CAPABILITY_READERS = ("sglang.srt.layers.quantization.modelopt_quant", "sglang.srt.layers.quantization.fp4_utils")


def platform_facts(sm: int) -> dict:
    """What SGLang's platform probes (runtime_context._PLATFORM_PROBES) answer on a CUDA GPU of compute capability `sm`."""
    return dict(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False,
                is_sm90=sm == 90, is_sm100=sm in SM100S, is_sm110=sm == 110, is_sm120=sm in SM120S,
                is_sm100_or_sm110=sm in SM100S or sm == 110, is_blackwell=sm >= 100,
                device_capability=(sm // 10, sm % 10), device_sm=sm)


@contextlib.contextmanager
def platform_view(sm: int | None):
    """SGLang's code, inside, answers as on an SM`sm` GPU (None: as on this machine)."""
    if sm is None:
        yield
        return
    import importlib

    from sglang.srt.runtime_context import override_platform

    facts = platform_facts(sm)
    saved = []
    try:
        for name in _CAPABILITY_READERS:
            mod = importlib.import_module(name)
            for attr, value in (("get_device_capability", lambda *a, **k: facts["device_capability"]),
                                ("is_cuda", lambda: True)):
                if hasattr(mod, attr):
                    saved.append((mod, attr, getattr(mod, attr)))
                    setattr(mod, attr, value)
        with override_platform(**facts):
            yield
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_world_failed: list = []      # the first world() failure, raised again by every later call


def world():
    """The one-process world SGLang's layers read (its parallel groups and published ServerArgs);
    returns its runtime context, which every build and forward here runs in (a worker may have
    another one active for SGLang's config loader: autotune.adapters.sglang_loader.sglang_context).
    Built once per process: a build that fails half-way (its groups made, a later import missing)
    cannot be retried, so every later call gets that first error, not SGLang's "already initialized",
    which would hide the first failure's cause (a missing module, say) from every later backend."""
    if _world_failed:
        raise _world_failed[0]
    try:
        return _build_world()
    except Exception as e:
        _world_failed.append(e)
        raise


@functools.lru_cache(maxsize=1)
def _build_world():
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, get_context, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    # its own rendezvous, never the environment's MASTER_ADDR/MASTER_PORT: set there, the port was inherited
    # by every process this one starts (a child's world then found it taken by this one: EADDRINUSE, and
    # SGLang's `auto` unknown in the README main job run from a test process that had built a world)
    init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                                 local_rank=0, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path="dummy"), role="autotune", ranks=SpawnRanks(world_rank=0))
    if parallel_state._WORLD is not None:     # publish starts a fresh context: keep the world group
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
    initialize_model_parallel(backend="gloo")
    return get_context()


@contextlib.contextmanager
def moe_flags(backend: str, quantization: str | None):
    """`--moe-runner-backend backend` (and the checkpoint's quantization) for what runs inside."""
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.runtime_context import get_context, get_flags, use_context

    with use_context(world()), get_context().override_server_args(model_path="dummy", quantization=quantization, moe_runner_backend=backend), \
            get_flags().moe.override(runner_backend=MoeRunnerBackend(backend)):
        yield


@contextlib.contextmanager
def fp4_gemm_flag(backend: str):
    """`--fp4-gemm-backend backend` for what runs inside: SGLang's NVFP4 linear reads the module
    global its `initialize_fp4_gemm_config` sets from the published flag (at build and at forward)."""
    from sglang.srt.layers.quantization import fp4_utils
    from sglang.srt.runtime_context import get_context, use_context

    saved = fp4_utils.FP4_GEMM_RUNNER_BACKEND
    with use_context(world()), get_context().override_server_args(model_path="dummy", quantization="modelopt_fp4",
                                            fp4_gemm_runner_backend=backend):
        fp4_utils.initialize_fp4_gemm_config()
        try:
            yield
        finally:
            fp4_utils.FP4_GEMM_RUNNER_BACKEND = saved


# --- the MoE block --------------------------------------------------------------------------------

QUANTIZATION = {"bf16": None, "fp8_w8a8_block": "fp8", "nvfp4": "modelopt_fp4"}


def quant_config(dtype: str, block_shape=None):
    """The checkpoint's quantization config, as SGLang reads it from a Qwen3.5 checkpoint."""
    if dtype == "bf16":
        return None
    if dtype == "fp8_w8a8_block":
        from sglang.srt.layers.quantization.fp8 import Fp8Config
        return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                         weight_block_size=list(block_shape))
    if dtype == "nvfp4":
        from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config
        return ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=16, exclude_modules=[],
                                 packed_modules_mapping={})
    raise ValueError(f"no SGLang quantization config for {dtype!r} experts")


class MoeBlock:
    """Qwen3.5's sparse MoE block as SGLang's model builds it (models/qwen2_moe.py
    Qwen2MoeSparseMoeBlock, which Qwen3.5 uses): `TopK(top_k, renormalize=True)`, `FusedMoE` with
    RenormalizeNaive routing, the TopK bound to the experts' runner backend (the output format the
    runner takes: standard ids and weights, or the logits for runners that route inside)."""

    def __init__(self, problem, backend: str, device: str = "cuda"):
        import torch
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
        from sglang.srt.layers.moe.topk import TopK
        from sglang.srt.layers.moe.utils import RoutingMethodType

        self.backend, self.quantization = backend, QUANTIZATION[problem.dtype]
        with moe_flags(backend, self.quantization), torch.device(device):
            self.topk = TopK(top_k=problem.top_k, renormalize=True, layer_id=0)
            self.experts = FusedMoE(num_experts=problem.E, hidden_size=problem.K, intermediate_size=problem.N,
                                    layer_id=0, top_k=problem.top_k, params_dtype=torch.bfloat16,
                                    quant_config=quant_config(problem.dtype, problem.block_shape),
                                    routing_method_type=RoutingMethodType.RenormalizeNaive,
                                    # Qwen3.5's shared expert reads the hidden states after the
                                    # routed ones: SGLang builds its experts out of place
                                    inplace=False)
            self.topk.bind_runner_backend(self.experts.runner_backend,
                                          routing_method_type=self.experts.routing_method_type)

    def load(self, shards) -> "MoeBlock":
        """Checkpoint-format shards through the layer's weight_loader, then SGLang's processing
        into the backend's layouts."""
        with moe_flags(self.backend, self.quantization):
            shards.load(self.experts)
            self.experts.quant_method.process_weights_after_loading(self.experts)
        return self

    @property
    def runner_backend(self) -> str:
        """The MoE runner SGLang resolved the flag to (`auto` resolves inside the quant method)."""
        qm = self.experts.quant_method
        chosen = getattr(qm, "_moe_runner_backend", None) or self.experts.runner_backend
        return getattr(chosen, "value", str(chosen))

    def __call__(self, x, router_logits):
        return self.apply(x, self.route(x, router_logits))

    def route(self, x, router_logits):
        """The router's top-k of `router_logits`, as the block computes it before its experts."""
        with moe_flags(self.backend, self.quantization):
            return self.topk(x, router_logits)

    def apply(self, x, routed):
        """The experts on a routing `route` gave (what a config of the runner changes; the top-k is not)."""
        with moe_flags(self.backend, self.quantization):
            out = self.experts(x, routed)
        return out if not isinstance(out, tuple) else out[0]


def fused_experts(problem, weights, x, topk_weights, topk_ids):
    """SGLang's `fused_experts`, the function its Triton MoE runner calls for a layer's experts (its
    moe_runner/triton.py `fused_experts_none_to_triton`), on one routing: `weights` = (w13 [E, 2N, K], w13 scale,
    w2 [E, K, N], w2 scale) as that runner holds them (block-FP8: one scale per 128 x 128 tile), the runner
    config Qwen3.5's block builds (out of place, SiLU-and-mul, no routed scaling). The configs are those SGLang's
    loader reads (use_triton_configs)."""
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts as sglang_fused_experts
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    w13, s13, w2, s2 = weights
    fp8 = problem.dtype.startswith("fp8")
    config = MoeRunnerConfig(num_experts=problem.E, num_local_experts=problem.E, hidden_size=problem.K,
                             intermediate_size_per_partition=problem.N, layer_id=0, top_k=problem.top_k,
                             activation="silu", is_gated=True, inplace=False)
    with moe_flags("triton", QUANTIZATION[problem.dtype]):
        return sglang_fused_experts(x, w13, w2, StandardTopKOutput(topk_weights, topk_ids, None), config,
                                    use_fp8_w8a8=fp8, w1_scale=s13, w2_scale=s2,
                                    block_shape=list(problem.block_shape) if problem.block_shape else None)


def resolved_moe_backend(problem, sm: int | None = None) -> str:
    """What SGLang resolves `--moe-runner-backend auto` to for these experts on an SM`sm` GPU: its
    server-argument stage (arg_groups/moe_hook.py: e.g. flashinfer_cutlass for ModelOpt NVFP4 on
    SM110/SM120), then the quant method's own (e.g. marlin for NVFP4 on SM80-SM99, flashinfer_trtllm
    on SM100). Asked of SGLang's code, on a tiny layer when the second stage is needed."""
    from sglang.srt.arg_groups.moe_hook import handle_moe_kernel_config
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.server_args import ServerArgs

    quantization = QUANTIZATION[problem.dtype]
    with platform_view(sm):
        args = ServerArgs(model_path="dummy", quantization=quantization)
        handle_moe_kernel_config(args)
        value = resolved_view(args).moe_runner_backend
        if value != "auto":
            return value
        from dataclasses import replace
        tiny = replace(problem, E=problem.top_k, N=128, K=256)
        return MoeBlock(tiny, "auto", device="meta").runner_backend


def resolved_fp4_gemm_backend(sm: int | None = None) -> str:
    """What SGLang resolves `--fp4-gemm-backend auto` to on an SM`sm` GPU (fp4_utils.initialize_fp4_gemm_config)."""
    from sglang.srt.layers.quantization import fp4_utils

    with platform_view(sm), fp4_gemm_flag("auto"):
        return fp4_utils.get_fp4_gemm_runner_backend().value


# --- the NVFP4 linear -----------------------------------------------------------------------------

class Fp4Linear:
    """One NVFP4 linear layer [N x K] of a ModelOpt checkpoint as SGLang builds it (ReplicatedLinear
    with ModelOptFp4Config: one rank's shard, so no parallel split), loaded through its
    weight_loader and processed for `--fp4-gemm-backend backend`."""

    def __init__(self, N: int, K: int, backend: str, device: str = "cuda"):
        import torch
        from sglang.srt.layers.linear import ReplicatedLinear

        self.backend = backend
        with fp4_gemm_flag(backend), torch.device(device):
            self.layer = ReplicatedLinear(K, N, bias=False, params_dtype=torch.bfloat16,
                                          quant_config=quant_config("nvfp4"), prefix="model.layers.0.mlp.fp4")

    def load(self, weight) -> "Fp4Linear":
        """`weight`: {"weight", "weight_scale", "weight_scale_2", "input_scale"} in checkpoint format."""
        with fp4_gemm_flag(self.backend):
            for name, t in weight.items():
                self.layer.weight_loader(getattr(self.layer, name), t)
            self.layer.quant_method.process_weights_after_loading(self.layer)
        return self

    def __call__(self, x):
        with fp4_gemm_flag(self.backend):
            out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


# --- what a launch through these layers may answer ------------------------------------------------

class Refused(RuntimeError):
    """SGLang (or FlashInfer through it) declines to build or run this backend for these weights
    on this GPU: its own check said so, in Python, before any kernel ran."""


# What SGLang's and FlashInfer's own checks raise ("Current platform does not support NVFP4 ...",
# "moe_runner_backend=cutlass is not supported for NVFP4 MoE", "... require SM100+").
_REFUSALS = (ValueError, NotImplementedError, AssertionError)


@contextlib.contextmanager
def refusals(what: str):
    """A check of SGLang's (or FlashInfer's) raised inside becomes `Refused`, with its message;
    kernel errors (RuntimeError, CUDA errors), crashes and wrong numbers stay what they are."""
    try:
        yield
    except Refused:
        raise
    except _REFUSALS as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise Refused(f"{what} refused: {type(e).__name__}: {text}") from e


_CONFIG_DIR = []


def use_triton_configs(config_dir: str | None) -> None:
    """SGLang's Triton MoE runner reads its configs from `config_dir` where that is a tuned folder
    (it holds configs/: SGLANG_MOE_CONFIG_DIR, as a server started with it), else from SGLang's own
    folder (a run that tunes no Triton configs has none in its --out; pointing SGLang at an empty
    folder fails its loader). Its loader caches what it read, so a change of
    folder clears that cache."""
    want = config_dir if config_dir and os.path.isdir(os.path.join(config_dir, "configs")) else ""
    if _CONFIG_DIR != [want]:
        from autotune.adapters.sglang_loader import sglang_config_module

        if want:
            os.environ["SGLANG_MOE_CONFIG_DIR"] = want
        else:
            os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
        sglang_config_module().get_moe_configs.cache_clear()
        _CONFIG_DIR[:] = [want]
