"""The same tuned files under the names of other SKUs of the same chip.

SGLang matches `device_name` (torch.cuda.get_device_name(), spaces -> `_`) exactly: the RTX PRO 6000
Blackwell ships as Server Edition, Workstation Edition and Max-Q Workstation Edition, each its own
name and file. `--device-name NAME` writes every tuned file of the folder again under NAME, into the
same Triton folder, with a provenance entry that says it was measured on another SKU (clocks and
power limits differ between SKUs: a copy is a strong start, not a measurement).
"""
from __future__ import annotations

from pathlib import Path

from autotune.fileio.writing import copy_file, sha256, write_json
from autotune.fileio.names import DEVICE_NAME as PLAUSIBLE      # the one rule for a GPU's name, every reader's


class SkuError(ValueError):
    pass


def check_name(name: str) -> str:
    name = name.strip()
    if not PLAUSIBLE.fullmatch(name) or "  " in name:
        raise SkuError(f"--device-name {name!r} is not a plausible CUDA device name (as torch.cuda.get_device_name() "
                       "prints it, e.g. 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition')")
    return name


def copy_for_skus(device_folder: str | Path, measured_name: str, names: list[str]) -> list[str]:
    """Write each of the folder's tuned files again under each SKU name; returns the files written."""
    from autotune.folder.config_files import config_folder
    from autotune.folder.provenance import PROVENANCE, PROVENANCE_OURS, ours_in, read_folder_provenance

    folder = Path(device_folder)
    prov_path = folder / PROVENANCE
    prov = read_folder_provenance(folder) or {}
    ours = ours_in(prov, folder)
    src_tag = f"device_name={measured_name.replace(' ', '_')}"
    written = []
    for name in names:
        tag = f"device_name={name.replace(' ', '_')}"
        if tag == src_tag:
            continue
        for up, entry in list(prov.get("files", {}).items()):
            if src_tag not in up or entry.get("measured_on_sku"):
                continue                      # only files measured here are copied
            triton_dir = folder / config_folder(entry.get("triton"))
            new_up, new_down = up.replace(src_tag, tag), entry["down_file"].replace(src_tag, tag)
            for old, new in ((up, new_up), (entry["down_file"], new_down)):
                copy_file(triton_dir / old, triton_dir / new, ours=ours)
                written.append(str(triton_dir / new))
            prov["files"][new_up] = {**entry, "down_file": new_down, "device": name,
                                     "measured_on_sku": entry.get("device") or measured_name,
                                     "sku_note": "copied from a measurement on another SKU of the same chip",
                                     "sha256": {n: sha256(triton_dir / n) for n in (new_up, new_down)}}
    write_json(prov_path, prov, ours=PROVENANCE_OURS)
    return written
