"""The kernel families a run tunes, each declared once: everything the pipeline needs to know about a
family that is not in its own package.

A family is a package of autotune/families/protocol/ (its kernel protocol: space, check, inputs, launch,
reference; a backend family's runners, one module per backend) and one entry here:
- `kernel`: "module:Class" of the family's protocol object (autotune.families.protocol.KernelFamily);
- `step`: what the run does with it: CONFIGS, a search of configs per (GEMM, M) written as SGLang's
  config files (autotune.search.study, autotune.families.triton_moe.pairs, autotune.export.sglang); BACKENDS, every backend
  measured and one chosen per server, written as server_args.yaml (autotune.search.sieve,
  autotune.export.server_args);
- `problems`: which call sites of the model it tunes: MOE, the fused-MoE layers (models.expand),
  DENSE, the dense GEMMs (models.dense_gemms);
- `dtype`: the one dtype it tunes, or None for the dtypes --dtype names (default: every dtype of
  SGLang's Triton fused MoE, models.TRITON_DTYPES);
- `flag`, `sglang_choices`: the SGLang server flag its choice is written to and the name of SGLang's
  list of that flag's values (sglang.srt.arg_groups.choices), for BACKENDS families;
- `runners`: the package whose modules declare its backends (autotune.families.runner.discover);
- `options`: the run settings its protocol object is built with (RUN_OPTIONS).
Everything else derives from here: the --kernels names and order, the capability table's flags and
runner packages, plan's problems per family, the options each family is built with, the step that
runs it. `plugged` adds one for a while (tests plug a toy family in this way).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

CONFIGS = "configs"          # a config search per (GEMM, M): SGLang's Triton config files
BACKENDS = "backends"        # every backend measured, one per server: server_args.yaml
MOE = "moe"                  # the fused-MoE layers of the chosen models
DENSE = "dense"              # their dense GEMMs (attention projections, shared experts...)

# What a run hands each family's constructor, by the names a family's `options` lists:
#   space_path       the --search-space file (None: the family's own)
#   sglang_versions  the SGLang releases the files must run in (--sglang-version)
#   triton_config_dir  the tuned folder of this run, whose Triton MoE configs a layer runs with
#   skip             the backends --skip-backends leaves out of this family
RUN_OPTIONS = ("space_path", "sglang_versions", "triton_config_dir", "skip")


@dataclass(frozen=True)
class Family:
    name: str
    kernel: str
    step: str
    problems: str
    dtype: str | None = None
    flag: str | None = None
    sglang_choices: str | None = None
    runners: str | None = None
    options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.step in (CONFIGS, BACKENDS) and self.problems in (MOE, DENSE), self
        assert set(self.options) <= set(RUN_OPTIONS), self
        assert (self.step == BACKENDS) == (self.flag is not None), f"{self.name}: a backend choice needs its flag"
        assert self.problems == MOE or self.dtype, f"{self.name}: dense GEMMs are tuned at one dtype"


_MOE_RUNNERS = "autotune.families.moe_backends"
REGISTRY: dict[str, Family] = {f.name: f for f in (
    Family("triton_moe", "autotune.families.triton_moe:TritonMoe", CONFIGS, MOE,
           options=("space_path", "sglang_versions")),
    Family("moe_bf16", f"{_MOE_RUNNERS}:MoeBf16", BACKENDS, MOE, "bf16", "moe-runner-backend",
           "MOE_RUNNER_BACKEND_CHOICES", _MOE_RUNNERS, ("triton_config_dir", "skip")),
    Family("moe_fp8", f"{_MOE_RUNNERS}:MoeFp8", BACKENDS, MOE, "fp8_w8a8_block", "moe-runner-backend",
           "MOE_RUNNER_BACKEND_CHOICES", _MOE_RUNNERS, ("triton_config_dir", "skip")),
    Family("moe_fp4", f"{_MOE_RUNNERS}:MoeFp4", BACKENDS, MOE, "nvfp4", "moe-runner-backend",
           "MOE_RUNNER_BACKEND_CHOICES", _MOE_RUNNERS, ("triton_config_dir", "skip")),
    Family("fp8_gemm", "autotune.families.fp8_gemm:Fp8Gemm", BACKENDS, DENSE, "fp8_w8a8_block", "fp8-gemm-backend",
           "FP8_GEMM_RUNNER_BACKEND_CHOICES", "autotune.families.fp8_gemm", ("skip",)),
    Family("fp4_gemm", "autotune.families.fp4_gemm:Fp4Gemm", BACKENDS, DENSE, "nvfp4", "fp4-gemm-backend",
           "FP4_GEMM_RUNNER_BACKEND_CHOICES", "autotune.families.fp4_gemm", ("skip",)),
)}


def names(step: str | None = None) -> tuple[str, ...]:
    """Every family (of one step), in the order a run takes them."""
    return tuple(n for n, f in REGISTRY.items() if step is None or f.step == step)


def get(name: str) -> Family:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown kernel family {name!r}; known: {', '.join(REGISTRY)}") from None


def with_flag(flag: str) -> tuple[str, ...]:
    """The families whose choice goes to SGLang's `flag` (moe-runner-backend: one per expert dtype)."""
    return tuple(n for n, f in REGISTRY.items() if f.flag == flag)


@contextlib.contextmanager
def plugged(*families: Family):
    """These families in the registry for the duration (after the built-in ones)."""
    taken = [f.name for f in families if f.name in REGISTRY]
    if taken:
        raise ValueError(f"families {taken} are registered already")
    REGISTRY.update({f.name: f for f in families})
    try:
        yield
    finally:
        for f in families:
            REGISTRY.pop(f.name, None)
