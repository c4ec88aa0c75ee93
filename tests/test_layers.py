"""The import graph of autotune/, read from the source (ast), every import counted wherever it
stands (a function-local import, one under TYPE_CHECKING): the layers hold.

- no import circle: the modules form a graph with no cycle (a strongly connected component of two
  or more modules is one);
- no module imports a private (underscore) name of another module, nor reaches one through a name it
  imported (`Family._helper`): what is shared is public where it lives;
- kernels/ (what runs on the GPU: families, runners, SGLang's layers, FlashInfer's cache keys)
  imports nothing from export/ or validate/ (the steps after it);
- validate/ (the end-to-end check of a tuned folder) is imported only by what comes after it (publish)
  and the command line: the tuning steps (search, selection, the layer check, `check`) never reach it;
- nothing below the command line imports cli*.py: the CLI parses and prints on top of the library.
The checks are run on a planted package too, so each one is known to fail where it should.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"


def modules(package: Path) -> dict[str, Path]:
    """dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _owner(name: str, mods: dict) -> str | None:
    """The module a dotted name lives in (the name itself, or its longest module prefix)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _base(mod: str, mods: dict, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    pkg = mod if mods[mod].name == "__init__.py" else mod.rpartition(".")[0]
    parts = pkg.split(".")
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def read_graph(package: Path) -> tuple[dict, list]:
    """(module -> modules it imports, [(module, imported module, private name)])."""
    mods = modules(package)
    root = package.name
    edges: dict = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        bound = {}                          # local name -> (module it came from, the name there)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == root:
                        target = _owner(a.name, mods)
                        if target:
                            edges[mod].add(target)
                            bound[a.asname or a.name.split(".")[0]] = (target, None)
            elif isinstance(node, ast.ImportFrom):
                base = _base(mod, mods, node)
                if base.split(".")[0] != root:
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    target = full if full in mods else _owner(base, mods)
                    if target is None:
                        continue
                    edges[mod].add(target)
                    bound[a.asname or a.name] = (target, None if full in mods else a.name)
                    if full not in mods and a.name.startswith("_") and target != mod:
                        private.append((mod, target, a.name))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                target, name = bound[node.value.id]
                if target != mod:
                    private.append((mod, target, f"{name + '.' if name else ''}{node.attr}"))
        edges[mod].discard(mod)
    return edges, private


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


def is_cli(module: str) -> bool:
    """autotune/cli*.py (the command line), in any package name."""
    return module.rpartition(".")[2].startswith("cli") and module.count(".") == 1


def cli_importers(edges: dict, root: str) -> list[tuple[str, str]]:
    return sorted((m, t) for m, ts in edges.items() if not is_cli(m) and m != f"{root}.__main__"
                  for t in ts if is_cli(t))


def test_autotune_has_no_import_circle():
    edges, _ = read_graph(PACKAGE)
    assert len(edges) > 50          # the package was read, not an empty folder
    assert cycles(edges) == []


def test_no_module_imports_a_private_name_of_another():
    _, private = read_graph(PACKAGE)
    assert private == []


def test_kernels_import_nothing_from_export_or_validate():
    edges, _ = read_graph(PACKAGE)
    assert crossings(edges, "autotune.families.protocol", ("autotune.export", "autotune.validate")) == []


def test_only_publish_and_the_command_line_import_validate():
    edges, _ = read_graph(PACKAGE)
    reach = crossings(edges, "autotune", ("autotune.validate",))
    assert [(m, t) for m, t in reach if not m.startswith("autotune.validate.") and not is_cli(m)
            and m != "autotune.publish"] == []


def test_only_the_command_line_imports_the_command_line():
    edges, _ = read_graph(PACKAGE)
    assert cli_importers(edges, "autotune") == []


def test_the_checks_find_what_is_planted(tmp_path):
    """A toy package with one of each fault: each check reports exactly it."""
    pkg = tmp_path / "toy"
    (pkg / "kernels").mkdir(parents=True)
    (pkg / "export").mkdir()
    files = {
        "a.py": "from .b import thing\n",
        "b.py": "def thing():\n    from . import a  # a lazy import closes the circle too\n",
        "c.py": "from .d import _hidden\nfrom .d import Shown\nShown._helper()\n",
        "d.py": "_hidden = 1\nclass Shown:\n    _helper = staticmethod(lambda: 0)\n",
        "kernels/__init__.py": "",
        "kernels/k.py": "from ..export.e import write\n",
        "export/__init__.py": "",
        "export/e.py": "write = print\n",
        "low.py": "from .cli import main\n",
        "cli.py": "from .low import main as _m\nmain = print\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    edges, private = read_graph(pkg)
    assert cycles(edges) == [["toy.a", "toy.b"], ["toy.cli", "toy.low"]]
    assert sorted(private) == [("toy.c", "toy.d", "Shown._helper"), ("toy.c", "toy.d", "_hidden")]
    assert crossings(edges, "toy.kernels", ("toy.export", "toy.validate")) == [("toy.kernels.k", "toy.export.e")]
    assert cli_importers(edges, "toy") == [("toy.low", "toy.cli")]
