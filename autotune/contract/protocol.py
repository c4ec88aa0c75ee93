"""What a kernel family answers the core, as types: the search never knows a kernel's rules, the measuring only
loops, checks and times, the pipeline's steps only loop over a family's hooks.

`KernelFamily`: every family. It says whether it runs on a device, what may be tried (space, check), what SGLang
runs without tuning (baselines), and how to build inputs, launch one config and compute a reference.
`ConfigFamily`: a family whose product is config files (registry.CONFIGS): its files' rules, its selection, the
check of its picks as the server runs them, and its files. `BackendChoiceFamily`: a family whose product is one
backend per server flag (registry.BACKENDS; autotune.contract.backend_family.BackendFamily has it all).

Families are plugins and never subclass these: they are checked by shape, as typing.Protocol checks. A hook
marked optional may be left out; the core asks for it with getattr and says what it does without it. Types of
the tiers above this package (the tuner, a Choice, the tuned folder) are named in the docstrings, not imported:
the contract sits below them.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from autotune.gpus.device import DeviceInfo
from autotune.contract.config import KernelConfig
from autotune.contract.spaces import Space


class KernelFamily(Protocol):
    name: str                     # what --kernels calls it (its declaration: autotune.contract.registry)
    step: str                     # registry.CONFIGS or registry.BACKENDS
    problems: str                 # registry.MOE or registry.DENSE
    gemms: tuple[str, ...]        # the GEMMs of one problem, each searched and measured apart

    def unsupported_reason(self, problem, device: DeviceInfo) -> str | None:
        """None when this family can run `problem` on `device`, else why not."""

    def space(self, problem, gemm: str, device: DeviceInfo) -> Space:
        """What may be tried for `gemm` of `problem` on `device`."""

    def check(self, config: KernelConfig, problem, gemm: str, device: DeviceInfo) -> str | None:
        """Why `config` must not be launched (before any compile), or None."""

    def baselines(self, problem, M: int, device: DeviceInfo) -> dict[str, dict[str, KernelConfig]]:
        """What SGLang runs untuned: {"default": {gemm: config}, "shipped": {...}}."""

    def make_inputs(self, problem, gemm: str, M: int, *, seed: int, skew: float, routings: int) -> Any:
        """The inputs of one GEMM at batch size M, `routings` routing sets, made on the device."""

    def prepare(self, config: KernelConfig, inputs: Any) -> None:
        """Optional: GPU work `config` needs before `compile` (runs under the GPU lock)."""

    def compile(self, config: KernelConfig, inputs: Any) -> Any:
        """Compile what `run` would launch, without launching (runs outside the GPU lock)."""

    def run(self, config: KernelConfig, inputs: Any, routing: int) -> Any:
        """Launch once on routing set `routing`; returns the output tensor."""

    def reference(self, inputs: Any, config: KernelConfig | None = None) -> Any:
        """Float32 reference of routing set 0's output (config: for families whose backends quantize
        differently)."""

    def tolerance(self, problem, on_cpu: bool = False) -> float:
        """The relative error against the reference a correct output stays under."""

    def warmup(self, problems: list, on_cpu: bool = False) -> None:
        """Build once what every worker would otherwise build at the same time (JIT kernels)."""

    def footprint(self, problem, device: DeviceInfo, routings: int = 10):
        """Optional: one worker's GPU memory for `problem` (an autotune.gpus.memory_plan.Footprint), predicted from
        its shapes and dtypes: what the run's memory plan sizes the pool by (without it: an assumed 4 GiB)."""

    def main_footprint(self, problem, device: DeviceInfo):
        """Optional: the GPU memory of the work the run's own process does for `problem` (a check of the picks
        as the server runs them), counted in the plan beside the workers'."""

    def task_bytes(self, problem, gemm: str, M: int, routings: int = 10) -> int:
        """Optional: what measuring one batch size of one GEMM allocates beside the weights (the measuring
        process makes room for it before the inputs are built)."""

    # Optional: `compiles_apart = True` declares that the family's kernels compile without the GPU, for its
    # architecture (Triton does; FlashInfer's JIT modules and cuDNN's plans need the device): builder processes
    # then compile each task before the GPU's measuring process takes it (autotune.measure.builders), through
    # `compiling_for` and `compile_apart`.
    def compiling_for(self, sm: int):
        """Optional (compiles_apart): a context in which a process without a GPU compiles for an sm_XY one."""

    def compile_apart(self, config: KernelConfig, problem, gemm: str, M: int) -> Any:
        """Optional (compiles_apart): compile what `run` would launch at batch size M, from stand-in inputs."""

    def after_search_cost(self, problem, device: DeviceInfo, per_s: float, workers: int) -> float:
        """Optional: seconds the family needs for a problem after its search, at `per_s` seconds a measurement
        over `workers` measuring processes (its finalists, the check of its picks): what a --budget keeps."""

    # Optional: `clock`, a callable returning seconds, that Triton's CPU interpreter timings read in
    # place of the wall clock (which says nothing about speed there): a family whose launches declare
    # their cost (the tests' fakes) is timed by the declaration, not by a loaded machine's scheduler.


class Attempt(Protocol):
    """How a hook runs a step after the search whose failure must not lose what was measured (autotune.run.sinks
    after_search): `attempt(what, fn, *args, let_through=(), writes=None, **kwargs)` returns fn's result, or None
    where it failed (said in one line; the run then exits 4); `writes`: the tuned folder the step writes into,
    whose change a failure throws away whole."""

    def __call__(self, what: str, fn: Callable, *args, let_through=(), writes=None, **kwargs) -> Any: ...


