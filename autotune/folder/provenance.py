"""A tuned device folder's provenance.json: which files in it are ours (the tuned files with their
`_down` files, their SKU copies, the shipped overlay's copies), read where every export step starts."""
from __future__ import annotations

from pathlib import Path

from autotune.fileio.writing import FileFormatError, claim, json_with, listed, read_json

PROVENANCE = "provenance.json"
# Ours: a provenance.json in our format; a config file is ours where the folder's provenance lists it.
PROVENANCE_OURS = json_with("files")
OVERLAY = "shipped_overlay"


def tuned_names(prov: dict) -> set[str]:
    """The files a provenance.json calls ours: each tuned file and its `_down` file."""
    names = set()
    for up, entry in prov.get("files", {}).items():
        names.add(up)
        if entry.get("down_file"):
            names.add(entry["down_file"])
    return names


def read_folder_provenance(device_folder: str | Path) -> dict | None:
    """A device folder's provenance.json (None: none yet); NotOurs where a file of that name is not ours."""
    path = Path(device_folder) / PROVENANCE
    claim(path, PROVENANCE_OURS)
    prov = read_json(path, default=None)
    if prov is not None and not PROVENANCE_OURS(path):
        return None                           # forced over a file that was not ours: started afresh
    from autotune.folder.config_files import provenance_problem
    why = prov is not None and provenance_problem(prov)
    if why:
        raise FileFormatError(f"{path} is not autotune provenance ({why}); fix it, or move it away to start "
                              "this folder afresh")
    return prov


def ours_in(prov: dict | None, device_folder: str | Path):
    """The files a device folder's provenance calls ours, each at the one place it lists: tuned files
    in their Triton folder, their SKU copies, the overlay's copies."""
    from autotune.folder.config_files import listed_files

    folder = Path(device_folder)
    paths = [path for path, _, _ in listed_files(folder, prov or {}).values()]
    return listed([p.relative_to(folder).as_posix() for p in paths if folder in p.parents], folder)


def nested_problem(out: str | Path, flag: str = "--out") -> str | None:
    """Why `out` cannot hold device folders: it is itself a tuned folder (its provenance.json is ours).
    `run --out out/NVIDIA_H200` wrote out/NVIDIA_H200/NVIDIA_H200/, and SGLang pointed at out/NVIDIA_H200
    kept loading the old files."""
    out = Path(out)
    if (out / PROVENANCE).is_file() and PROVENANCE_OURS(out / PROVENANCE):
        return (f"{flag} {out} is itself a tuned folder (it holds {PROVENANCE}); {flag} names the folder that "
                f"holds the device folders: {out.parent}")
    return None
