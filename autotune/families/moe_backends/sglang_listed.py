"""Every --moe-runner-backend value the installed SGLang lists that no module here declares for
NVFP4 experts, launched through SGLang's MoE block all the same: the sieve asks SGLang's code
what it serves rather than a list of ours. A value SGLang cannot serve for NVFP4 experts is
refused in its own words (its quant method's checks: "moe_runner_backend=cutlass is not
supported for NVFP4 MoE", "Current platform does not support NVFP4 ..."); one that builds is run
and checked against the reference like any other; a value a new release adds is launched the
day it is installed. Nothing is declared of them (no SMs, no known failures), so they are
launched in their own trials only, never in the warm-up (Runner.declared).

NVFP4 experts only, the family the mission is about: for bf16 and block-FP8 experts the same
sweep would also launch runners whose H200 behaviour is not yet seen in a device call, and
would change what the README's replayed main job prints (moe_bf16 is part of it)."""
from __future__ import annotations

import functools

from autotune.families.moe_backends import SglangMoe

FAMILY = "moe_fp4"
NOT_A_RUNNER = frozenset({"auto"})      # SGLang's own resolution: measured as the `auto` column


def declared_values(family: str = FAMILY) -> set[str]:
    """The flag values the other modules of this package declare for `family`."""
    from autotune.contract.runner import discover

    others = discover(__package__, skip=(__name__.rsplit(".", 1)[1],))
    return {r.sglang_value for r in others if r.family == family and r.sglang_value}


def listed_runners(family: str = FAMILY) -> tuple:
    """A runner per value SGLang lists for the flag and no module declares (none without SGLang)."""
    try:
        from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES
    except ImportError:
        return ()
    declared = declared_values(family)
    return tuple(SglangMoe(family, v, v, f"SGLang's FusedMoE, {v} runner (listed by SGLang, declared by no module)",
                           declared=False)
                 for v in MOE_RUNNER_BACKEND_CHOICES if v not in NOT_A_RUNNER and v not in declared)


def __getattr__(name: str):
    """RUNNERS, made on first access (SGLang's list asked then: runner.discover leaves it out where it
    is told not to ask, as a command reading a tuned folder is)."""
    if name == "RUNNERS":
        return _listed()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _listed() -> tuple:
    return listed_runners()
