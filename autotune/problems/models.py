"""Model configs -> the fused-MoE problems to tune.

A problem is one fused-MoE call site as SGLang sees it: E local experts, N = the
per-rank intermediate size (w2.shape[2]), K = hidden size, top-k, a dtype, and the
batch sizes M to cover. SGLang names its config file by (E, N, dtype, block_shape)
only, so problems that differ just in K or top-k share one file: the first one claims
it and the others are reported as sharing it (see `expand`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.fileio.reading import load_json

# SGLang's tuning batch sizes (benchmark/kernels/fused_moe_triton/common_utils.py).
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)


class ModelError(ValueError):
    """Bad model input (unknown preset, config without MoE fields, bad TP/EP)."""


@dataclass(frozen=True)
class LinearAttention:
    """Gated DeltaNet sizes (HF config keys linear_num_key_heads, linear_num_value_heads,
    linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim)."""
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4


@dataclass(frozen=True)
class MoeModel:
    name: str
    hidden_size: int
    num_layers: int
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int = 0
    mtp_layers: int = 0
    family: str = ""
    # Full-attention shape (Qwen3.5 / Qwen3-Next: 1 full-attention layer in 4, gated queries)
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    full_attention_interval: int = 4
    linear: LinearAttention | None = None   # the linear-attention layers (None: every layer full attention)
    attn_output_gate: bool = False          # q_proj also emits an output gate (Qwen3.5, Qwen3-Next)


# Values from the HF configs (text_config) of the released checkpoints.
PRESETS: dict[str, MoeModel] = {
    m.name: m
    for m in (
        MoeModel("qwen3.5-397b-a17b", 4096, 60, 512, 10, 1024, 1024, 1, "qwen3.5", 32, 2, 256, 4,
                 LinearAttention(16, 64, 128, 128), True),
        MoeModel("qwen3.5-122b-a10b", 3072, 48, 256, 8, 1024, 1024, 1, "qwen3.5", 32, 2, 256, 4,
                 LinearAttention(16, 64, 128, 128), True),
        MoeModel("qwen3.5-35b-a3b", 2048, 40, 256, 8, 512, 512, 1, "qwen3.5", 16, 2, 256, 4,
                 LinearAttention(16, 32, 128, 128), True),
        MoeModel("qwen3-next-80b-a3b", 2048, 48, 512, 10, 512, 512, 1, "qwen3-next", 16, 2, 256, 4,
                 LinearAttention(16, 32, 128, 128), True),
    )
}
MODEL_FAMILIES = sorted({m.family for m in PRESETS.values()})     # --shapes: qwen3.5, qwen3-next

# dtype name on the command line -> (SGLang's dtype selector, block_shape)
DTYPES: dict[str, tuple[str | None, tuple[int, int] | None]] = {
    "bf16": (None, None),
    "fp8_w8a8_block": ("fp8_w8a8", (128, 128)),
    "fp8_w8a8": ("fp8_w8a8", None),
    "nvfp4": ("nvfp4", None),      # NVFP4 experts: the FlashInfer MoE runners, not SGLang's Triton kernel
}
TRITON_DTYPES = ("bf16", "fp8_w8a8_block", "fp8_w8a8")


@dataclass(frozen=True)
class Problem:
    """One fused-MoE shape to tune (both GEMMs, all batch sizes)."""

    E: int
    N: int
    K: int
    top_k: int
    dtype: str  # a key of DTYPES
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    ep: int = 1
    # (model, tp, ep, layer kind) that run this shape: provenance only.
    sources: tuple[tuple[str, int, int, str], ...] = field(default=(), compare=False)

    def __post_init__(self):
        # Problems also come from files (recordings, provenance): a wrong one is refused where it is made.
        for name in ("E", "N", "K", "top_k", "ep"):
            _positive_int(getattr(self, name), name)
        if self.dtype not in DTYPES:
            raise ModelError(f"problem dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not isinstance(self.batch_sizes, tuple) or not self.batch_sizes:
            raise ModelError(f"problem batch_sizes must be a non-empty list, got {self.batch_sizes!r}")
        for M in self.batch_sizes:
            _positive_int(M, "batch size")
        if self.top_k > self.E * self.ep:
            raise ModelError(f"problem top_k {self.top_k} is above its {self.E * self.ep} experts")

    @property
    def sglang_dtype(self) -> str | None:
        return DTYPES[self.dtype][0]

    @property
    def block_shape(self) -> tuple[int, int] | None:
        return DTYPES[self.dtype][1]

    @property
    def file_key(self) -> tuple:
        """What SGLang's file name distinguishes."""
        return (self.E, self.N, self.dtype)

    @property
    def key(self) -> str:
        """Stable identity of the kernel computation (used for studies and caches)."""
        ep = f",ep={self.ep}" if self.ep > 1 else ""
        return f"E={self.E},N={self.N},K={self.K},topk={self.top_k},{self.dtype}{ep}"

    def to_dict(self) -> dict:
        return {"E": self.E, "N": self.N, "K": self.K, "top_k": self.top_k, "dtype": self.dtype,
                "batch_sizes": list(self.batch_sizes), "ep": self.ep,
                "sources": [list(s) for s in self.sources]}

    @classmethod
    def from_dict(cls, d: dict) -> "Problem":
        try:
            return cls(E=d["E"], N=d["N"], K=d["K"], top_k=d["top_k"], dtype=d["dtype"],
                       batch_sizes=tuple(d.get("batch_sizes", DEFAULT_BATCH_SIZES)), ep=d.get("ep", 1),
                       sources=tuple(tuple(s) for s in d.get("sources", ())))
        except (KeyError, TypeError) as e:
            raise ModelError(f"not a problem record ({type(e).__name__}: {e})") from None


