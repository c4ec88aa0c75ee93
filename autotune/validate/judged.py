"""What a validation judged, recorded in its validation.json (`judged`) and checked by publish.

- `sha256`: every file of the tuned folder as validate read it, by its path in the folder (validate's
  own validation.json, report.md, validation.png and its raw-results folder aside): publish commits a
  folder only where its bytes are these, so a re-tuned, hand-edited or copied-into folder is never
  published on an earlier folder's gate.
- `measured_on`: how the folder's configs and choices were measured, as its provenance.json and
  backend_choice.json say: "gpu", or what else ("replay": a replay of recorded measurements, a labelled
  stand-in for a GPU). A replay folder is never published as GPU-validated.
- `validated_on`: where the validation's own numbers come from ("gpu", or "cpu-interpreter" for the
  harness under TRITON_INTERPRET=1, whose numbers mean nothing about speed).

`tree_sha256` also names the runs `validate --from-runs` judged (settings.runs_sha256), so a later
`--from-runs` can tell a validation of the same runs from one of others.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from autotune.fileio.reading import load_json, read_bytes
from autotune.folder.change import RAW_RUNS, VALIDATION_JSON, VALIDATE_OUTPUTS as OUTPUTS, folder_sha256  # noqa: F401
from autotune.folder.tuned import TunedFolder

GPU = "gpu"


def tree_sha256(path: str | Path) -> str:
    """One sha256 of a file's bytes, or of a folder's files (their paths and their bytes, all of them)."""
    p = Path(path)
    if p.is_file():
        return hashlib.sha256(read_bytes(p)).hexdigest()
    listing = "".join(f"{rel}\0{sha}\n" for rel, sha in folder_sha256(p, outputs_aside=False).items())
    return hashlib.sha256(listing.encode()).hexdigest()


def _json(path: Path):
    try:
        return load_json(path)
    except (OSError, ValueError):
        return None


def measured_on(folder: str | Path) -> str:
    """"gpu" where every measurement behind the folder's files was made on a GPU; otherwise the other
    kinds its provenance.json and backend_choice.json name ("replay", ...), or "unknown" where they
    name none."""
    folder = Path(folder)
    kinds = set()
    try:
        prov = TunedFolder(folder).provenance_as_written()
    except (OSError, ValueError):
        prov = None
    if isinstance(prov, dict):
        kinds.add((prov.get("device") or {}).get("kind") if isinstance(prov.get("device"), dict) else None)
        files = prov.get("files") if isinstance(prov.get("files"), dict) else {}
        kinds |= {e.get("measured_on") for e in files.values() if isinstance(e, dict)}
    choices = _json(folder / "backend_choice.json")
    if isinstance(choices, dict) and isinstance(choices.get("device"), dict):
        kinds.add(choices["device"].get("kind"))
    kinds = {str(k) for k in kinds if k is not None}
    if not kinds:
        return "unknown"
    return GPU if kinds == {GPU} else "+".join(sorted(kinds - {GPU}))


def snapshot(folder: str | Path) -> dict:
    """The folder as validate reads it before measuring: its files' sha256 and how they were measured."""
    return {"sha256": folder_sha256(folder), "measured_on": measured_on(folder)}


def differences(judged: dict[str, str], now: dict[str, str], most: int = 3) -> str:
    """'a changed, b not judged, c gone' (the first few of each), or '' where the two agree."""
    groups = (("changed", [p for p in now if p in judged and judged[p] != now[p]]),
              ("not judged", [p for p in now if p not in judged]),
              ("gone", [p for p in judged if p not in now]))
    parts = []
    for what, paths in groups:
        if paths:
            more = f" and {len(paths) - most} more" if len(paths) > most else ""
            parts.append(f"{', '.join(paths[:most])}{more} {what}")
    return "; ".join(parts)


def publish_problem(folder: str | Path, record: dict) -> str | None:
    """Why the folder is not what its validation.json judged on a GPU (None: it is)."""
    folder = Path(folder)
    path = folder / VALIDATION_JSON
    kind = measured_on(folder)
    if kind != GPU:
        return (f"{folder}'s configs were measured by {kind}, not on a GPU (its provenance says so): a {kind} "
                "folder is never published as GPU-validated")
    judged = record.get("judged")
    if not isinstance(judged, dict) or not isinstance(judged.get("sha256"), dict):
        return (f"{path} names no sha256 of the files it judged (made before validate recorded them): "
                "validate the folder again")
    if judged.get("validated_on") != GPU:
        return (f"{path} was measured on {judged.get('validated_on') or 'no recorded device'}, not a GPU: "
                "its gate says nothing about speed")
    diff = differences(judged["sha256"], folder_sha256(folder))
    if diff:
        return f"{path} judged other bytes than {folder} holds ({diff}): validate the folder as it is"
    return None
