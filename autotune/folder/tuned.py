"""A device's tuned folder as one handle: `TunedFolder`, opened once by each command that reads or writes one
and handed to every writer (the family's export and its after-export, the SKU copies, server_args.yaml and
FlashInfer's files, validate, publish).

The handle owns what makes the folder one product:
- its paths, and the words for them: while a change is open every path is in the staged copy
  (autotune.folder.change), and a message names the folder as the user gave it (`real`, `in_words`);
- provenance.json: this module is the only code that reads, parses or writes it (the writers' reader, which
  refuses a file that is not ours or not in our schema; `check`'s, which says why in `check`'s words; the
  tolerant one for readers that check each field themselves);
- the sha256 of every file the folder holds, recorded in provenance.json when a change is swapped in, and
  what `check` says of files another hand changed since;
- the change itself: one writer at a time, staged, swapped in whole or thrown away (`held`).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from autotune.errors import CheckError
from autotune.fileio.writing import FileFormatError, Files, claim, json_bytes, json_with, listed, read_json
from autotune.folder.change import FolderChange, folder_sha256

PROVENANCE = "provenance.json"
# Ours: a provenance.json in our format; a config file is ours where the folder's provenance lists it.
PROVENANCE_OURS = json_with("files")
OVERLAY = "shipped_overlay"
FOLDER_SHA256 = "folder_sha256"


class TunedFolder:
    """One device's tuned folder. `device`: the GPU whose files a command writes into it (None where a
    command only reads the folder); `sku_names`: the other names of that chip its tuned files are also
    written under (--device-name)."""

    def __init__(self, folder: str | Path, device=None, sku_names: tuple[str, ...] = ()):
        self.given = Path(folder)              # as the user named it: what messages show
        self.device = device
        self.sku_names = tuple(sku_names)
        self.change: FolderChange | None = None
        self.outcome: str | None = None        # after a change: why nothing changed, if so
        self.swapped = False                   # after a change: whether the folder now holds it

    @classmethod
    def under(cls, out: str | Path, device, sku_names: tuple[str, ...] = ()) -> "TunedFolder":
        """The folder of `device` under the output folder `out` (SGLang's name for the GPU)."""
        return cls(Path(out) / device.file_name, device, sku_names)

    # -- paths and the words for them ------------------------------------------------------------
    @property
    def path(self) -> Path:
        """Where this process reads and writes the folder: the staged copy while a change is open."""
        staging = self.change.staging if self.change is not None else None
        return staging if staging is not None else self.given

    @property
    def provenance_file(self) -> Path:
        return self.path / PROVENANCE

    def config_dir(self) -> Path:
        """SGLang's config folder for the configs this device's Triton makes."""
        return self.triton_dir(self.device.versions.get("triton"))

    def triton_dir(self, triton) -> Path:
        """SGLang's config folder for configs made with the Triton release `triton` (None: unknown)."""
        from autotune.folder.config_files import config_folder

        return self.path / config_folder(triton)

    def in_words(self, text: str) -> str:
        """A message with the staged copy's path as the folder's own (what the user knows)."""
        return self.change.in_words(text) if self.change is not None else text

    def real(self, path: str | Path) -> str:
        """A path as the user will find it once the change is in: inside the staged copy, the folder's own."""
        return self.in_words(str(path))

    # -- the change ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def held(self, record_hashes: bool = True):
        """Hold the folder for one command: locked now, staged by `begin()`, swapped in when the block ends
        without an error, thrown away when it raises or a write of it failed (`fail`). Afterwards `outcome`
        says why nothing changed, if so. `record_hashes`: provenance.json lists every file's sha256."""
        self.change = FolderChange(self.given, vouch=self.record_hashes if record_hashes else None).lock()
        try:
            yield self
        except BaseException:
            self._let_go()
            raise
        try:
            self.outcome = self.change.commit()
            self.swapped = self.change.swapped
        finally:
            self._let_go()

    def _let_go(self) -> None:
        self.change.release()
        self.change = None

    def begin(self) -> Path:
        """Stage a copy of the folder as it is now; from here every path of the folder means the copy."""
        return self.change.begin()

    def fail(self, why: str) -> None:
        """A write of the change failed: the change is thrown away at the end, whatever else succeeds."""
        if self.change is not None:
            self.change.fail(why)

    # -- provenance.json -------------------------------------------------------------------------
    def provenance(self) -> dict | None:
        """The writers' reader: the folder's provenance (None: none yet); NotOurs where a file of that name is
        not ours, FileFormatError where it is not in our schema."""
        path = self.provenance_file
        claim(path, PROVENANCE_OURS)
        prov = read_json(path, default=None)
        if prov is not None and not PROVENANCE_OURS(path):
            return None                           # forced over a file that was not ours: started afresh
        why = prov is not None and provenance_problem(prov)
        if why:
            raise FileFormatError(f"{path} is not autotune provenance ({why}); fix it, or move it away to start "
                                  "this folder afresh")
        return prov

    def write_provenance(self, prov: dict) -> None:
        from autotune.fileio import writing

        writing.write_json(self.provenance_file, prov, ours=PROVENANCE_OURS)

    def provenance_files(self, prov: dict) -> Files:
        """`prov` as this folder's provenance.json, for a writer that writes its files together (publish)."""
        return {self.provenance_file: (json_bytes(prov), PROVENANCE_OURS)}

    def recorded(self) -> dict:
        """`check`'s reader: the provenance of a folder autotune exported, else CheckError saying why not."""
        from autotune.fileio.reading import load_json

        folder, path = self.path, self.provenance_file
        if not folder.is_dir():
            raise CheckError(f"{folder} is not a folder")
        try:
            prov = load_json(path)
        except FileNotFoundError:
            raise CheckError(f"{folder} has no {PROVENANCE}: not a folder autotune exported") from None
        except (OSError, ValueError) as e:
            raise CheckError(f"{path} is not autotune provenance ({type(e).__name__}: {e})") from None
        why = provenance_problem(prov)
        if why:
            raise CheckError(f"{path} is not autotune provenance ({why}); fix it or re-export the folder")
        return prov

    def provenance_as_written(self):
        """The provenance's JSON as it is, for a reader that checks each field itself (None: no file;
        FileFormatError: not JSON)."""
        return read_json(self.provenance_file, default=None)

    def has_provenance(self) -> bool:
        return self.provenance_file.is_file()

    def provenance_is_ours(self) -> bool:
        return PROVENANCE_OURS(self.provenance_file)

    def ours(self, prov: dict | None):
        """The files `prov` (this folder's provenance) calls ours, each at the one place it lists: tuned files
        in their Triton folder, their SKU copies, the overlay's copies."""
        from autotune.folder.config_files import listed_files

        folder = self.path
        paths = [path for path, _, _ in listed_files(folder, prov or {}).values()]
        return listed([p.relative_to(folder).as_posix() for p in paths if folder in p.parents], folder)

    # -- the files' hashes -----------------------------------------------------------------------
    def vouched_hashes(self) -> dict:
        """{path in the folder: sha256} of every file autotune vouches for: all but provenance.json itself and
        validate's own outputs (a validation names the bytes it judged, provenance.json among them)."""
        return {rel: sha for rel, sha in folder_sha256(self.path).items() if rel != PROVENANCE}

    def record_hashes(self) -> None:
        """Write into the staged provenance.json the sha256 of every file of the change, so `check` can tell a
        file changed, added or removed by another hand from what autotune wrote."""
        prov = self.provenance()
        if prov is None:
            return
        prov[FOLDER_SHA256] = self.vouched_hashes()
        self.write_provenance(prov)

    def unvouched(self, prov: dict) -> list[tuple[str, str]]:
        """What `check` says of files provenance.json's folder_sha256 does not vouch for: added, changed or
        removed since autotune wrote the folder (empty where provenance records no such list)."""
        recorded = prov.get(FOLDER_SHA256)
        if not isinstance(recorded, dict):
            return []
        now = self.vouched_hashes()
        out = [(rel, f"not written by autotune ({PROVENANCE} does not list it)"
                + (": SGLang would load it unchecked" if rel.startswith("configs/") else ""))
               for rel in sorted(now.keys() - recorded.keys())]
        out += [(rel, f"changed since autotune wrote it (its sha256 is not the one {PROVENANCE} records)")
                for rel in sorted(now.keys() & recorded.keys()) if now[rel] != recorded[rel]]
        out += [(rel, "written by autotune but missing") for rel in sorted(recorded.keys() - now.keys())]
        return out


def provenance_problem(doc) -> str | None:
    """Why `doc` is not a provenance.json autotune reads; None when it is."""
    from autotune.fileio.reading import first_error
    from autotune.folder.config_files import Provenance

    return first_error(Provenance, doc)


def tuned_names(prov: dict) -> set[str]:
    """The files a provenance calls ours: each tuned file and its `_down` file."""
    names = set()
    for up, entry in prov.get("files", {}).items():
        names.add(up)
        if entry.get("down_file"):
            names.add(entry["down_file"])
    return names


def nested_problem(out: str | Path, flag: str = "--out") -> str | None:
    """Why `out` cannot hold device folders: it is itself a tuned folder (its provenance.json is ours).
    `run --out out/NVIDIA_H200` wrote out/NVIDIA_H200/NVIDIA_H200/, and SGLang pointed at out/NVIDIA_H200
    kept loading the old files."""
    out = Path(out)
    if (out / PROVENANCE).is_file() and PROVENANCE_OURS(out / PROVENANCE):
        return (f"{flag} {out} is itself a tuned folder (it holds {PROVENANCE}); {flag} names the folder that "
                f"holds the device folders: {out.parent}")
    return None
