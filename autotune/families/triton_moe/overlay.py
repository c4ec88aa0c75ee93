"""SGLang's shipped files beside ours, so `SGLANG_MOE_CONFIG_DIR=<folder>` never loses one.

SGLang reads `$SGLANG_MOE_CONFIG_DIR/configs/triton_*/` *instead of* its own config folder: a folder
holding only the shapes we tuned would send every other shape SGLang ships a file for to the
default heuristic. So the exported folder also holds every shipped file of this device, copied
from the installed SGLang into the same `triton_<ver>/` folder it ships in, so SGLang's own
lookup (exact Triton folder, then the others newest first) finds the same file it would have
found in its own folder. Two exceptions, both recorded in provenance.json's `shipped_overlay`:
- a file name we tuned is never copied from any Triton folder: a shipped copy in a newer Triton
  folder would otherwise win SGLang's fallback over our file on a machine whose Triton version
  matches neither;
- a shipped file that a target SGLang release cannot run (up-projection `USE_TMA` for 0.5.16) is
  left out, and that shape gets SGLang's default there, as it would without the overlay.
Our files are the ones provenance.json's `files` names; the overlay is recomputed on every export
(files it copied earlier and no longer wants are removed; ours are never touched).
"""
from __future__ import annotations

from pathlib import Path

from autotune.fileio.writing import copy_file, forced, inside, sha256
from autotune.adapters.sglang_versions import valid_releases
from autotune.folder.tuned import OVERLAY, TunedFolder, tuned_names
from autotune.fileio.reading import load_json


def _still_ours(path: Path, rel: str, old: list, old_sha: dict) -> bool:
    """An earlier overlay's copy, unchanged since (a copy edited by hand is the user's now)."""
    return rel in old and (rel not in old_sha or sha256(path) == old_sha[rel])


def broken_copies(tuned: TunedFolder) -> list[str]:
    """Earlier overlay copies changed since and no longer a file SGLang's loader takes (emptied, cut
    short): the folder would crash the server that reads it, and a copy changed by hand is not ours to
    replace, so the run says so before measuring (under --force it copies the file again)."""
    from autotune.families.triton_moe.schema import schema_problem

    folder = tuned.path
    overlay = (tuned.provenance() or {}).get(OVERLAY) or {}
    old, old_sha = overlay.get("files", []), overlay.get("sha256", {})
    out = []
    for rel in old:
        path = inside(folder, rel)
        if not path.is_file() or _still_ours(path, rel, old, old_sha):
            continue
        try:
            why = schema_problem(load_json(path))
        except (OSError, ValueError) as e:
            why = f"not valid JSON ({e})"
        if why:
            out.append(f"{path}: SGLang's shipped file copied here was changed since and {why}")
    return out


def _pair_name(name: str) -> tuple[str, str]:
    up = name[: -len("_down.json")] + ".json" if name.endswith("_down.json") else name
    return up, up[: -len(".json")] + "_down.json"


def overlay_shipped(tuned: TunedFolder, targets: tuple[str, ...], builtin: str | Path | None = None,
                    sglang_version: str | None = None) -> dict:
    """Copy the installed SGLang's shipped files for the folder's device (and the SKUs the folder also has
    copies for) into the tuned folder (see module doc). Returns the `shipped_overlay` record it also
    writes into provenance.json."""
    from autotune.adapters.sglang_loader import builtin_config_dir
    from autotune.families.triton_moe.tma import tma_capable
    from autotune.adapters.sglang_versions import installed

    folder, device = tuned.path, tuned.device
    prov = tuned.provenance() or {"device": device.to_dict(), "files": {}}
    ours = tuned_names(prov)
    src_root = Path(builtin or builtin_config_dir()) / "configs"
    tma = tma_capable(device)
    old = (prov.get(OVERLAY) or {}).get("files", [])
    old_paths = {rel: inside(folder, rel) for rel in old}      # each checked before anything is copied
    old_sha = (prov.get(OVERLAY) or {}).get("sha256", {})
    copied, skipped, hashes = [], {}, {}
    tags = {f"device_name={n.replace(' ', '_')}," for n in (device.name, *tuned.sku_names)}
    for src in sorted(src_root.glob("triton_*/*.json")):
        plain = src.name.replace("_down.json", ",").replace(".json", ",")
        if not any(t in plain for t in tags):
            continue
        rel = f"configs/{src.parent.name}/{src.name}"
        if src.name in ours:
            skipped[rel] = "this shape is tuned here: our file must win SGLang's Triton-folder fallback"
            continue
        up_name, down_name = _pair_name(src.name)
        up = load_json(src.parent / up_name) if (src.parent / up_name).exists() else {}
        down = load_json(src.parent / down_name) if (src.parent / down_name).exists() else {}
        missing = [v for v in targets if v not in valid_releases(up, down, tma)]
        if missing:
            skipped[rel] = f"SGLang {', '.join(missing)} cannot run it"
            continue
        dst = folder / rel
        if dst.exists() and not forced() and not _still_ours(dst, rel, old, old_sha):
            skipped[rel] = "a file of that name is already in the folder and is not ours to replace"
            continue
        copy_file(src, dst)
        copied.append(rel)
        hashes[rel] = sha256(dst)
    for rel in set(old) - set(copied):              # an earlier overlay's copy no longer wanted
        p = old_paths[rel]
        if p.name not in ours and p.exists() and _still_ours(p, rel, old, old_sha):
            p.unlink()
    record = {"sglang": sglang_version or installed(), "source": _shown(src_root), "targets": list(targets),
              "files": copied, "skipped": skipped, "sha256": hashes}
    prov[OVERLAY] = record
    tuned.write_provenance(prov)
    return record


def _shown(src_root: Path) -> str:
    """Where the copies came from, said the same on every machine: inside the installed sglang
    package the path from `sglang/` on (the install prefix is this machine's, not the data's)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")    # found, not imported: a remembered run never imports it
    if spec is None or not spec.origin:
        return str(src_root)
    root = Path(spec.origin).resolve().parent.parent
    try:
        return src_root.resolve().relative_to(root).as_posix()
    except ValueError:          # a --builtin folder outside the package: as given
        return str(src_root)
