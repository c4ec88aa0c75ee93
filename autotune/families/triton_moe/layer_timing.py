"""(gate_up, down) pairs timed as SGLang serves them: the run's final pick, `autotune check`'s re-timing.

SGLang runs a pair as one MoE layer: its router's top-k, the block alignment, gate_up, SiLU-and-mul, down and
the sum over top-k, in its own order, with its own buffers and launch options, each GEMM with the config its
loader reads from the folder it is pointed at. Timing the two GEMMs apart and adding them can rank pairs
otherwise than that layer; a layer composed by us can differ from SGLang's in a launch option or a buffer. So
a side here is a config folder, and the layer is SGLang's own MoE block (autotune.adapters.sglang_layer.MoeBlock,
the Triton runner, as autotune.families.moe_backends launches it), loaded once with one layer's experts:
- the dicts timed are the ones SGLang's loader reads from that folder (a key a file leaves out is Triton's
  default at launch, there as in a server); `loads` says which, and the caller checks them;
- a side's folder is SGLang's own (None: its shipped file for this GPU, else its default config), an empty
  one (its default config), or one holding the candidate pairs as the export writes them (`write_side`);
- each side's output is checked against the float32 layer of the same experts before it is timed;
- timing: one CUDA graph of the layer over `routings` routing sets (other activations, router logits and so
  other experts at each call, as successive decode steps), L2 emptied of the layer's data before each replay by
  reading a buffer (clean lines: a write-flush left the first call to write back 50 MB of dirty lines, ~1.5 µs a
  call more than SGLang's own fused_experts takes back to back), median per call over the replays
  (autotune.measure.timing), the sides in turns with their order rotated at each repeat, so drift falls on
  every side alike.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from autotune.measure.timing import noise

# The sides `autotune check` and the run's layer check compare: the tuned pair, what SGLang loads from its own
# folder (its shipped file for this GPU where it has one, else its default config), its default config.
TUNED, SHIPPED, DEFAULT = "tuned", "shipped", "default"
BASELINES = (SHIPPED, DEFAULT)


class LayerError(ValueError):
    """The layer cannot run as asked (not on this device, no tuned file) or a side computes wrong results."""


def empty_folder(root: str | Path) -> str:
    """A config folder SGLang lists and finds nothing in: its default config (a folder needs configs/)."""
    path = Path(root) / "no_configs"
    (path / "configs").mkdir(parents=True, exist_ok=True)
    return str(path)


def write_side(root: str | Path, name: str, problem, device, pairs: dict) -> str:
    """A config folder holding `pairs` (M -> (gate_up, down)) as the export writes them (SGLang's file names
    for this GPU and Triton, every entry with num_warps and num_stages): the side SGLang serves from it."""
    from autotune.adapters.sglang_loader import sglang_file_name
    from autotune.fileio.writing import write_json
    from autotune.folder.config_files import config_folder
    from autotune.families.triton_moe.schema import complete_entry

    folder = Path(root) / name
    files = folder / config_folder(device.versions.get("triton"))
    files.mkdir(parents=True, exist_ok=True)
    up = {str(M): complete_entry(g) for M, (g, _) in sorted(pairs.items())}
    down = {str(M): complete_entry({**d, "BLOCK_SIZE_M": g["BLOCK_SIZE_M"]}) for M, (g, d) in sorted(pairs.items())}
    write_json(files / sglang_file_name(problem, device), up)
    write_json(files / sglang_file_name(problem, device, down=True), down)
    return str(folder)


class LayerTimer:
    """One MoE problem served by SGLang's own block on this GPU: the layer's experts loaded once, its inputs
    per batch size kept, each side's folder handed to SGLang's loader around that side's launches."""

    def __init__(self, problem, device, *, routings: int = 10, seed: int = 3, replays: int = 7, flush: str = "read"):
        from autotune.families.moe_backends import MoeBf16, MoeFp8
        from autotune.families.moe_backends.triton import RUNNERS

        if device.kind != "gpu":
            raise LayerError("SGLang's MoE block runs on a GPU only: the layer is not timed here")
        family = {"bf16": MoeBf16, "fp8_w8a8_block": MoeFp8}.get(problem.dtype)
        if family is None:
            raise LayerError(f"SGLang's Triton MoE layer is not timed for {problem.dtype} experts here")
        self.problem, self.device, self.routings, self.seed, self.replays = problem, device, routings, seed, replays
        # L2 emptied by reading a buffer before each replay: clean lines, as a server's L2 holds after the reads of
        # the kernels before the layer (autotune.measure.timing.time_gpu)
        self.flush = flush
        self.held_s = 0.0         # seconds checking and timing on the GPU (the run's pace counts them)
        self.family = family()
        self.runner = next(r for r in RUNNERS if r.family == self.family.name)
        self._inputs: dict = {}
        self._routed: dict = {}
        self._root = tempfile.mkdtemp(prefix="autotune-layer-")

    def inputs(self, M: int):
        """One batch size's inputs at a time (with its float32 reference), kept while its sides are timed."""
        if M not in self._inputs:
            self._inputs = {}
            inputs = self.family.make_inputs(self.problem, "layer", M, seed=self.seed, routings=self.routings)
            self._inputs = {M: (inputs, self.family.reference(inputs))}
        return self._inputs[M][0]

    @property
    def scratch(self) -> str:
        """Where the caller writes the sides' folders (removed with the timer)."""
        return self._root

    def loads(self, folder: str | None, M: int) -> tuple[dict, dict]:
        """The (gate_up, down) dicts SGLang's loader reads from `folder` at M, as it will hand them to its kernel."""
        from autotune.adapters.sglang_loader import sglang_selection

        up, down, _ = sglang_selection(self.problem, M, self.device, folder)
        return up, down

    def launch(self, folder: str | None, M: int):
        """launch(i): SGLang's experts (FusedMoE's forward, the Triton runner) on routing set i with the configs
        SGLang's loader reads from `folder`. The router's top-k runs once per routing set, outside: no config
        changes it, and in the layer's time it only dilutes what the configs change."""
        from autotune.adapters.sglang_layer import refusals, use_triton_configs

        inputs = self.inputs(M)
        use_triton_configs(folder)
        block = self.runner.block(inputs)
        routed = self._routed.get(M)
        if routed is None:
            routed = self._routed = {M: [block.route(x, lg) for x, lg in zip(inputs.x, inputs.router_logits)]}
            routed = routed[M]

        def launch(i: int):
            use_triton_configs(folder)
            with refusals("SGLang's Triton MoE runner"):
                return block.apply(inputs.x[i], routed[i])
        return launch

    def error(self, folder: str | None, M: int) -> float:
        """The side's relative error against the float32 layer (LayerError where it is wrong)."""
        from autotune.measure.timing import check_output

        self.inputs(M)
        t0 = time.perf_counter()
        ok, reason, err = check_output(self.launch(folder, M)(0), self._inputs[M][1], self.family.tolerance(self.problem))
        self.held_s += time.perf_counter() - t0
        if not ok:
            up, down = self.loads(folder, M)
            raise LayerError(f"at batch {M} the layer computes wrong results ({reason}); gate_up {up}, down {down}")
        return err

    def time(self, folder: str | None, M: int):
        from autotune.measure.timing import time_gpu

        t0 = time.perf_counter()
        t = time_gpu(self.launch(folder, M), self.routings, repeats=self.replays, flush=self.flush)
        self.held_s += time.perf_counter() - t0
        return t

    def close(self) -> None:
        import shutil

        self._inputs = {}
        shutil.rmtree(self._root, ignore_errors=True)