@dataclass
class Checked:
    """What a config family's `confirm` found, checking its picks as the server runs them: per M, what its export
    records beside the files, and the columns the run's table shows beside the selection's times; `step`: what
    the run's time line calls the check."""
    step: str = "confirm"
    records: dict[int, dict] = field(default_factory=dict)
    columns: dict[int, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class ProblemRun:
    """What the run did for one problem, which a config family's export records beside its files."""
    command: str                   # the command line, as typed
    trials_per_study: int
    evaluations: int               # configs measured, in the storage
    measured_this_run: int         # device measurements this process made
    complete: bool                 # every study has its trials
    device_seconds: float
    wall_seconds: float
    storage: str                   # where the studies are (credentials masked)
    warm_start: str | None         # --warm-start's source
    warm_start_configs: int        # its configs queued by this run
    trials: dict[int, tuple[int, int]] = field(default_factory=dict)    # M -> (trials, failed trials)
    checked: Checked = field(default_factory=Checked)

    def record(self, per_m: dict[int, dict] | None = None) -> dict:
        """The run as its files' record keeps it: every field, and per M its trials, failed trials and
        `per_m[M]` (what the family adds, its check of the picks)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("trials", "checked")}
        out["per_M"] = {M: {"trials": n, "failed": failed, **(per_m or {}).get(M, {})}
                        for M, (n, failed) in self.trials.items()}
        return out


class ConfigFamily(KernelFamily, Protocol):
    """A family whose product is config files (registry.CONFIGS): the hooks the search, the records, the config
    search step and `check` call, so that none of them names a key of its files
    (autotune.families.triton_moe.files.SglangMoeFiles has them for SGLang's fused-MoE files)."""
    coupled: str | None                 # the parameter every GEMM of one problem must share; the search pins it
                                        # to the other GEMM's best now and then (autotune.search.policy)
    config_order: tuple[str, ...]       # its config keys in the order its files write them
    config_switches: tuple[str, ...]    # the keys written only when on (autotune.contract.registry.key_order)
    sglang_versions: tuple[str, ...]    # the SGLang releases its files must run in

    def unwritable(self, config: KernelConfig, gemm: str, device: DeviceInfo) -> str | None:
        """Why a measured `config` must not be written for the run's target SGLang releases, or None."""

    def select(self, tuner, top: int, careful_repeats: int) -> dict[int, Any]:
        """Per M, its finalists re-measured and the winner ({M: autotune.search.finalists.Choice}); `tuner`: the
        problem's autotune.search.study.ProblemTuner."""

    def why_unselected(self, tuner, M: int) -> str:
        """Why `select` found no finalist at M that ran correctly (the run says it for a batch size without a key)."""

    def confirm(self, tuner, choices: dict[int, Any], attempt: Attempt) -> Checked:
        """The picks checked as the server runs them (where this device can), `choices` changed in place where a
        baseline wins there; a check that fails is said through `attempt` and the selection's picks stand."""

    def export_targets(self, folder, problems: list) -> None:
        """Every file `export` would write into the tuned folder (autotune.folder.tuned.TunedFolder) for
        `problems`, checked before anything is measured: NotOurs or ExportError where one may not be written."""

    def export(self, folder, problem, choices: dict[int, Any], run: ProblemRun) -> dict:
        """Its files of one problem written into the tuned folder, with what the run did: {"files": [paths],
        "kept": {M: why an existing entry stayed}, "missing": [M without a key]}."""

    def after_export(self, folder, attempt: Attempt) -> None:
        """Once the problems' files are in: what goes beside them (SKU copies, SGLang's shipped files), each
        step run by `attempt` with `writes=folder`."""

    def file_problem(self, doc, entry: dict | None, name: str) -> str | None:
        """What is wrong with one of its files read back (None: nothing); `entry`: its provenance entry."""

    def loads(self, entry: dict, path, doc: dict) -> str | None:
        """Why SGLang's own loader does not serve the file as written (None: it does)."""


class BackendChoiceFamily(KernelFamily, Protocol):
    """A family whose product is one backend per SGLang server flag (registry.BACKENDS): the hooks the sieve, the
    server choice and the writers call (autotune.contract.backend_family.BackendFamily answers them all)."""
    flag: str                      # the SGLang server flag its choice is written to
    skip: tuple[str, ...]          # the backends --skip-backends leaves out

    def runner(self, backend: str):
        """The runner object of `backend` (autotune.contract.runner.Runner)."""

    def availability(self, device: DeviceInfo) -> list:
        """Every backend with whether it launches here and why not (autotune.contract.capabilities)."""

    def sglang_auto(self, device: DeviceInfo) -> str | None:
        """The backend SGLang's server picks for `auto` on this GPU."""

    def sglang_value(self, backend: str) -> str | None:
        """The server-argument value selecting `backend` (None: SGLang cannot select it)."""

    def tactics(self, config: KernelConfig, inputs) -> list:
        """The tactics the config's backend offers for these inputs (JSON form; -1 first)."""


def get_family(spec: str, **options) -> KernelFamily:
    """A family by its name (autotune.contract.registry), or by "module:Class" where no package declares it
    (the tests' faulty families, built the same way in a worker)."""
    return family_class(spec)(**options)


def family_class(spec: str) -> type:
    """The class of the family `spec` names (its declaration: `compiles_apart`, ...), as get_family finds it."""
    from autotune.contract import registry

    if ":" in spec:
        mod, cls = spec.split(":", 1)
        return getattr(importlib.import_module(mod), cls)
    return registry.get(spec).cls
