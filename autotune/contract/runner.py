"""One backend of a kernel family, as FlashInfer's TunableRunner is one.

A runner owns its rules: what is known of where it runs (compute capabilities, CUDA version,
FlashInfer's own requirement declaration, what the field showed despite it: predictions the run
shows beside what the launch did, never a reason not to launch), the packages it imports, the
SGLang server-argument value that selects it, its tactics for a problem and its launch. The family
owns the problem's inputs, the float32 reference and the tolerance; the core (autotune.measure.pool,
study, choice) loops, times, checks and stores, and never knows a backend's rules.

Adding a backend is one file: a module in its family's package (autotune/families/fp8_gemm/,
fp4_gemm/, moe_backends/) that defines `RUNNER` (or `RUNNERS`, one per family it serves). The
capability table (autotune.contract.capabilities) is made of these declarations. docs/DESIGN.md has an example.
"""
from __future__ import annotations

import contextlib
import importlib
import pkgutil
import warnings
from dataclasses import dataclass

# FlashInfer's cuDNN runners catch a plan that fails, warn with this, and run tactic -1 instead.
FELL_BACK = "falling back to default tactic=-1"


class TacticNotRun(RuntimeError):
    """FlashInfer ran its default in place of the tactic asked for."""


@dataclass(frozen=True)
class Runner:
    family: str
    name: str
    sglang_value: str | None          # value of the family's server flag; None: SGLang cannot select it
    calls: str                        # the API measured
    flashinfer: tuple | None = None   # (function, backend argument or None) whose declaration decides
    sms: frozenset | None = None      # explicit compute capabilities where FlashInfer declares none
    min_cuda: tuple | None = None     # (major, minor) of the CUDA runtime
    needs: tuple = ()                 # Python modules that must import
    tunable: bool = False             # has tactics beyond -1 to search
    # (compute capabilities, evidence): what the field showed despite the declarations; the outcome
    # a run expects there (autotune.contract.capabilities.expected_failure), and the tests' expected outcome
    known_failures: tuple = ()
    # why autotune cannot launch it yet (declared so it is listed and skipped with the reason)
    not_implemented: str | None = None
    # FlashInfer's op name and runner class for its tactics: the key of its autotune cache entries
    # and of its tactics blocklist ("op::RunnerClass")
    flashinfer_op: str | None = None
    flashinfer_runner: str | None = None
    # > 0: a tactic is a list of this many independent parts (cutlass_fused_moe: [gemm1, gemm2]); the
    # runner lists them one part at a time (the others -1) and the core also measures the best parts together
    tactic_axes: int = 0
    # False: a value SGLang lists that no module of the family declares (moe_backends/sglang_listed):
    # nothing is known of it, so it is launched only in its own trial, never in the warm-up
    declared: bool = True

    def tactics(self, inputs) -> list[int]:
        """The tactics to try for these inputs. -1 is the backend as SGLang runs it (its own
        default or FlashInfer's autotuned choice)."""
        return [-1]

    def blocklist_keys(self, tactic) -> list:
        """("op::RunnerClass", tactic) pairs under which FlashInfer's blocklist names this tactic."""
        return [(f"{self.flashinfer_op}::{self.flashinfer_runner}", tactic)] if self.flashinfer_op else []

    def cache_entries(self, problem, M: int, tactic) -> list:
        """FlashInfer's autotune cache entries pinning `tactic` for this problem at M
        (autotune.adapters.flashinfer_cache.CacheEntry; one per op the tactic names), [] where FlashInfer
        keeps no entry for it."""
        return []

    def kept(self, inputs, what: str, make):
        """`make()` once per set of inputs and per runner: a worker's inputs at an M serve every
        backend it measures there, so an object of one backend (FlashInfer's runner) is never
        handed to another (shared, cuDNN's tactics would run on the cuBLAS runner)."""
        key = (what, self.name)
        if key not in inputs.cache:
            inputs.cache[key] = make()
        return inputs.cache[key]

    def run(self, inputs, routing: int, tactic: int = -1):
        """Launch once on routing set `routing`; returns the output tensor (and sets inputs.C)."""
        raise NotImplementedError(f"{self.family}/{self.name}: {self.not_implemented or 'no launch'}")


def discover(package: str, skip: tuple = (), asking: bool = True) -> list[Runner]:
    """The runners declared by the modules of `package` (but the modules named in `skip`), in
    module-name order. `asking=False` leaves out those a module makes by asking an installed package
    on first access (a module `__getattr__` for RUNNERS: moe_backends/sglang_listed.py asks SGLang's
    list of the flag's values), so nothing but the package's own modules is imported."""
    pkg = importlib.import_module(package)
    found: list[Runner] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name in skip:
            continue
        mod = importlib.import_module(f"{package}.{info.name}")
        runners = getattr(mod, "RUNNERS", ()) if asking else vars(mod).get("RUNNERS", ())
        found.extend(runners or ([mod.RUNNER] if "RUNNER" in vars(mod) else []))
    return found


@contextlib.contextmanager
def exact_tactic(tactic):
    """Run a FlashInfer tactic so that it fails as itself: where FlashInfer would quietly run
    its default in its place (the output right, the time the default's), raise TacticNotRun."""
    if tactic == -1:
        yield
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    for w in seen:
        if FELL_BACK in str(w.message):
            raise TacticNotRun(f"FlashInfer ran tactic -1 in place of {tactic}: {w.message}")


@contextlib.contextmanager
def flashinfer_pin(entries: list, expected: list):
    """Run a launch inside with FlashInfer's cache pinning `entries` (the file the tuned folder ships,
    loaded with AutoTuner.load_configs as SGLang loads ours): the tactic is measured as the server
    will run it. `expected`: the tactics FlashInfer's choose_one must hand out inside, in call order;
    another answer (the entry's key is not the key of SGLang's call, so FlashInfer ran its default)
    raises TacticNotRun, so a tactic is never credited with the default's time."""
    import os
    import tempfile

    from autotune.adapters.flashinfer_cache import metadata_for, write_cache
    from autotune.adapters.flashinfer_tuner import metadata_fields, tuner as flashinfer_tuner

    tuner = flashinfer_tuner()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="autotune_pin_")
    os.close(fd)
    try:
        os.unlink(path)
        write_cache(path, entries, metadata_for({}, wildcard=list(metadata_fields())))
        tuner.load_configs(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    handed: list = []
    choose_one = tuner.choose_one

    def observed(*args, **kwargs):
        runner, tactic = choose_one(*args, **kwargs)
        handed.append(tactic)
        return runner, tactic
    tuner.choose_one = observed
    try:
        yield
    finally:
        del tuner.choose_one            # the class's own method again
    if [_plain(t) for t in handed] != [_plain(t) for t in expected]:
        raise TacticNotRun(f"FlashInfer ran tactic(s) {handed} in place of {expected}: the pinned cache key "
                           "is not the key of SGLang's call")


def _plain(tactic):
    """A tactic in JSON form (tuples as lists), for comparing what FlashInfer handed out."""
    import json

    from autotune.adapters.flashinfer_tuner import tactic_to_json
    return json.loads(json.dumps(tactic_to_json(tactic)))
