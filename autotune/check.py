"""`autotune check FOLDER`: will this tuned folder load and run in the SGLang that serves it?

Reads the folder's provenance.json (written by export) and compares, file by file, the SGLang
releases each file is valid for (`sglang_versions`, autotune.sglang_versions) with the release
installed here or named by --sglang-version. Exit 0: every file runs there; 1: some file does
not (listed, with the release it needs); 2: bad input (no folder, no provenance, a provenance
without version records, an unsupported release).
"""
from __future__ import annotations

import json
from pathlib import Path

from .sglang_versions import VersionError, parse_targets

FRESH, DRIFTED = 0, 1


class CheckError(ValueError):
    pass


def check_folder(folder: str | Path, version_spec: str | None) -> tuple[int, list[str]]:
    folder = Path(folder)
    prov_path = folder / "provenance.json"
    if not folder.is_dir():
        raise CheckError(f"{folder} is not a folder")
    try:
        prov = json.loads(prov_path.read_text())
        files = prov["files"]
        if not isinstance(files, dict):
            raise TypeError
    except FileNotFoundError:
        raise CheckError(f"{folder} has no provenance.json: not a folder autotune exported") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise CheckError(f"{prov_path} is not autotune provenance ({type(e).__name__})") from None
    try:
        targets = parse_targets(version_spec)
    except VersionError as e:
        raise CheckError(str(e)) from None
    lines, bad = [], 0
    for name, entry in sorted(files.items()):
        valid = entry.get("sglang_versions")
        if not isinstance(valid, list):
            raise CheckError(f"{prov_path}: {name} records no SGLang versions (exported before version "
                             "provenance): re-export it with --sglang-version")
        missing = [v for v in targets if v not in valid]
        if missing:
            bad += 1
            lines.append(f"{name}: does not run in SGLang {', '.join(missing)} (runs in {', '.join(valid) or 'none'}); "
                         f"re-export with --sglang-version {missing[0]}")
        else:
            lines.append(f"{name}: runs in SGLang {', '.join(targets)}")
    return (DRIFTED if bad else FRESH), lines
