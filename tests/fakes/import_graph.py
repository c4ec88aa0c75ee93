"""autotune/'s import graph read from its source (ast): modules, their imports, private names reached, tiers."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "autotune"


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


@functools.cache              # one reading of the tree for every check of this session
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


# Bottom first. A package may import its own tier and those below; DESIGN.md's table says why each
# sits where it does. "contract" is the registry, the protocol and what every family shares (its
# runners' discovery, spaces, the backend-family machinery); FAMILY_PACKAGES are the families, "families"
# the folder that holds them.
TIERS = (
    ("errors", "stops", "programs", "fileio", "numerics"),
    ("gpus", "problems"),
    ("adapters",),
    ("contract",),
    ("measure", "store"),
    ("search",),
    ("folder",),
    ("export",),
    ("families", "FAMILY_PACKAGES"),
    ("run", "validate", "publish"),
    ("api", "folder_commands"),
    ("cli", "__main__"),
)
