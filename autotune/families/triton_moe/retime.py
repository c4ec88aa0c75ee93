"""`autotune check`'s re-timing of a folder's fused-MoE files on the GPU that serves them: each file's configs
timed as SGLang serves the layer (autotune.families.triton_moe.layer_timing), against SGLang's own folder (its
shipped file) and its default config, at a few of the batch sizes it holds."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from autotune.errors import CheckError

# Batch sizes re-timed per file (those the file holds): decode, mid and prefill.
RETIME_MS = (1, 32, 256, 4096)


def retime_sample(batch_sizes) -> list[int]:
    have = [int(M) for M in batch_sizes]
    return [M for M in RETIME_MS if M in have] or sorted(have)[:: max(1, len(have) // 3)]


def retime(folder: str | Path, prov: dict, machine, *, repeats: int = 5, timer=None,
           batch_sizes=None) -> tuple[int, list[str]]:
    """(files slower than shipped or default, report lines) after re-timing each Triton MoE file of the folder
    at its sampled batch sizes as SGLang serves it (autotune.families.triton_moe.layer_timing: SGLang's own MoE
    block, its loader pointed at the folder, at SGLang's own folder and at an empty one).
    `timer(problem, sides, Ms, repeats)` -> time_sides rows (default: that block on this GPU)."""
    from autotune.problems.models import Problem, problem_from_dict
    from autotune.families.triton_moe.layer_timing import (DEFAULT, SHIPPED, TUNED, LayerError, empty_folder,
                                                          verdict)
    from autotune.gpus.memory_plan import hold_to_cap
    from autotune.adapters.sglang_loader import sglang_selection

    if timer is None:
        hold_to_cap()
    timer = timer or _sglang_block_timer(machine)
    slow, lines, timed, held = 0, [], 0, set()
    scratch = tempfile.mkdtemp(prefix="autotune-check-")
    try:
        sides = {TUNED: str(folder), SHIPPED: None, DEFAULT: empty_folder(scratch)}
        for name, entry in sorted(prov["files"].items()):
            problem = problem_from_dict(entry["problem"]) if isinstance(entry.get("problem"), dict) else None
            if not isinstance(problem, Problem):
                continue
            Ms = [M for M in batch_sizes if M in problem.batch_sizes] if batch_sizes else retime_sample(problem.batch_sizes)
            if not Ms:
                held.update(problem.batch_sizes)
                lines.append(f"{name}: not re-timed: none of --batch-sizes is among its batch sizes")
                continue
            if not sglang_selection(problem, Ms[0], machine, str(folder))[2]:
                lines.append(f"{name}: not re-timed: SGLang's loader finds no file for {problem.key} in {folder} "
                             "(the tuned side would run its default config)")
                continue
            try:
                rows = timer(problem, sides, Ms, repeats)
            except LayerError as e:
                lines.append(f"{name}: not re-timed: {e}")
                continue
            timed += 1
            for row in rows:
                t, v = row[f"{TUNED} µs"], verdict(row)
                said = (f"{name} M={row['M']}: tuned {t:.1f} µs, shipped {row[f'{SHIPPED} µs']:.1f} µs "
                        f"(SGLang's own folder), default {row[f'{DEFAULT} µs']:.1f} µs")
                if v["slower"]:
                    slow += 1
                    lines.append(f"drift: {said}: slower than {v['side']} by {t / v['us'] - 1:.1%} "
                                 f"(spread {v['noise']:.1%}): re-tune this file")
                else:
                    lines.append(f"re-timed {said}: no slower than either (spread {v['noise']:.1%})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if batch_sizes and held and not timed:
        raise CheckError(f"--batch-sizes {','.join(map(str, batch_sizes))}: no Triton MoE file of {folder} holds any of "
                         f"them (they hold {','.join(map(str, sorted(held)))})")
    return slow, lines


def _sglang_block_timer(machine):
    """time_sides on SGLang's own MoE block on this GPU, one block per problem."""
    def timer(problem, sides, Ms, repeats):
        from autotune.families.triton_moe.layer_timing import LayerTimer, time_sides

        t = LayerTimer(problem, machine)
        try:
            return time_sides(t, sides, Ms, repeats)
        finally:
            t.close()
    return timer
