"""What `autotune check` reads of a tuned folder's config files: each file listed in provenance.json
(the tuned files, their SKU copies, the shipped overlay) must be there, unchanged since export
(the sha256 provenance records), in the schema of SGLang's Triton config files, and loaded by
SGLang's own loader as the config the file holds (both the files' family's rules:
autotune.families.triton_moe.schema).

The names a provenance gives are joined to its folder to read, write, copy and remove files, so they
are checked where it is parsed: a tuned file's name (and its `_down` file's, and its Triton version,
a folder name) is a plain file name; an overlay file is a path of plain names inside the folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from autotune.fileio.writing import sha256
from autotune.fileio.names import DeviceName, PlainText, TritonVersion, Version, plain_text_problem
from autotune.measure.recording_header import KINDS
from autotune.contract import registry
from autotune.fileio.reading import first_error, load_json


def _printable(v: str) -> None:
    """A name SGLang writes is printable ASCII: a control character (a newline, a tab) split the lines
    autotune prints, and anything else is not one of its files."""
    if not (v.isascii() and v.isprintable()):
        raise ValueError(f"{v!r:.80} is not a plain file name (printable ASCII, no control character)")


def _plain_name(v: str) -> str:
    _printable(v)
    if v in ("", ".", "..") or any(c in v for c in "/\\"):
        raise ValueError(f"{v!r} is not a plain file name (no folder, no '..', not empty)")
    return v


def _inside_path(v: str) -> str:
    _printable(v)
    if any(part in ("", ".", "..") or "\\" in part for part in v.split("/")):
        raise ValueError(f"{v!r} is not a path inside the folder (plain names joined by '/', no '..', not absolute)")
    return v


FileName = Annotated[str, AfterValidator(_plain_name)]
InsidePath = Annotated[str, AfterValidator(_inside_path)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _version_value(v):
    """A recorded version: text ('' or '?' where a package has none), a flag (triton_tma) or a
    package's own record (flashinfer_metadata)."""
    why = None if v is None or isinstance(v, (bool, dict)) else plain_text_problem(v, 80)
    if why:
        raise ValueError(why)
    return v


# The versions a provenance records: python, torch, triton, sglang, ... by name.
Versions = dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")], Annotated[object, AfterValidator(_version_value)]]


class _Record(BaseModel):
    """A provenance record: the fields autotune reads are typed, the rest is kept as written."""
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class PerM(_Record):
    tuned_us: Optional[float] = None
    gate_up_us: Optional[float] = None
    down_us: Optional[float] = None
    default_us: Optional[float] = None
    shipped_us: Optional[float] = None
    source: Optional[PlainText] = None


class FileEntry(_Record):
    down_file: Optional[FileName] = None
    problem: Optional[dict] = None
    device: Optional[DeviceName] = None
    compute_capability: Optional[int] = None
    driver: Optional[PlainText] = None
    triton: Optional[TritonVersion] = None     # names its configs/triton_<version>/ folder
    measured_on: Optional[Literal[KINDS]] = None
    measured_on_sku: Optional[DeviceName] = None
    sglang_versions: Optional[list[Version]] = None
    sglang_targets: Optional[list[Version]] = None
    per_M: dict[str, PerM] = {}
    sha256: dict[FileName, Sha256] = {}
    versions: Versions = {}


class Overlay(_Record):
    sglang: Optional[Version] = None
    targets: list[Version] = []
    files: list[InsidePath] = []
    skipped: dict[InsidePath, PlainText] = {}
    sha256: dict[InsidePath, Sha256] = {}


class RecordedDevice(_Record):
    name: Optional[DeviceName] = None           # names the folder and branch publish writes
    sm: Optional[int] = None
    driver: Optional[PlainText] = None
    versions: Versions = {}


class Provenance(_Record):
    device: RecordedDevice = RecordedDevice()
    files: dict[FileName, FileEntry]
    shipped_overlay: Optional[Overlay] = None


class ChoiceDevice(_Record):
    name: DeviceName
    sm: int
    kind: str = "gpu"
    versions: dict = {}


class FamilyChoice(_Record):
    server_choice: dict[str, dict]
    chosen_mix: Optional[str] = None
    measured: dict = {}


class BackendChoices(_Record):
    """backend_choice.json (autotune.export.server_args)."""
    device: ChoiceDevice
    families: dict[str, FamilyChoice]
    checkpoint: Optional[str] = None




def choices_problem(doc) -> str | None:
    """Why `doc` is not a backend_choice.json autotune reads; None when it is."""
    return first_error(BackendChoices, doc)


def config_folder(triton) -> str:
    """The folder, relative to a device folder, SGLang looks in for configs made with `triton`."""
    return f"configs/triton_{'unknown' if triton is None else str(triton).replace('.', '_')}"


def listed_files(folder: Path, prov: dict) -> dict[str, tuple[Path, str | None, dict | None]]:
    """name -> (path, recorded sha256 or None, the tuned file's provenance entry; None: the overlay's)."""
    out = {}
    for up, entry in sorted(prov.get("files", {}).items()):
        if not isinstance(entry, dict):
            continue
        triton_dir = folder / config_folder(entry.get("triton"))
        hashes = entry.get("sha256") if isinstance(entry.get("sha256"), dict) else {}
        for name in (up, entry.get("down_file")):
            if isinstance(name, str):
                out[name] = (triton_dir / name, hashes.get(name), entry)
    overlay = prov.get("shipped_overlay") if isinstance(prov.get("shipped_overlay"), dict) else {}
    hashes = overlay.get("sha256") if isinstance(overlay.get("sha256"), dict) else {}
    for rel in overlay.get("files") or []:
        if isinstance(rel, str):
            out.setdefault(rel, (folder / rel, hashes.get(rel), None))
    return out


def files_family():
    """The family whose files a tuned folder's configs/ holds (the default config family): it reads them
    (`file_problem`, `loads`) and re-times them (`retime`) for `check`."""
    return registry.get(registry.default()).cls


def file_problems(folder: str | Path, prov: dict, loader=None) -> dict[str, str]:
    """name -> what is wrong with that listed file (absent: nothing). `loader(problem, path, doc)`
    asks SGLang's loader; None skips it."""
    files = files_family()

    folder = Path(folder)
    out = {}
    for name, (path, recorded, entry) in listed_files(folder, prov).items():
        if not path.is_file():
            out[name] = "listed in provenance.json but missing: re-export it"
            continue
        if recorded and sha256(path) != recorded:
            out[name] = "changed since export (its sha256 is not the one provenance.json recorded): re-export it"
            continue
        try:
            doc = load_json(path)
        except (OSError, ValueError) as e:
            out[name] = f"not valid JSON ({e}): SGLang's loader fails on it"
            continue
        why = files.file_problem(doc, entry, name)
        if why is None and loader is not None and entry is not None and name != entry.get("down_file"):
            why = loader(entry, path, doc)
        if why:
            out[name] = why
    return out
