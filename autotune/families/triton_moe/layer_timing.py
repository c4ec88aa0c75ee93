"""(gate_up, down) pairs timed as SGLang serves them: the run's final pick, `autotune check`'s re-timing.

SGLang runs a pair as one MoE layer: its router's top-k, the block alignment, gate_up, SiLU-and-mul, down and
the sum over top-k, in its own order, with its own buffers and launch options, each GEMM with the config its
loader reads from the folder it is pointed at. Timing the two GEMMs apart and adding them can rank pairs
otherwise than that layer; a layer composed by us can differ from SGLang's in a launch option or a buffer. So
a side here is a config folder, and the layer is SGLang's own `fused_experts`, the function its Triton runner calls
for a layer's experts (autotune.adapters.sglang_layer.fused_experts), on one layer's experts made once:
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
    from autotune.families.triton_moe.schema import entry_config

    folder = Path(root) / name
    files = folder / config_folder(device.versions.get("triton"))
    files.mkdir(parents=True, exist_ok=True)
    configs = {M: (entry_config(g), entry_config(d)) for M, (g, d) in sorted(pairs.items())}
    up = {str(M): g.to_entry() for M, (g, _) in configs.items()}
    down = {str(M): d.with_params(BLOCK_SIZE_M=g["BLOCK_SIZE_M"]).to_entry() for M, (g, d) in configs.items()}
    write_json(files / sglang_file_name(problem, device), up)
    write_json(files / sglang_file_name(problem, device, down=True), down)
    return str(folder)


def layer_tolerance(dtype: str) -> float:
    """The layer's relative error allowed against its float32 reference: the MoE runner family's of that dtype
    (bf16 0.02, block FP8 0.08: activations quantized per 128-group inside the layer)."""
    from autotune.families.moe_backends import MoeBf16, MoeFp8

    return (MoeBf16 if dtype == "bf16" else MoeFp8).tol


class LayerTimer:
    """One MoE problem served by SGLang's `fused_experts` on this GPU (the function its Triton runner calls for a
    layer's experts): one layer's experts made once (the family's own weights, in the layout that runner holds:
    w13 [E, 2N, K], w2 [E, K, N]), one batch size's inputs kept at a time with their float32 reference, each side's
    folder handed to SGLang's loader around that side's launches."""

    def __init__(self, problem, device, *, routings: int = 10, seed: int = 3, replays: int = 7, flush: str = "read"):
        from autotune.families.triton_moe.inputs import compute_dtype, expert_weights

        if device.kind != "gpu":
            raise LayerError("SGLang's fused MoE runs on a GPU only: the layer is not timed here")
        if problem.dtype not in ("bf16", "fp8_w8a8_block"):
            raise LayerError(f"SGLang's Triton MoE layer is not timed for {problem.dtype} experts here")
        self.problem, self.device, self.routings, self.seed, self.replays = problem, device, routings, seed, replays
        # L2 emptied by reading a buffer before each replay: clean lines, as a server's L2 holds after the reads of
        # the kernels before the layer (autotune.measure.timing.time_gpu)
        self.flush = flush
        self.held_s = 0.0         # seconds checking and timing on the GPU (the run's pace counts them)
        self._last_timed = float("-inf")
        up = expert_weights(problem, "gate_up", seed, "cuda", compute_dtype(problem, False))
        down = expert_weights(problem, "down", seed, "cuda", compute_dtype(problem, False))
        self.weights = (up[0], up[1], down[0], down[1])
        self.dequant = (up[2], down[2])
        self._inputs: dict = {}
        self._root = tempfile.mkdtemp(prefix="autotune-layer-")

    def inputs(self, M: int):
        """(x, topk_weights, topk_ids) per routing set at M and the float32 layer of routing set 0, one M at a time."""
        if M not in self._inputs:
            import torch

            from autotune.adapters.moe_checkpoint import reference
            from autotune.families.triton_moe.inputs import random_routing

            self._inputs = {}
            p = self.problem
            g = torch.Generator(device="cuda").manual_seed(self.seed * 7919 + M)
            ids, wts = random_routing(g, M, p.E, p.top_k, 0.0, self.routings)
            xs = [torch.randn((M, p.K), generator=g, device="cuda").to(torch.bfloat16) for _ in range(self.routings)]
            ref = reference(xs[0], ids[0], wts[0], self.dequant[0], self.dequant[1], p.N)
            self._inputs = {M: (xs, wts, ids, ref)}
        return self._inputs[M]

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
        """launch(i): SGLang's fused_experts on routing set i with the configs its loader reads from `folder`."""
        from autotune.adapters.sglang_layer import fused_experts, use_triton_configs

        xs, wts, ids, _ = self.inputs(M)

        def launch(i: int):
            use_triton_configs(folder)
            return fused_experts(self.problem, self.weights, xs[i], wts[i], ids[i])
        return launch

    def error(self, folder: str | None, M: int) -> float:
        """The side's relative error against the float32 layer (LayerError where it is wrong)."""
        from autotune.measure.timing import check_output

        ref = self.inputs(M)[3]
        t0 = time.perf_counter()
        ok, reason, err = check_output(self.launch(folder, M)(0), ref, layer_tolerance(self.problem.dtype))
        self.held_s += time.perf_counter() - t0
        if not ok:
            up, down = self.loads(folder, M)
            raise LayerError(f"at batch {M} the layer computes wrong results ({reason}); gate_up {up}, down {down}")
        return err

    def time(self, folder: str | None, M: int):
        from autotune.measure.timing import HOT_GAP_S, WARMUP_HOT_MS, WARMUP_MS, time_gpu

        t0 = time.perf_counter()
        hot = t0 - self._last_timed < HOT_GAP_S      # the sides are timed back to back: the GPU stays warm
        t = time_gpu(self.launch(folder, M), self.routings, repeats=self.replays, flush=self.flush,
                     warmup_ms=WARMUP_HOT_MS if hot else WARMUP_MS)
        self._last_timed = time.perf_counter()
        self.held_s += self._last_timed - t0
        return t

    def close(self) -> None:
        import shutil

        self._inputs, self.weights = {}, None
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
    best = fastest(row, against)
    return {"side": best, "us": row[f"{best} µs"], "noise": noise(row[f"{side} spread"], row[f"{best} spread"]),
            "slower": faster(row, best, side)}


def fastest(row: dict, sides) -> str:
    """The side of `sides` the row timed fastest."""
    return min((s for s in sides if f"{s} µs" in row), key=lambda s: row[f"{s} µs"])


def faster(row: dict, a: str, b: str) -> bool:
    """Side `a` faster than side `b` beyond the noise of the two (autotune.measure.timing.noise)."""
    return row[f"{b} µs"] > row[f"{a} µs"] * (1 + noise(row[f"{a} spread"], row[f"{b} spread"]))