def time_sides(timer: LayerTimer, sides: dict, Ms, repeats: int = 3) -> list[dict]:
    """Per batch size: each side (name -> config folder, None: SGLang's own) checked, then timed `repeats`
    times in turns. Rows: {"M", "<side> µs" (median over repeats of the per-call medians), "<side> spread"
    ((max - min) / median over repeats, at least the replays' own), "<side> error", "<side> loads"
    ([gate_up, down] as SGLang's loader read them)}. A side whose folder has no key at M is left out at M."""
    import torch

    names = list(sides)
    rows = []
    with torch.no_grad():
        for M in Ms:
            row: dict = {"M": M}
            for side in names:
                row[f"{side} loads"] = list(timer.loads(sides[side], M))
                row[f"{side} error"] = timer.error(sides[side], M)
            times: dict = {s: [] for s in names}
            spreads: dict = {s: [] for s in names}
            for r in range(repeats):
                for side in names[r % len(names):] + names[: r % len(names)]:
                    t = timer.time(sides[side], M)
                    times[side].append(t.median_us)
                    spreads[side].append(t.spread)
            for side, ts in times.items():
                med = statistics.median(ts)
                row[f"{side} µs"] = med
                row[f"{side} spread"] = max((max(ts) - min(ts)) / med if med else 0.0, statistics.median(spreads[side]))
            rows.append(row)
    return rows


def verdict(row: dict, side: str = TUNED, against=BASELINES) -> dict:
    """A time_sides row judged: the fastest of `against`, its µs, the noise threshold (the larger of the two
    sides' spreads, at least measure.MIN_EFFECT) and whether `side` is slower than it beyond that."""
    best = min((s for s in against if f"{s} µs" in row), key=lambda s: row[f"{s} µs"])
    margin = noise(row[f"{side} spread"], row[f"{best} spread"])
    return {"side": best, "us": row[f"{best} µs"], "noise": margin,
            "slower": row[f"{side} µs"] > row[f"{best} µs"] * (1 + margin)}

