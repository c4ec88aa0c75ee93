"""The built-in decode harness: a decode step with a model's real per-layer shapes, default vs tuned
fused-MoE configs, for GPUs where the SGLang server cannot run. A harness, not a model.

One decode step of N layers (per tensor-parallel rank, one GPU), each layer:

- the token mixer as plain GEMMs of its real shapes: full attention (1 layer in
  `full_attention_interval`) = QKV projection (queries carry an output gate in Qwen3.5 /
  Qwen3-Next) and output projection; linear attention (Gated DeltaNet, the other layers) =
  in_proj_qkvz, in_proj_ba and out_proj. The attention cores themselves (KV-cache attention,
  the DeltaNet state update, the short convolution) are not run;
- the MoE block: router GEMM, softmax top-k (renormalised), the fused MoE, the shared expert
  (gate_up GEMM, SiLU-and-mul, down GEMM, sigmoid gate) and the residual adds.

The fused MoE is SGLang's Triton kernel through autotune's tuning runner: block alignment with
SGLang's `moe_align_block_size`, `TritonMoe.run` (SGLang's `invoke_fused_moe_kernel`) for the
gate_up GEMM, SGLang's `silu_and_mul`, `TritonMoe.run` for the down GEMM with the routing weights,
the sum over top-k (as autotune.families.moe_backends.run_triton composes it). Its configs are the
ones SGLang's loader picks at each batch size (`sglang_selection`): from the tuned folder on the
tuned side, from SGLang's built-in folder (its shipped file for this GPU, else its default
heuristic) on the default side: what a server started without SGLANG_MOE_CONFIG_DIR loads.

Weights are random (scaled 1/sqrt(K)), generated on the device; expert weights are distinct per
layer as far as memory allows (else layers share sets, reported). On the GPU each timing is a
CUDA graph of the whole step, L2 flushed before each of 7 replays, median (autotune.measure.timing's
protocol); default and tuned are timed in alternation (ABBA) and repeated. tokens/s = batch /
(step time x num_layers / N): the step scaled to the model's full layer count. Embedding, lm_head,
sampling, norms, the attention cores and tensor-parallel all-reduce are not in the step: absolute
tokens/s is higher than a server's; the MoE share of the step says how much of the difference the
kernels can make. Before timing, both sides' MoE outputs are checked against the float32
reference (the moe_* families' reference) at every batch size.

Under TRITON_INTERPRET=1 on the CPU the same code runs in float32 with a wall clock: a pipeline
check on tiny shapes whose numbers mean nothing about speed (labelled so everywhere).
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from autotune.families.triton_moe.moe_layer import SIDES, MoeSides
from autotune.problems.models import ModelError, MoeModel, Problem, layer_gemms, model_from_hf_config, rank_problem
from autotune.validate import HarnessError

INTERPRETER_NOTE = ("cpu-interpreter: Triton's CPU interpreter, float32, wall clock: these numbers exercise "
                    "the pipeline and mean nothing about speed")


# --- shapes -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HarnessModel:
    """The model whose decode step is built (models.MoeModel carries every shape it needs)."""
    model: MoeModel

    @property
    def linear(self):
        return self.model.linear

    @property
    def attn_output_gate(self) -> bool:
        return self.model.attn_output_gate

    @classmethod
    def preset(cls, model: MoeModel) -> "HarnessModel":
        return cls(model)

    @classmethod
    def from_config(cls, path: str | Path) -> "HarnessModel":
        return cls(model_from_hf_config(path))


@dataclass(frozen=True)
class Gemm:
    name: str
    N: int            # output features per rank
    K: int            # input features per rank


@dataclass(frozen=True)
class LayerShapes:
    """Per-rank GEMM shapes of one layer of each kind (SGLang's TP split: column-parallel layers
    split N, row-parallel layers split K, KV heads replicated when TP exceeds them)."""
    model: str
    tp: int
    num_layers: int
    interval: int                              # one full-attention layer in `interval`
    problem: Problem                           # the fused MoE (E, N per rank, K, top_k, dtype)
    router: Gemm
    full_attention: tuple[Gemm, ...]
    linear_attention: tuple[Gemm, ...]
    shared_expert: tuple[Gemm, ...]

    def kind(self, i: int) -> str:
        """Layer i's token mixer, as SGLang's Qwen3.5 / Qwen3-Next configs lay them out."""
        if self.interval <= 1 or not self.linear_attention:
            return "full"
        return "full" if (i + 1) % self.interval == 0 else "linear"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["problem"] = self.problem.to_dict()
        return d


def layer_shapes(hm: HarnessModel, tp: int, dtype: str = "bf16") -> LayerShapes:
    """Per-rank shapes from models.layer_gemms (the same split the GEMM families tune)."""
    m = hm.model
    if tp <= 0:
        raise HarnessError(f"--tp must be positive, got {tp}")
    try:
        problem = replace(rank_problem(m, tp, dtype=dtype), sources=((m.name, tp, 1, "main"),))
        gemms = layer_gemms(m, tp)
    except ModelError as e:
        raise HarnessError(str(e)) from None
    pick = lambda kind, names=None: tuple(Gemm(g.name, g.N, g.K) for g in gemms  # noqa: E731
                                          if g.kind == kind and (names is None or g.name in names))
    full, lin = pick("full"), pick("linear")
    if not full and not lin:
        raise HarnessError(f"{m.name} has no attention shapes (num_attention_heads / head_dim)")
    router = next(Gemm(g.name, g.N, g.K) for g in gemms if g.name == "router")
    interval = max(1, m.full_attention_interval) if lin else 1
    return LayerShapes(m.name, tp, m.num_layers, interval, problem, router, full, lin,
                       pick("moe", ("shared_gate_up", "shared_down", "shared_gate")))


def default_layers(shapes: LayerShapes) -> int:
    """8 layers (two full-attention groups of Qwen3.5's 3:1 layout), fewer for smaller models,
    always whole groups of `interval` so the layer mix is the model's."""
    n = min(8, shapes.num_layers) if shapes.num_layers else 8
    return max(shapes.interval, n - n % shapes.interval)


# --- the step -----------------------------------------------------------------------------------

@dataclass
class _Layer:
    kind: str
    dense: dict                 # GEMM name -> weight [N, K]
    router: object
    w13: object
    s13: object
    d13: object
    w2: object
    s2: object
    d2: object


class DecodeHarness(MoeSides):
    """Weights, the decode step and its timing for one model shape on this device."""

    SEED = 0                    # of the random weights
    WEIGHT_FRACTION = 0.6       # of the GPU's free memory the distinct expert weight sets may take

    def __init__(self, shapes: LayerShapes, device, tuned_dir: str | Path, *, layers: int | None = None,
                 on_cpu: bool = False, inner_repeats: int | None = None):
        import torch

        self.layers = layers or default_layers(shapes)
        if self.layers <= 0:
            raise HarnessError("--layers must be positive")
        super().__init__(shapes.problem, device, tuned_dir, on_cpu=on_cpu, inner_repeats=inner_repeats)
        self.shapes = shapes
        self.notes: list[str] = []
        if self.layers % shapes.interval:
            self.notes.append(f"{self.layers} layers is not a multiple of the {shapes.interval}-layer group: "
                              "the step's layer mix differs from the model's")
        seed = self.SEED
        g = torch.Generator(device=self.dev).manual_seed(seed)

        def weight(n, k):
            return (torch.randn((n, k), generator=g, device=self.dev) / math.sqrt(k)).to(self.dtype)

        p = self.problem
        elem = 1 if p.dtype.startswith("fp8") else 2
        per_layer = p.E * 3 * p.N * p.K * elem
        sets = self.layers
        if not on_cpu:
            free, _ = torch.cuda.mem_get_info()
            sets = max(1, min(self.layers, int(self.WEIGHT_FRACTION * free // per_layer)))
        self.expert_sets = sets
        if sets < self.layers:
            self.notes.append(f"expert weights: {sets} distinct sets for {self.layers} layers (memory)")
        experts = [self.expert_weights(seed * 1000 + s) for s in range(sets)]
        self._layers: list[_Layer] = []
        for i in range(self.layers):
            kind = shapes.kind(i)
            gemms = (shapes.full_attention if kind == "full" else shapes.linear_attention) + shapes.shared_expert
            (w13, s13, d13), (w2, s2, d2) = experts[i % sets]
            self._layers.append(_Layer(kind, {gm.name: weight(gm.N, gm.K) for gm in gemms},
                                       weight(shapes.router.N, shapes.router.K), w13, s13, d13, w2, s2, d2))
        self._record: list | None = None

    # -- pieces ----------------------------------------------------------------------------------
    def route(self, L: _Layer, x):
        import torch
        import torch.nn.functional as F

        probs = torch.softmax(F.linear(x, L.router).float(), dim=-1)
        w, ids = torch.topk(probs, self.problem.top_k, dim=-1)
        return ids.to(torch.int32), w / w.sum(dim=-1, keepdim=True)

    def fused_moe(self, L: _Layer, x, ids, w, side: str):
        return self.moe((L.w13, L.s13, L.d13), (L.w2, L.s2, L.d2), x, ids, w, side)

    def layer(self, L: _Layer, x, side: str):
        import torch
        import torch.nn.functional as F

        d = L.dense
        if L.kind == "full":
            qkv = F.linear(x, d["attn_qkv"])
            x = x + F.linear(qkv[:, : d["attn_o"].shape[1]], d["attn_o"])
        else:
            qkvz = F.linear(x, d["linear_in_proj_qkvz"])
            F.linear(x, d["linear_in_proj_ba"])
            x = x + F.linear(qkvz[:, -d["linear_out_proj"].shape[1]:], d["linear_out_proj"])
        ids, w = self.route(L, x)
        if self._record is not None:
            self._record.append((x, ids, w))
        out = x + self.fused_moe(L, x, ids, w, side)
        if "shared_gate_up" in d:
            h = self.silu_and_mul(F.linear(x, d["shared_gate_up"]))
            out = out + F.linear(h, d["shared_down"]) * torch.sigmoid(F.linear(x, d["shared_gate"]))
        return out

    def step(self, x, side: str):
        for L in self._layers:
            x = self.layer(L, x, side)
        return x

    def moe_only(self, recorded, side: str):
        for L, (x, ids, w) in zip(self._layers, recorded):
            self.fused_moe(L, x, ids, w, side)

    # -- check and timing ------------------------------------------------------------------------
    def check(self, M: int, seed: int = 7) -> dict:
        """Every side's fused MoE at M against the float32 reference of the same layer."""
        import torch

        g = torch.Generator(device=self.dev).manual_seed(seed + M)
        x = torch.randn((M, self.problem.K), generator=g, device=self.dev).to(self.dtype)
        L = self._layers[0]
        ids, w = self.route(L, x)
        return self.check_sides((L.w13, L.s13, L.d13), (L.w2, L.s2, L.d2), x, ids, w)

    def measure(self, batch_sizes, repeats: int = 5, log=print, seed: int = 11) -> dict:
        """Per batch size: check, then `repeats` x (default, tuned) timings of the step and of the
        MoE alone, in ABBA order. Returns {"runs": [...], "configs": {...}, "checks": {...}}."""
        import torch

        from autotune.adapters.sglang_loader import in_context, sglang_context

        scale = self.shapes.num_layers / self.layers if self.shapes.num_layers else 1.0
        runs, configs, checks, moe = [], {}, {}, {}
        with in_context(sglang_context()), torch.no_grad():
            for M in batch_sizes:
                configs[M] = {s: self.side_config(M, s).to_dict() for s in SIDES}
                checks[M] = self.check(M)
                g = torch.Generator(device=self.dev).manual_seed(seed + M)
                x = torch.randn((M, self.problem.K), generator=g, device=self.dev).to(self.dtype)
                recorded = {}
                for side in ("default", "tuned"):       # warm-up (compiles) and the MoE inputs
                    self._record = []
                    self.step(x, side)
                    recorded[side], self._record = self._record, None
                moe[M] = {s: [] for s in SIDES}

                def heuristic():
                    # SGLang's default heuristic: the MoE alone, on the default side's inputs (first or
                    # last in turn, as the other two alternate)
                    t = self.timer(lambda: self.moe_only(recorded["default"], "heuristic"))
                    moe[M]["heuristic"].append(t.median_us)

                for r in range(repeats):
                    if r % 2 == 0:
                        heuristic()
                    for side in (("default", "tuned") if r % 2 == 0 else ("tuned", "default")):
                        t_step = self.timer(lambda: self.step(x, side))
                        t_moe = self.timer(lambda: self.moe_only(recorded[side], side))
                        moe[M][side].append(t_moe.median_us)
                        step_full_us = t_step.median_us * scale
                        runs.append({"side": "baseline" if side == "default" else "tuned", "repeat": r,
                                     "kind": "batch", "x": M,
                                     "metrics": {"tokens_per_s": M / (step_full_us * 1e-6),
                                                 "step_us": t_step.median_us, "step_spread": t_step.spread,
                                                 "step_us_scaled": step_full_us, "moe_us": t_moe.median_us,
                                                 "moe_share": min(1.0, t_moe.median_us / t_step.median_us)}})
                    if r % 2 == 1:
                        heuristic()
                b = [r_["metrics"]["tokens_per_s"] for r_ in runs if r_["x"] == M and r_["side"] == "baseline"]
                t = [r_["metrics"]["tokens_per_s"] for r_ in runs if r_["x"] == M and r_["side"] == "tuned"]
                log(f"  batch {M}: default {sorted(b)[len(b) // 2]:.1f} tok/s, tuned {sorted(t)[len(t) // 2]:.1f} tok/s "
                    f"(step of {self.layers} layers scaled x{scale:.2f}; rel. error vs float32 "
                    f"{checks[M]['default']:.1e} / {checks[M]['tuned']:.1e})")
        return {"runs": runs, "configs": configs, "checks": checks, "moe_by_side": moe}

    def describe(self) -> dict:
        s = self.shapes
        return {"engine": "harness", "label": "harness, not a model", "model": s.model, "tp": s.tp,
                "layers_timed": self.layers, "layers_model": s.num_layers,
                "layer_kinds": [self.shapes.kind(i) for i in range(self.layers)],
                "scale": (s.num_layers / self.layers) if s.num_layers else 1.0,
                "expert_weight_sets": self.expert_sets, "dtype": self.problem.dtype,
                "compute_dtype": str(self.dtype).replace("torch.", ""), "sglang_file": self.file_name,
                "tuned_dir": str(self.tuned_dir), "shapes": s.to_dict(), "notes": self.notes,
                "timing": (INTERPRETER_NOTE if self.on_cpu else
                           "CUDA graph of the whole step, L2 flushed before each of 7 replays, median"),
                "not_modelled": ["attention cores (KV-cache attention, DeltaNet state update, conv1d)", "norms",
                                 "embedding, lm_head, sampling", "tensor-parallel all-reduce", "MTP layers"]}


def header(h: DecodeHarness) -> str:
    s = h.shapes
    kinds = [s.kind(i) for i in range(h.layers)]
    lines = [f"HARNESS, NOT A MODEL: {h.layers} layers of {s.model} at tp{s.tp} per-rank shapes "
             f"({kinds.count('linear')} linear-attention, {kinds.count('full')} full-attention), random weights; "
             f"tokens/s scaled from {h.layers} to {s.num_layers} layers",
             f"  fused MoE {h.problem.key} through SGLang's invoke_fused_moe_kernel; default = SGLang's built-in "
             f"configs, tuned = {h.tuned_dir} ({h.file_name})",
             "  the MoE alone is also timed with SGLang's default heuristic (no file): default, shipped and "
             "tuned per batch",
             "  not in the step: attention cores, norms, embedding/lm_head/sampling, all-reduce"]
    if h.on_cpu:
        lines.append("  " + INTERPRETER_NOTE)
    lines += ["  note: " + n for n in h.notes]
    return "\n".join(lines)


@dataclass(frozen=True)
class HarnessSettings:
    """One harness validation: the model's per-rank shapes at `tp` with `dtype` experts, on `device`
    (`on_cpu`: under Triton's CPU interpreter), default against `tuned_dir`, `repeats` ABBA rounds at
    each batch size; `layers` timed (None: default_layers), `inner_repeats` replays per timing
    (None: the family's default)."""
    tp: int
    device: object
    tuned_dir: Path
    batch_sizes: tuple[int, ...]
    repeats: int = 5
    layers: int | None = None
    dtype: str = "bf16"
    on_cpu: bool = False
    inner_repeats: int | None = None


def run_harness(hm: HarnessModel, settings: HarnessSettings, log=print) -> dict:
    """Build the harness, check the tuned folder has this model's file, measure. Returns
    {"description", "runs", "configs", "checks", "shapes"}."""
    from autotune.gpus.memory_plan import hold_to_cap

    s = settings
    if not s.on_cpu:
        hold_to_cap()
    shapes = layer_shapes(hm, s.tp, s.dtype)
    h = DecodeHarness(shapes, s.device, s.tuned_dir, layers=s.layers, on_cpu=s.on_cpu, inner_repeats=s.inner_repeats)
    h.require_tuned_file()
    log(header(h))
    res = h.measure(list(s.batch_sizes), repeats=s.repeats, log=log)
    res["description"] = h.describe()
    return res


def on_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"
