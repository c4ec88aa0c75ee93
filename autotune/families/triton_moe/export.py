"""The Triton fused-MoE family's export: SGLang's fused-MoE config files and their provenance.

Layout (so `SGLANG_MOE_CONFIG_DIR=tuned_configs/<device>` works unchanged):
  tuned_configs/<device>/configs/triton_<x_y_z>/<SGLang's file name>        gate_up, keys = M
  tuned_configs/<device>/configs/triton_<x_y_z>/<SGLang's file name>_down   down (+ USE_TMA)
  tuned_configs/<device>/provenance.json                                    how each M was chosen
The Triton version in the folder is the one the configs were measured with. An existing file
is merged per M: an entry measured faster on the same device and Triton version is kept, if the
SGLang releases this export targets can run it. Provenance lists, per file, every supported SGLang
release that loads and runs all of its entries (`sglang_versions`, see autotune.adapters.sglang_versions).
"""
from __future__ import annotations

from pathlib import Path

from autotune.errors import ExportError
from autotune.gpus.device import utc_now
from autotune.fileio.writing import claim, forced, sha256, write_json
from autotune.adapters.sglang_loader import sglang_file_name
from autotune.contract.config import KernelConfig
from autotune.search.finalists import Choice
from autotune.adapters.sglang_versions import config_problem, valid_releases
from autotune.folder.tuned import TunedFolder


def _sglang_entry(config: KernelConfig) -> dict:
    """Every entry written names num_warps and num_stages (Triton's defaults where the config leaves them to
    Triton: SGLang's default config does), so a reader sees what runs."""
    from autotune.families.triton_moe.schema import entry_config

    return entry_config(config).to_entry()


def export_targets(tuned: TunedFolder, problems) -> None:
    """Every file `export_problem` (and the SKU copies) would write for `problems`, checked before
    anything is measured: NotOurs where one is not ours, ExportError where the folder holds results
    measured another way."""
    from autotune.families.triton_moe.overlay import broken_copies

    device, folder = tuned.device, tuned.config_dir()
    # SGLang's per-Triton folders (ours and the shipped overlay's) and the folders above them
    configs = tuned.path / "configs"
    in_the_way = next((p for p in (folder, *folder.parents, *(configs.glob("triton_*") if configs.is_dir() else ()))
                       if p.exists() and not p.is_dir()), None)
    if in_the_way is not None:
        raise ExportError(f"{in_the_way} is a file where a folder of SGLang's config files goes: move it away")
    prov = tuned.provenance() or {"files": {}}
    ours = tuned.ours(prov)
    broken = [] if forced() else broken_copies(tuned)
    if broken:
        raise ExportError(f"{broken[0]}; not replaced (remove it: the run copies it again; or pass --force)"
                          + (f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""))
    owner = (prov.get("device") or {}).get("name")
    if prov["files"] and owner not in (None, device.name) and not forced():
        raise ExportError(f"{tuned.provenance_file} names files tuned on {owner}; results of "
                          f"{device.name} are not written into it (its entries would be dropped): choose another "
                          "--out, or pass --force to replace them")
    tag = f"device_name={device.file_name}"
    for problem in problems:
        names = (sglang_file_name(problem, device), sglang_file_name(problem, device, down=True))
        entry = prov["files"].get(names[0], {})
        if entry and entry.get("measured_on") != device.kind:
            raise ExportError(f"{tuned.provenance_file} holds {names[0]} measured on "
                              f"'{entry.get('measured_on')}'; results measured on '{device.kind}' are not mixed "
                              "into it (choose another --out)")
        for name in names:
            for sku in ("", *tuned.sku_names):
                n = name.replace(tag, f"device_name={sku.replace(' ', '_')}") if sku else name
                claim(folder / n, ours)
        if entry:
            _merge_base(folder, names, entry)        # read now: a broken or hand-edited one is said before measuring


def _merge_base(folder: Path, names: tuple[str, str], entry: dict) -> tuple[dict, dict]:
    """The (gate_up, down) files a merge starts from: what an earlier export wrote, each read and
    checked as SGLang's loader would take it ({} where there is none; under --force, where it is broken:
    it is replaced)."""
    from autotune.families.triton_moe.schema import schema_problem
    from autotune.fileio.reading import load_json

    docs = []
    for name in names:
        try:
            doc = load_json(folder / name) if entry else {}
            why = schema_problem(doc) if doc != {} else None
            recorded = (entry.get("sha256") or {}).get(name)
            if why is None and recorded and sha256(folder / name) != recorded:
                # never kept and certified again: its entries are not what was measured
                why = "changed since autotune wrote it (its sha256 is not the one provenance.json records)"
        except FileNotFoundError:
            doc, why = {}, None
        except (OSError, ValueError) as e:
            doc, why = {}, f"not valid JSON ({e})"
        if why and not forced():
            raise ExportError(f"{folder / name}: {why}; it is not merged into (restore or remove it, or pass "
                              "--force to replace it)")
        docs.append({} if why else doc)
    return docs[0], docs[1]


