"""A tuned folder is one handle (autotune/folder/tuned.py): the one module of autotune/ that names provenance.json
as a file (to read, parse or write it) and the one that holds the folder's change; every other module reaches
the folder through the handle it is given."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.fakes.import_graph import PACKAGE, modules

HANDLE = "autotune.folder.tuned"
FILE = "provenance.json"
NAMES = ("PROVENANCE", "PROVENANCE_OURS")       # the handle's own spelling of the file and of what makes it ours


def provenance_spellings(package: Path) -> dict[str, list[int]]:
    """module -> the lines where it names provenance.json as a file: a string that is the file's name or a path
    ending in it, or the handle's constants for it. A message that mentions the file among other words is
    prose, not a path."""
    out: dict = {}
    for mod, path in modules(package).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            hit = (isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and (node.value.strip() == FILE or node.value.endswith("/" + FILE)))
            hit |= isinstance(node, ast.Name) and node.id in NAMES
            hit |= isinstance(node, ast.Attribute) and node.attr in NAMES
            hit |= isinstance(node, ast.ImportFrom) and any(a.name in NAMES for a in node.names)
            if hit:
                out.setdefault(mod, []).append(node.lineno)
    return out


def test_provenance_json_is_named_as_a_file_in_the_handle_only():
    found = provenance_spellings(PACKAGE)
    assert HANDLE in found                    # the search reads the handle (not a renamed constant)
    assert {m: lines for m, lines in found.items() if m != HANDLE} == {}


def test_nothing_but_the_handle_holds_a_folder_change():
    """The change (lock, stage, swap) is the handle's: no module but the handle makes one."""
    import re

    makers = {m for m, path in modules(PACKAGE).items() if re.search(r"\bFolderChange\(", path.read_text())}
    assert makers == {HANDLE}


def test_the_search_finds_each_spelling_and_leaves_prose_alone(tmp_path):
    pkg = tmp_path / "toy"
    pkg.mkdir()
    files = {
        "__init__.py": "",
        "joins.py": 'def f(folder):\n    return folder / "provenance.json"\n',
        "formats.py": 'def f(folder):\n    return open(f"{folder}/provenance.json")\n',
        "imports.py": "from toy.handle import PROVENANCE_OURS\n",
        "attribute.py": "import toy.handle as h\nx = h.PROVENANCE\n",
        "prose.py": 'def f(name):\n    raise ValueError(f"{name} is listed in provenance.json but missing")\n',
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert provenance_spellings(pkg) == {"toy.joins": [2], "toy.formats": [2], "toy.imports": [1],
                                         "toy.attribute": [2]}
