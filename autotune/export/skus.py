"""The same tuned files under the names of other SKUs of the same chip.

SGLang matches `device_name` (torch.cuda.get_device_name(), spaces -> `_`) exactly: the RTX PRO 6000
Blackwell ships as Server Edition, Workstation Edition and Max-Q Workstation Edition, each its own
name and file. `--device-name NAME` writes every tuned file of the folder again under NAME, into the
same Triton folder, with a provenance entry that says it was measured on another SKU (clocks and
power limits differ between SKUs: a copy is a strong start, not a measurement).
"""
from __future__ import annotations

from autotune.fileio.writing import copy_file, sha256
from autotune.folder.tuned import TunedFolder
from autotune.fileio.names import DEVICE_NAME as PLAUSIBLE      # the one rule for a GPU's name, every reader's


class SkuError(ValueError):
    pass


def check_name(name: str) -> str:
    name = name.strip()
    if not PLAUSIBLE.fullmatch(name) or "  " in name:
        raise SkuError(f"--device-name {name!r} is not a plausible CUDA device name (as torch.cuda.get_device_name() "
                       "prints it, e.g. 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition')")
    return name


def copy_for_skus(tuned: TunedFolder) -> list[str]:
    """Write each of the tuned folder's files again under each of its SKU names; returns the files written."""
    measured_name = tuned.device.name
    prov = tuned.provenance() or {}
    ours = tuned.ours(prov)
    src_tag = f"device_name={measured_name.replace(' ', '_')}"
    written = []
    for name in tuned.sku_names:
        tag = f"device_name={name.replace(' ', '_')}"
        if tag == src_tag:
            continue
        for up, entry in list(prov.get("files", {}).items()):
            if src_tag not in up or entry.get("measured_on_sku"):
                continue                      # only files measured here are copied
            triton_dir = tuned.triton_dir(entry.get("triton"))
            new_up, new_down = up.replace(src_tag, tag), entry["down_file"].replace(src_tag, tag)
            for old, new in ((up, new_up), (entry["down_file"], new_down)):
                copy_file(triton_dir / old, triton_dir / new, ours=ours)
                written.append(str(triton_dir / new))
            prov["files"][new_up] = {**entry, "down_file": new_down, "device": name,
                                     "measured_on_sku": entry.get("device") or measured_name,
                                     "sku_note": "copied from a measurement on another SKU of the same chip",
                                     "sha256": {n: sha256(triton_dir / n) for n in (new_up, new_down)}}
    tuned.write_provenance(prov)
    return written