def export_problem(tuned: TunedFolder, problem, choices: dict[int, Choice], run: dict,
                   targets: tuple[str, ...] = ()) -> dict:
    """Write (merge) the two files of one problem into the tuned folder, and its provenance entry. Returns a
    summary {"files": [...], "kept": {M: why}} naming the M whose existing entries were better.
    `targets`: the SGLang releases the files must run in (an existing entry they cannot run is
    replaced, never kept)."""
    from autotune.families.triton_moe.tma import tma_capable
    device = tuned.device
    tma = tma_capable(device)

    def runs_everywhere(up: dict, down: dict) -> bool:
        return config_problem(up, "gate_up", targets, tma) is None and config_problem(down, "down", targets, tma) is None

    folder = tuned.config_dir()
    prov = tuned.provenance() or {"device": device.to_dict(), "files": {}}
    ours = tuned.ours(prov)
    up_name = sglang_file_name(problem, device)
    down_name = sglang_file_name(problem, device, down=True)
    old_entry = prov["files"].get(up_name, {})
    if old_entry and old_entry.get("measured_on") != device.kind:
        raise ExportError(f"{tuned.provenance_file} holds {up_name} measured on '{old_entry.get('measured_on')}'; "
                          f"results measured on '{device.kind}' are not mixed into it (choose another --out)")
    same_stack = (old_entry.get("device") == device.name
                  and old_entry.get("triton") == device.versions.get("triton"))
    # only a file the provenance lists is ours to merge with (forced over another: replaced)
    old_up, old_down = _merge_base(folder, (up_name, down_name), old_entry) if old_entry else ({}, {})

    per_m: dict = {}
    up_json, down_json, kept = {}, {}, {}
    for M in sorted(set(choices) | ({int(k) for k in old_up} if same_stack else set())):
        new = choices.get(M)
        old_ok = str(M) in old_up and str(M) in old_down and runs_everywhere(old_up[str(M)], old_down[str(M)])
        if new is None and old_ok:
            up_json[str(M)], down_json[str(M)] = old_up[str(M)], old_down[str(M)]
            if str(M) in old_entry.get("per_M", {}):
                per_m[str(M)] = old_entry["per_M"][str(M)]
            continue
        old = old_entry.get("per_M", {}).get(str(M)) if same_stack else None
        # compared as provenance keeps both (3 decimals): the same timing read back is no faster
        keep_old = old is not None and old_ok and (
            new is None or (old.get("tuned_us") is not None and old["tuned_us"] < round(new.total_us, 3)))
        if keep_old:
            up_json[str(M)], down_json[str(M)] = old_up[str(M)], old_down[str(M)]
            per_m[str(M)] = old
            if new is not None:
                kept[M] = f"existing {old['tuned_us']:.2f} us beats new {new.total_us:.2f} us"
            continue
        if new is None:
            continue     # an old entry the targets cannot run, and nothing new for this M
        up_json[str(M)] = _sglang_entry(new.gate_up)
        down_json[str(M)] = _sglang_entry(new.down.with_params(BLOCK_SIZE_M=new.gate_up["BLOCK_SIZE_M"]))
        per_m[str(M)] = {
            "tuned_us": round(new.total_us, 3), "gate_up_us": round(new.gate_up_us, 3),
            "down_us": round(new.down_us, 3), "source": new.source,
            "default_us": _r(new.baseline_us.get("default")), "shipped_us": _r(new.baseline_us.get("shipped")),
            **run.get("per_M", {}).get(M, {}),
        }
    valid = valid_releases(up_json, down_json, tma)
    missing = [v for v in targets if v not in valid]
    if missing:   # the selection honours the targets; this guards the merge and any future path
        raise ExportError(f"{up_name}: the merged file would not run in SGLang {', '.join(missing)}; nothing written")
    write_json(folder / up_name, up_json, ours=ours)
    write_json(folder / down_name, down_json, ours=ours)
    prov["device"] = device.to_dict()
    prov["files"][up_name] = {
        "down_file": down_name, "problem": problem.to_dict(), "device": device.name,
        "compute_capability": device.sm, "driver": device.driver, "triton": device.versions.get("triton"),
        "versions": device.versions, "measured_on": device.kind,
        "sglang_targets": list(targets), "sglang_versions": valid,
        "replay_note": ("replayed from a recorded measurement cache, not measured in this run"
                        if device.is_replay else ""),
        "date": utc_now(), "run": {k: v for k, v in run.items() if k != "per_M"}, "per_M": per_m,
        "kept_existing": {str(k): v for k, v in kept.items()},
        # what was written, so `autotune check` sees a hand edit
        "sha256": {n: sha256(folder / n) for n in (up_name, down_name)},
    }
    tuned.write_provenance(prov)
    return {"files": [str(folder / up_name), str(folder / down_name)], "kept": kept,
            "missing": [M for M in problem.batch_sizes if str(M) not in up_json]}


def _r(x):
    return None if x is None else round(x, 3)
