"""Backend-choice families: the same kernel protocol, where a config names a backend.

A config names a backend and its tactic (`backend_config`). tactic -1 runs the backend as SGLang would (its own
default or FlashInfer's autotuned choice); tactics >= 0 are searched where the backend exposes
them. Each backend is a runner object declared in one module of the family's package
(autotune.contract.runner): it owns where it may run and how it launches; the capability table
(autotune.contract.capabilities) applies those rules. SGLang's `auto` choice is the seed and the baseline.
Each concrete family supplies its problems' inputs, the float32 reference and the tolerance.
"""
from __future__ import annotations

from autotune.contract import capabilities as table
from autotune.contract.config import KernelConfig
from autotune.contract.registry import BACKENDS
from autotune.gpus.device import DeviceInfo
from autotune.contract.spaces import Space

LAYER = "layer"   # these families have one "GEMM" per problem: the whole call


def backend_config(backend: str, tactic=-1) -> KernelConfig:
    """The config that runs `backend` with `tactic` (-1: as SGLang would)."""
    return KernelConfig.from_entry({"backend": backend, "tactic": tactic})


class BackendFamily:
    name = ""
    step = BACKENDS       # its declaration (autotune.contract.registry): the rest is each family's
    gemms = (LAYER,)

    def __init__(self, skip: tuple = ()):
        # Backends the user left out (--skip-backends), e.g. one whose JIT build this machine
        # cannot afford: recorded as skipped with that reason, like an unsupported one.
        self.skip = tuple(skip)

    # -- what may run ------------------------------------------------------------------------------
    def runner(self, backend: str):
        return table.get(self.name, backend)

    def availability(self, device: DeviceInfo) -> list:
        plan = table.plan(self.name, device, check_imports=device.kind == "gpu")
        for a in plan:
            if a.ok and a.backend.name in self.skip:
                a.ok, a.reason = False, "left out by --skip-backends"
        return plan

    def unsupported_reason(self, problem, device: DeviceInfo) -> str | None:
        if device.kind == "cpu-interpreter":
            return f"{self.name} backends need a GPU"
        plan = self.availability(device)
        if any(a.ok for a in plan):
            return None
        return "no backend runs here: " + "; ".join(f"{a.backend.name}: {a.reason}" for a in plan)

    def space(self, problem, gemm: str, device: DeviceInfo) -> Space:
        names = tuple(a.backend.name for a in self.availability(device) if a.ok)
        return Space(self.name, {"backend": names, "tactic": (-1,)})

    def check(self, config: KernelConfig, problem, gemm: str, device: DeviceInfo) -> str | None:
        try:
            b = table.get(self.name, config["backend"])
        except KeyError as e:
            return str(e).strip("'\"")
        a = next(a for a in self.availability(device) if a.backend.name == b.name)
        if not a.ok:
            return a.reason
        if config.get("tactic", -1) != -1 and not b.tunable:
            return f"{b.name} has no tactics to choose"
        return None

    def sglang_auto(self, device: DeviceInfo) -> str | None:
        """The backend SGLang's server picks for `auto` on this GPU."""
        return table.sglang_auto(self.name, device)

    def sglang_value(self, backend: str) -> str | None:
        """The server-argument value selecting `backend` (None: SGLang cannot select it)."""
        return table.get(self.name, backend).sglang_value

    def baselines(self, problem, M: int, device: DeviceInfo) -> dict:
        auto = self.sglang_auto(device)
        return {"auto": {LAYER: backend_config(auto)}} if auto else {}

    def tolerance(self, problem, on_cpu: bool = False) -> float:
        raise NotImplementedError

    def compile(self, config: KernelConfig, inputs) -> None:
        """FlashInfer and SGLang JIT modules are built by `warmup` in the first worker."""

    def warmup(self, problems: list, on_cpu: bool = False) -> None:
        """Run every backend expected to work here once on the first problem's smallest M, so their
        JIT builds (nvcc, minutes for CUTLASS MoE) happen once, before other workers start. One its
        declarations expect to fail (a crash on SM120, say) is launched only in its own trial: a
        process death here would take the run's first worker, not one trial."""
        if on_cpu or not problems:
            return
        import torch

        from autotune.adapters.local_gpu import detect

        device = detect()
        p = problems[0]
        inputs = self.make_inputs(p, LAYER, min(p.batch_sizes), routings=1)
        for name in self.warmup_backends(device):
            try:
                self.run(backend_config(name), inputs, 0)
                torch.cuda.synchronize()
            except Exception:
                # A backend that fails here fails again, recorded, in its trial.
                torch.cuda.synchronize()

    def warmup_backends(self, device) -> list[str]:
        """The backends `warmup` launches: those that launch here, that nothing expects to fail, and
        that a module declares (an undeclared value SGLang lists is unknown: its own trial only)."""
        return [a.backend.name for a in self.availability(device)
                if a.ok and not a.expected and a.backend.declared]

    def tactics(self, config: KernelConfig, inputs) -> list:
        """The tactics the config's backend offers for these inputs (JSON form; -1 first)."""
        b = self.runner(config["backend"])
        return b.tactics(inputs) if b.tunable else [-1]

    # -- launch -----------------------------------------------------------------------------------
    def run(self, config: KernelConfig, inputs, routing: int):
        return self.runner(config["backend"]).run(inputs, routing, config.get("tactic", -1))


def rotate(n: int, make):
    """`n` independent copies (different weights / activations) so a graph of several calls
    does not find the previous call's operands in L2."""
    return [make(i) for i in range(n)]
