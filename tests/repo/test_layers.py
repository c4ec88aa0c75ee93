"""The import graph of autotune/, read from the source (ast), every import counted wherever it
stands (a function-local import, one under TYPE_CHECKING): the house plan of docs/DESIGN.md holds.

- no import circle, between modules or between packages (a folder of autotune/ is one package; each
  family package under families/ is its own);
- each package imports only packages of its own tier or a lower one (TIERS, bottom first): the
  steps never import the pipeline, the core (measure, store, search) reaches a family only through the
  registry and protocol of contract/, and the family packages (families/) are plugins above the core;
- SGLang, FlashInfer and sgl_kernel are imported only by adapters/ and the family packages (a family's
  kernel and its declared runners), and a private (underscore) name of theirs only by adapters/;
- no module imports a private (underscore) name of another module, nor reaches one through a name it
  imported (`Family._helper`): what is shared is public where it lives;
- validate/ (the end-to-end check of a tuned folder) is imported only by publish/ and the commands
  (folder_commands, cli/): the tuning steps never reach it;
- nothing below the command line imports cli/: the CLI parses and prints on top of the library.
The checks are run on a planted package too, so each one is known to fail where it should.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.fakes.import_graph import PACKAGE, TIERS, modules, read_graph


def cycles(edges: dict) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def crossings(edges: dict, below: str, above: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, imported) where a module under `below` imports one under any of `above`."""
    def under(m, p):
        return m == p or m.startswith(p + ".")
    return sorted((m, t) for m, ts in edges.items() if under(m, below) for t in ts if any(under(t, a) for a in above))


EXTERNAL = ("sglang", "flashinfer", "sgl_kernel")     # their internals: adapters/ and the family packages only


