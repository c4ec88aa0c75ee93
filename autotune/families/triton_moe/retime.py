"""`autotune check`'s re-timing of a folder's fused-MoE files on the GPU that serves them: each file's config
timed as SGLang runs the layer (autotune.families.triton_moe.moe_layer), against SGLang's shipped file and its
default config, at a few of the batch sizes it holds."""
from __future__ import annotations

from pathlib import Path

from autotune.errors import CheckError

# Batch sizes re-timed per file (those the file holds): decode, mid and prefill.
RETIME_MS = (1, 32, 256, 4096)


def retime_sample(batch_sizes) -> list[int]:
    have = [int(M) for M in batch_sizes]
    return [M for M in RETIME_MS if M in have] or sorted(have)[:: max(1, len(have) // 3)]


def retime(folder: str | Path, prov: dict, machine, *, repeats: int = 5, timer=None,
           batch_sizes=None) -> tuple[int, list[str]]:
    """(files slower than shipped or default, report lines) after re-timing each Triton MoE file
    of the folder at its sampled batch sizes. `timer(sides, Ms, repeats)` -> rows (moe_layer.time_sides)."""
    from autotune.problems.models import Problem, problem_from_dict
    from autotune.families.triton_moe.moe_layer import LayerError, MoeSides, time_sides, verdict

    from autotune.gpus.memory_plan import hold_to_cap

    if timer is None:
        hold_to_cap()
    timer = timer or time_sides
    slow, lines, timed, held = 0, [], 0, set()
    for name, entry in sorted(prov["files"].items()):
        problem = problem_from_dict(entry["problem"]) if isinstance(entry.get("problem"), dict) else None
        if not isinstance(problem, Problem):
            continue
        try:
            sides = MoeSides(problem, machine, folder)
        except LayerError as e:
            lines.append(f"{name}: not re-timed: {e}")
            continue
        Ms = [M for M in batch_sizes if M in problem.batch_sizes] if batch_sizes else retime_sample(problem.batch_sizes)
        if not Ms:
            held.update(problem.batch_sizes)
            lines.append(f"{name}: not re-timed: none of --batch-sizes is among its batch sizes")
            continue
        timed += 1
        for row in timer(sides, Ms, repeats):
            t, v = row["tuned µs"], verdict(row)
            said = (f"{name} M={row['M']}: tuned {t:.1f} µs, shipped {row['default µs']:.1f} µs "
                    f"({row['default source']}), default {row['heuristic µs']:.1f} µs")
            if v["slower"]:
                slow += 1
                lines.append(f"drift: {said}: slower than {v['name']} by {t / v['us'] - 1:.1%} "
                             f"(spread {v['noise']:.1%}): re-tune this file")
            else:
                lines.append(f"re-timed {said}: no slower than either (spread {v['noise']:.1%})")
    if batch_sizes and held and not timed:
        raise CheckError(f"--batch-sizes {','.join(map(str, batch_sizes))}: no Triton MoE file of {folder} holds any of "
                         f"them (they hold {','.join(map(str, sorted(held)))})")
    return slow, lines
