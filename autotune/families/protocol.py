"""Kernel families: each one small protocol, so the search never knows a backend's rules.

A family says whether it runs on a device, what may be tried (space + check), what SGLang
would run without tuning (baselines), and how to build inputs, launch one config and
compute a reference. The runner (autotune.measure.pool) only loops, checks and times.
"""
from __future__ import annotations

import importlib
from typing import Any, Protocol

from autotune.gpus.device import DeviceInfo
from autotune.families.spaces import Space


class KernelFamily(Protocol):
    name: str
    gemms: tuple[str, ...]

    def unsupported_reason(self, problem, device: DeviceInfo) -> str | None:
        """None when this family can run `problem` on `device`, else why not."""

    def space(self, problem, gemm: str, device: DeviceInfo) -> Space: ...

    def check(self, config: dict, problem, gemm: str, device: DeviceInfo) -> str | None:
        """Why `config` must not be launched (before any compile), or None."""

    def unwritable(self, config: dict, gemm: str, device: DeviceInfo) -> str | None:
        """Why a measured `config` must not be written for the run's target SGLang releases, or None."""

    def baselines(self, problem, M: int, device: DeviceInfo) -> dict[str, dict[str, dict]]:
        """What SGLang runs untuned: {"default": {gemm: config}, "shipped": {...}}."""

    def make_inputs(self, problem, gemm: str, M: int, *, seed: int, skew: float, routings: int) -> Any: ...

    def prepare(self, config: dict, inputs: Any) -> None:
        """Optional: GPU work `config` needs before `compile` (runs under the GPU lock)."""

    def compile(self, config: dict, inputs: Any) -> None:
        """Compile what `run` would launch, without launching (runs outside the GPU lock)."""

    # Optional: `compiles_apart = True` declares that the family's kernels compile without the GPU, for its
    # architecture (Triton does; FlashInfer's JIT modules and cuDNN's plans need the device): builder processes
    # then compile each task before the GPU's measuring process takes it (autotune.measure.builders), through
    #   compiling_for(sm) -> a context in which a process without a GPU compiles for an sm_XY one
    #   compile_apart(config, problem, gemm, M): compile what `run` would launch at batch size M there

    def run(self, config: dict, inputs: Any, routing: int) -> Any:
        """Launch once on routing set `routing`; returns the output tensor."""

    def reference(self, inputs: Any, config: dict | None = None) -> Any:
        """Float32 reference of routing set 0's output (config: for families whose backends
        quantize differently)."""

    def tolerance(self, problem, on_cpu: bool = False) -> float: ...

    def warmup(self, problems: list, on_cpu: bool = False) -> None:
        """Build once what every worker would otherwise build at the same time (JIT kernels)."""

    def footprint(self, problem, device: DeviceInfo, routings: int = 10):
        """One worker's GPU memory for `problem` (an autotune.gpus.memory_plan.Footprint), predicted from its
        shapes and dtypes: what the run's memory plan sizes the pool by."""

    def main_footprint(self, problem, device: DeviceInfo):
        """Optional: the GPU memory of the work the run's own process does for `problem` (the Triton MoE
        family's layer check), counted in the plan beside the workers'."""

    # A config search's family (registry.CONFIGS) also carries the rules of its files, which the search,
    # the measuring and the store never name (autotune.families.triton_moe.files.SglangMoeFiles has them):
    #   coupled          the parameter every GEMM of one problem must share (None: none); the search pins it
    #                    to the other GEMM's best now and then (autotune.search.policy)
    #   config_order     its config keys in the order its files write them; config_switches: the keys
    #                    written only when on (autotune.families.registry.key_order)
    #   select(tuner, top, careful_repeats) -> {M: Choice}: per M, its finalists re-measured, the winner
    #   export_targets(folder, problems): every file export would write into the tuned folder
    #                    (autotune.folder.tuned.TunedFolder), checked before anything is measured
    #   export(folder, problem, choices, run_info) -> {"files", "kept", "missing"}: its files written
    #   after_export(folder, attempt): what goes beside the files once they are in (SKU copies, SGLang's
    #                    shipped overlay), each step run by `attempt` so its failure loses nothing measured

    # Optional: `clock`, a callable returning seconds, that Triton's CPU interpreter timings read in
    # place of the wall clock (which says nothing about speed there): a family whose launches declare
    # their cost (the tests' fakes) is timed by the declaration, not by a loaded machine's scheduler.


def get_family(spec: str, **options) -> KernelFamily:
    """A family by its name (autotune.families.registry), or by "module:Class" where no package declares it
    (the tests' faulty families, built the same way in a worker)."""
    return family_class(spec)(**options)


def family_class(spec: str) -> type:
    """The class of the family `spec` names (its declaration: `compiles_apart`, ...), as get_family finds it."""
    from autotune.families import registry

    if ":" in spec:
        mod, cls = spec.split(":", 1)
        return getattr(importlib.import_module(mod), cls)
    return registry.get(spec).cls