def _positive_int(v, what: str) -> None:
    if type(v) is not int or v <= 0:
        raise ModelError(f"problem {what} must be a positive integer, got {v!r}")


# --- HF config.json --------------------------------------------------------------------------

def read_hf_config(path: str | Path) -> dict:
    """An HF config.json (or the folder holding it) as a dict; one ModelError line otherwise."""
    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    try:
        raw = load_json(p)
    except FileNotFoundError:
        raise ModelError(f"model config not found: {p}") from None
    except OSError as e:
        raise ModelError(f"model config {p} cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"model config {p} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ModelError(f"model config {p} holds a {type(raw).__name__}, not a JSON object")
    return raw


def model_from_hf_config(path: str | Path) -> MoeModel:
    """Any HF config.json of a MoE model (text_config when present), validated (autotune.problems.hf_config)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    raw = read_hf_config(p)
    return model_from_hf(raw, p, default_name=p.parent.name)


def model_from_hf(raw: dict, where, default_name: str = "model") -> MoeModel:
    """The MoeModel of an HF config already read (`where` names it in errors): the one reading of a
    config's shapes, for `shapes`, `run`, `rank-model` and `validate` alike."""
    from autotune.problems.hf_config import ConfigError, parse

    try:
        c = parse(raw, where)
    except ConfigError as e:
        raise ModelError(str(e)) from None
    name = str(raw.get("_name_or_path") or default_name or "model").split("/")[-1].lower()
    heads = c.num_attention_heads or 0
    linear = (LinearAttention(c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                              c.linear_value_head_dim, c.linear_conv_kernel_dim or 4)
              if c.has_linear_attention else None)
    gate = c.attn_output_gate
    if gate is None:
        gate = str(c.model_type or "").startswith(("qwen3_5", "qwen3_next"))
    return MoeModel(name=name, num_layers=c.num_layers or 0, shared_expert_intermediate_size=c.shared or 0,
                    mtp_layers=c.mtp or 0, family="custom", num_attention_heads=heads,
                    num_key_value_heads=c.num_key_value_heads or heads,
                    head_dim=c.head_dim or (c.hidden_size // heads if heads else 0),
                    full_attention_interval=c.full_attention_interval or (4 if linear else 1),
                    linear=linear, attn_output_gate=bool(gate), num_experts=c.num_experts, top_k=c.top_k,
                    moe_intermediate_size=c.moe_intermediate_size, hidden_size=c.hidden_size)


def select_models(shapes: str | None = None, model: str | None = None,
                  model_config: str | None = None) -> list[MoeModel]:
    """The models one of a family preset, a preset or an HF config names (none: the qwen3.5 family)."""
    named = [flag for flag, v in (("--shapes", shapes), ("--model", model), ("--model-config", model_config))
             if v is not None]
    if len(named) > 1:           # one was ignored in silence: the config over the preset over the family
        raise ModelError(f"{' and '.join(named)} each name the models to tune: give one")
    if model_config is not None:
        return [model_from_hf_config(model_config)]
    if model is not None:
        m = PRESETS.get(model.lower())
        if m is None:
            raise ModelError(f"unknown model preset {model!r}; known: {', '.join(PRESETS)}")
        return [m]
    fam = ("qwen3.5" if shapes is None else shapes).lower()
    models = [m for m in PRESETS.values() if m.family == fam]
    if not models:
        raise ModelError(f"unknown shape family {fam!r}; known: {', '.join(MODEL_FAMILIES)}")
    return models


@dataclass
class Expansion:
    problems: list[Problem]
    # file key -> problems that would have written the same SGLang file with another K/top-k
    shared: dict[tuple, list[Problem]]


def expand(models: list[MoeModel], tps=(1, 2, 4, 8), eps=(1,), dtypes=("bf16",),
           batch_sizes=DEFAULT_BATCH_SIZES) -> Expansion:
    """All distinct problems, in model order; SGLang derives moe_tp = tp / ep, N = inter / moe_tp."""
    for d in dtypes:
        if d not in DTYPES:
            raise ModelError(f"unknown dtype {d!r}; known: {', '.join(DTYPES)}")
    by_key: dict[tuple, Problem] = {}
    shared: dict[tuple, list[Problem]] = {}
    for m in models:
        for tp in tps:
            for ep in eps:
                kinds = ("main", "mtp") if m.mtp_layers else ("main",)
                for dtype in dtypes:
                    p = rank_problem(m, tp, ep, dtype, batch_sizes)
                    srcs = tuple((m.name, tp, ep, k) for k in kinds)
                    owner = by_key.get(p.file_key)
                    if owner is None:
                        by_key[p.file_key] = replace(p, sources=srcs)
                    elif (owner.K, owner.top_k, owner.ep) == (p.K, p.top_k, p.ep):
                        by_key[p.file_key] = replace(owner, sources=owner.sources + srcs)
                    else:
                        shared.setdefault(p.file_key, []).append(replace(p, sources=srcs))
    return Expansion(list(by_key.values()), shared)


def rank_problem(m: MoeModel, tp: int, ep: int = 1, dtype: str = "bf16",
                 batch_sizes=DEFAULT_BATCH_SIZES) -> Problem:
    """The fused MoE one rank of `m` runs at --tp tp --ep ep: SGLang's moe_tp = tp / ep, E = experts / ep,
    N = moe_intermediate_size / moe_tp (w2.shape[2]), K = hidden size. The one derivation of a rank's
    problem: `shapes` and `run` (through `expand`), `rank-model` and `validate` all take it from here."""
    if tp <= 0 or ep <= 0 or tp % ep:
        raise ModelError(f"--ep {ep} must divide --tp {tp}")
    if m.num_experts % ep:
        raise ModelError(f"--ep {ep} does not divide {m.name}'s {m.num_experts} experts")
    moe_tp = tp // ep
    if m.moe_intermediate_size % moe_tp:
        raise ModelError(f"--tp {tp} (moe tp {moe_tp}) does not divide {m.name}'s "
                         f"moe_intermediate_size {m.moe_intermediate_size}")
    return Problem(E=m.num_experts // ep, N=m.moe_intermediate_size // moe_tp, K=m.hidden_size, top_k=m.top_k,
                   dtype=dtype, batch_sizes=tuple(batch_sizes), ep=ep)


# The most tokens one fused-MoE call sees: a forward pass's tokens, bounded by SGLang's chunked
# prefill (16384 by default; a larger setting is rare). Beyond it a run only allocates.
MAX_BATCH = (131072, "more tokens than one SGLang forward pass holds")


def parse_int_list(text, what: str, limit: tuple[int, str] | None = None) -> tuple[int, ...]:
    if isinstance(text, tuple):           # already parsed by the command line's type (autotune.cli.inputs)
        return text
    items = str(text).replace(" ", "").split(",")
    if "" in items and items != [""]:
        raise ModelError(f"{what} has an empty entry in {text!r:.60}: write it as 1,8,64")
    # plain digits only: int() also takes '8_0' (80), '+8' and other scripts' digits
    if not all(re.fullmatch(r"[0-9]+", v) for v in items if v):
        raise ModelError(f"{what} must be a comma-separated list of integers, got {text!r:.60}")
    vals = tuple(int(v) for v in items if v)
    if not vals or any(v <= 0 for v in vals):
        raise ModelError(f"{what} must hold positive integers, got {text!r}")
    if len(set(vals)) != len(vals):
        raise ModelError(f"{what} lists a value twice: {text!r}")
    if limit is not None and max(vals) > limit[0]:
        raise ModelError(f"{what}: {max(vals)} is above {limit[0]} ({limit[1]})")
    return vals


# --- dense GEMMs (the backend-choice families: fp8_gemm, fp4_gemm) ---------------------------------

GEMM_DTYPES = ("fp8_w8a8_block", "nvfp4")


@dataclass(frozen=True)
class GemmProblem:
    """One dense linear layer per TP rank: out[M, N] = x[M, K] @ W[N, K]^T."""

    name: str
    N: int
    K: int
    dtype: str
    layers: int = 1            # how many times one forward pass runs it (weights for the model mix)
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    sources: tuple[tuple[str, int, int, str], ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return f"{self.name},N={self.N},K={self.K},{self.dtype}"

    def to_dict(self) -> dict:
        return {"kind": "gemm", "name": self.name, "N": self.N, "K": self.K, "dtype": self.dtype,
                "layers": self.layers, "batch_sizes": list(self.batch_sizes),
                "sources": [list(s) for s in self.sources]}

    def __post_init__(self):
        for name in ("N", "K", "layers"):
            _positive_int(getattr(self, name), name)
        if not isinstance(self.name, str) or self.dtype not in DTYPES or not self.batch_sizes:
            raise ModelError(f"not a GEMM problem: name {self.name!r}, dtype {self.dtype!r}, batch sizes "
                             f"{self.batch_sizes!r}")
        for M in self.batch_sizes:
            _positive_int(M, "batch size")

    @classmethod
    def from_dict(cls, d: dict) -> "GemmProblem":
        try:
            return cls(d["name"], d["N"], d["K"], d["dtype"], d.get("layers", 1),
                       tuple(d.get("batch_sizes", DEFAULT_BATCH_SIZES)), tuple(tuple(s) for s in d.get("sources", ())))
        except (KeyError, TypeError) as e:
            raise ModelError(f"not a GEMM problem record ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class LayerGemm:
    name: str
    N: int            # output features per TP rank
    K: int            # input features per TP rank
    kind: str         # "full" / "linear" (token mixer of that layer kind) or "moe" (every layer)


def layer_gemms(m: MoeModel, tp: int) -> list[LayerGemm]:
    """Every dense GEMM of one layer per TP rank, as SGLang splits them: column-parallel layers
    split N, row-parallel layers split K, KV heads are replicated when TP exceeds them.
    Full attention: QKV (queries also carry an output gate where the model has one) and output
    projections. Linear attention (Gated DeltaNet): in_proj_qkvz, in_proj_ba, out_proj. MoE block:
    router and shared-expert gate (replicated), shared expert gate_up and down."""
    def need(total: int, what: str) -> int:
        if total % tp:
            raise ModelError(f"--tp {tp} does not divide {m.name}'s {what} ({total})")
        return total // tp
    out = []
    if m.num_attention_heads and m.head_dim:
        q = need(m.num_attention_heads, "attention heads")
        kv = max(1, (m.num_key_value_heads or m.num_attention_heads) // tp)
        gate = 2 if m.attn_output_gate else 1
        out += [LayerGemm("attn_qkv", (gate * q + 2 * kv) * m.head_dim, m.hidden_size, "full"),
                LayerGemm("attn_o", m.hidden_size, q * m.head_dim, "full")]
    if m.linear is not None:
        la = m.linear
        key_dim, value_dim = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
        need(la.num_key_heads, "linear-attention key heads")
        nv = need(la.num_value_heads, "linear-attention value heads")
        out += [LayerGemm("linear_in_proj_qkvz", (2 * key_dim + 2 * value_dim) // tp, m.hidden_size, "linear"),
                LayerGemm("linear_in_proj_ba", 2 * nv, m.hidden_size, "linear"),
                LayerGemm("linear_out_proj", m.hidden_size, value_dim // tp, "linear")]
    out.append(LayerGemm("router", m.num_experts, m.hidden_size, "moe"))
    if m.shared_expert_intermediate_size:
        s = need(m.shared_expert_intermediate_size, "shared expert size")
        out += [LayerGemm("shared_gate_up", 2 * s, m.hidden_size, "moe"),
                LayerGemm("shared_down", m.hidden_size, s, "moe"),
                LayerGemm("shared_gate", 1, m.hidden_size, "moe")]
    return out


def layer_counts(m: MoeModel) -> dict[str, int]:
    """How many layers of each kind: 1 full-attention layer in `full_attention_interval`."""
    if m.linear is None or m.full_attention_interval <= 1:
        return {"full": m.num_layers, "linear": 0, "moe": m.num_layers}
    full = m.num_layers // m.full_attention_interval
    return {"full": full, "linear": m.num_layers - full, "moe": m.num_layers}


# Stay BF16 in quantized checkpoints (tiny, or numerically sensitive): not GEMM-backend problems.
_UNQUANTIZED = ("router", "shared_gate", "linear_in_proj_ba")


def dense_gemms(m: MoeModel, tp: int, dtype: str, batch_sizes=DEFAULT_BATCH_SIZES) -> list[GemmProblem]:
    """The quantizable dense GEMMs of the model per TP rank, each with how many layers run it."""
    if dtype not in GEMM_DTYPES:
        raise ModelError(f"unknown GEMM dtype {dtype!r}; known: {', '.join(GEMM_DTYPES)}")
    counts = layer_counts(m)
    by_shape: dict = {}   # one problem per shape: GEMMs of equal shape are the same measurement
    for g in layer_gemms(m, tp):
        if g.name in _UNQUANTIZED or not counts[g.kind]:
            continue
        name, layers = by_shape.get((g.N, g.K), ("", 0))
        by_shape[g.N, g.K] = (f"{name}+{g.name}" if name else g.name, layers + counts[g.kind])
    return [GemmProblem(name, N, K, dtype, layers, tuple(batch_sizes), ((m.name, tp, 1, "main"),))
            for (N, K), (name, layers) in by_shape.items()]


def problem_from_dict(d: dict):
    if not isinstance(d, dict):
        raise ModelError(f"not a problem record: {d!r:.80}")
    return GemmProblem.from_dict(d) if d.get("kind") == "gemm" else Problem.from_dict(d)
