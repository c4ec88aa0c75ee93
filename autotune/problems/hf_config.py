"""An HF config.json of a MoE model, parsed once into a validated structure (pydantic).

Types are strict: a count is an integer, never a bool (`num_experts: true` is not 1) nor a
string (`"sixty"`); sizes and layer counts are positive; relations hold (top_k <= experts, KV
heads <= attention heads, a gated-attention head_dim from the hidden size only when it divides).
Multimodal configs nest the language model under `text_config`, which must then be an object.
Every error is one line naming the file, the key as the file spells it, and its value.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# field -> the names HF configs of different models use for it (the first present wins)
ALIASES = {
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "top_k": ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k", "moe_k"),
    "moe_intermediate_size": ("moe_intermediate_size", "expert_intermediate_size", "moe_ffn_hidden_size"),
    "hidden_size": ("hidden_size", "d_model", "n_embd", "dim"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "shared": ("shared_expert_intermediate_size", "shared_intermediate_size"),
    "mtp": ("mtp_num_hidden_layers", "num_nextn_predict_layers"),
}
MOE_FIELDS = ("num_experts", "top_k", "moe_intermediate_size", "hidden_size")
LINEAR_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")



# Upper bounds: released MoE models stay far below them (sizes under 2**15, a few hundred experts, under
# 200 layers); a value beyond is a typo or a corrupt file, and a kernel launched on it would ask more
# memory than any GPU has. Said where the config is read, not as an out-of-memory trial later.
MAX_SIZE = 1 << 20        # a hidden, intermediate or head size
MAX_COUNT = 1 << 16       # experts, heads, layers


def _positive(le=MAX_SIZE):
    return Field(default=None, gt=0, le=le)


def _count():
    return Field(default=None, ge=0, le=MAX_COUNT)


class TextConfig(BaseModel):
    """The fields autotune reads, by their own names (ALIASES resolved before validation)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    num_experts: int = Field(gt=0, le=MAX_COUNT)
    top_k: int = Field(gt=0, le=MAX_COUNT)
    moe_intermediate_size: int = Field(gt=0, le=MAX_SIZE)
    hidden_size: int = Field(gt=0, le=MAX_SIZE)
    num_layers: Optional[int] = _positive(MAX_COUNT)
    shared: Optional[int] = Field(default=None, ge=0, le=MAX_SIZE)
    mtp: Optional[int] = _count()
    num_attention_heads: Optional[int] = _count()
    num_key_value_heads: Optional[int] = _count()
    head_dim: Optional[int] = _positive()
    full_attention_interval: Optional[int] = _positive()
    linear_num_key_heads: Optional[int] = _positive()
    linear_num_value_heads: Optional[int] = _positive()
    linear_key_head_dim: Optional[int] = _positive()
    linear_value_head_dim: Optional[int] = _positive()
    linear_conv_kernel_dim: Optional[int] = _positive()
    attn_output_gate: Optional[bool] = None
    model_type: Optional[str] = None

    @model_validator(mode="after")
    def _relations(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} is above the number of experts {self.num_experts}")
        heads, kv = self.num_attention_heads or 0, self.num_key_value_heads
        if kv is not None and heads and kv > heads:
            raise ValueError(f"num_key_value_heads {kv} is above num_attention_heads {heads}")
        if heads and self.head_dim is None and self.hidden_size % heads:
            raise ValueError(f"no head_dim, and num_attention_heads {heads} does not divide hidden_size "
                             f"{self.hidden_size}")
        return self

    @property
    def has_linear_attention(self) -> bool:
        return all(getattr(self, k) is not None for k in LINEAR_KEYS)


class ConfigError(ValueError):
    pass


def text_section(raw: dict, where) -> tuple[dict, dict]:
    """(the language model's section, key -> the name the file uses for it)."""
    cfg = raw
    if raw.get("text_config") is not None:
        cfg = raw["text_config"]
        if not isinstance(cfg, dict):
            raise ConfigError(f"{where}: text_config holds a {type(cfg).__name__}, not a JSON object")
    names = {}
    for field, alias in ALIASES.items():
        names[field] = next((a for a in alias if cfg.get(a) is not None), alias[0])
    # Mixtral-style configs name the expert FFN width plain `intermediate_size`.
    if cfg.get(names["moe_intermediate_size"]) is None and cfg.get("num_local_experts") is not None:
        names["moe_intermediate_size"] = "intermediate_size"
    return cfg, names


def parse(raw: dict, where: str | Path) -> TextConfig:
    """The validated fields of an HF config (ConfigError: one line)."""
    cfg, names = text_section(raw, where)
    values = {k: v for k, v in cfg.items() if k in TextConfig.model_fields}
    values.update({field: cfg.get(name) for field, name in names.items()})
    missing = [f for f in MOE_FIELDS if values.get(f) is None]
    if missing:
        raise ConfigError(f"{where} has no MoE fields ({', '.join(missing)} missing): not a MoE model config")
    values = {k: v for k, v in values.items() if v is not None}
    try:
        return TextConfig(**values)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        key = names.get(field, field)
        msg = err["msg"].removeprefix("Value error, ")
        if key:
            raise ConfigError(f"{where}: {key} = {err['input']!r}: {msg}") from None
        raise ConfigError(f"{where}: {msg}") from None