def package_of(module: str, package: Path) -> str:
    """The package a module counts in: its folder under the root, a family package under families/,
    or the top-level module itself."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "families" and (package / "families" / parts[2]).is_dir():
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def package_graph(edges: dict, package: Path) -> dict:
    out: dict = {}
    for m, ts in edges.items():
        a = package_of(m, package)
        out.setdefault(a, set())
        out[a] |= {package_of(t, package) for t in ts} - {a}
    return out


def tier_of(pkg: str, tiers: tuple = TIERS) -> int:
    parts = pkg.split(".")
    name = "FAMILY_PACKAGES" if len(parts) == 3 and parts[1] == "families" else parts[1]
    for i, tier in enumerate(tiers):
        if name in tier:
            return i
    raise AssertionError(f"{pkg} is in no tier of TIERS: place it (and say why in docs/DESIGN.md)")


def upward(edges: dict, package: Path, tiers: tuple = TIERS) -> list[tuple[str, str]]:
    """(package, imported package) where a package imports one of a higher tier."""
    g = package_graph(edges, package)
    return sorted((a, b) for a, bs in g.items() for b in bs if tier_of(b, tiers) > tier_of(a, tiers))


def external_imports(package: Path) -> list[tuple[str, str]]:
    """(module, what) for every import of SGLang, FlashInfer or sgl_kernel where the plan does not allow
    it: outside adapters/ and the family packages, or a private name of theirs outside adapters/."""
    out = []
    for mod, path in modules(package).items():
        pkg = package_of(mod, package)
        in_adapters = pkg == f"{package.name}.adapters"
        in_family = pkg.count(".") == 2
        tree = ast.parse(path.read_text(), str(path))
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [(a.name, a.asname or a.name.split(".")[0]) for a in node.names]
                found = [(n, b) for n, b in names if n.split(".")[0] in EXTERNAL]
                aliases |= {b for _, b in found}
                what = [n for n, _ in found]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in EXTERNAL:
                aliases |= {a.asname or a.name for a in node.names}
                what = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for w in what:
                private = any(p.startswith("_") and not p.startswith("__") for p in w.split("."))
                if not in_adapters and (not in_family or private):
                    out.append((mod, w))
        for node in ast.walk(tree):
            if (not in_adapters and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__")):
                out.append((mod, f"{node.value.id}.{node.attr}"))
    return sorted(set(out))


def is_cli(module: str) -> bool:
    """autotune/cli/ (the command line), in any package name."""
    parts = module.split(".")
    return len(parts) >= 2 and parts[1] == "cli"


def cli_importers(edges: dict, root: str) -> list[tuple[str, str]]:
    return sorted((m, t) for m, ts in edges.items() if not is_cli(m) and m != f"{root}.__main__"
                  for t in ts if is_cli(t))


def validate_importers(edges: dict, root: str) -> list[tuple[str, str]]:
    allowed = (f"{root}.validate", f"{root}.publish", f"{root}.folder_commands", f"{root}.cli")
    return [(m, t) for m, t in crossings(edges, root, (f"{root}.validate",))
            if not any(m == a or m.startswith(a + ".") for a in allowed)]


def test_autotune_has_no_import_circle():
    edges, _ = read_graph(PACKAGE)
    assert len(edges) > 50          # the package was read, not an empty folder
    assert cycles(edges) == []


def test_packages_have_no_import_circle():
    edges, _ = read_graph(PACKAGE)
    g = package_graph(edges, PACKAGE)
    assert len(g) > 15
    assert cycles(g) == []


def test_every_package_imports_only_its_tier_and_below():
    edges, _ = read_graph(PACKAGE)
    assert upward(edges, PACKAGE) == []


def test_sglang_and_flashinfer_are_reached_only_through_adapters_and_the_family_packages():
    assert external_imports(PACKAGE) == []


def test_no_module_imports_a_private_name_of_another():
    _, private = read_graph(PACKAGE)
    assert private == []


def test_only_publish_and_the_commands_import_validate():
    edges, _ = read_graph(PACKAGE)
    assert validate_importers(edges, "autotune") == []


def test_only_the_command_line_imports_the_command_line():
    edges, _ = read_graph(PACKAGE)
    assert cli_importers(edges, "autotune") == []


def test_the_checks_find_what_is_planted(tmp_path):
    """A toy package with one of each fault: each check reports exactly it."""
    pkg = tmp_path / "toy"
    for d in ("families/fam", "contract", "export", "measure", "adapters", "cli", "validate", "search"):
        (pkg / d).mkdir(parents=True)
    files = {
        "a.py": "from .b import thing\n",
        "b.py": "def thing():\n    from . import a  # a lazy import closes the circle too\n",
        "c.py": "from .d import _hidden\nfrom .d import Shown\nShown._helper()\n",
        "d.py": "_hidden = 1\nclass Shown:\n    _helper = staticmethod(lambda: 0)\n",
        "families/__init__.py": "",
        "contract/__init__.py": "",
        "contract/registry.py": "from toy.measure.m import x\n",          # a tier up: contract -> measure
        "families/fam/__init__.py": "from flashinfer.gemm import mm_fp4\nfrom flashinfer.autotuner import _json\n",
        "measure/__init__.py": "",
        "measure/m.py": "import sglang.srt.utils as su\nx = su._private\n",
        "search/__init__.py": "",
        "search/s.py": "from toy.validate.v import judge\nfrom toy.export.e import write\n",
        "export/__init__.py": "",
        "export/e.py": "from toy.search.s import judge\nwrite = print\n",
        "validate/__init__.py": "",
        "validate/v.py": "judge = print\n",
        "adapters/__init__.py": "",
        "adapters/ad.py": "from flashinfer.autotuner import _json_to_tactic\n",
        "cli/__init__.py": "from toy.low import main as _m\nmain = print\n",    # fine: the cli is on top
        "low.py": "from toy.cli import main\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    edges, private = read_graph(pkg)
    assert cycles(edges) == [["toy.a", "toy.b"], ["toy.cli", "toy.low"], ["toy.export.e", "toy.search.s"]]
    assert ["toy.export", "toy.search"] in cycles(package_graph(edges, pkg))
    tiers = (("a", "b", "c", "d", "low"), *TIERS)
    assert upward(edges, pkg, tiers) == [("toy.contract", "toy.measure"), ("toy.low", "toy.cli"),
                                         ("toy.search", "toy.export"), ("toy.search", "toy.validate")]
    assert sorted(private) == [("toy.c", "toy.d", "Shown._helper"), ("toy.c", "toy.d", "_hidden")]
    assert external_imports(pkg) == [("toy.families.fam", "flashinfer.autotuner._json"),
                                     ("toy.measure.m", "sglang.srt.utils"), ("toy.measure.m", "su._private")]
    assert validate_importers(edges, "toy") == [("toy.search.s", "toy.validate.v")]
    assert cli_importers(edges, "toy") == [("toy.low", "toy.cli")]
