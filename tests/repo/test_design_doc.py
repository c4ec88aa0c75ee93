"""docs/DESIGN.md's house plan is the code's: every folder and top-level module of autotune/ has its
row, in the tier tests/repo/test_layers.py enforces, and every path the page names exists."""
from __future__ import annotations

import re
from pathlib import Path

from tests.fakes.import_graph import PACKAGE, TIERS

DESIGN = PACKAGE.parent / "docs" / "DESIGN.md"


def table_tiers(text: str) -> dict[str, int]:
    """name -> tier, from the rows of the "Folders by role" table."""
    section = text.split("## Folders by role", 1)[1].split("\n## ", 1)[0]
    out = {}
    for row in re.findall(r"^\| (\d+) \| ([^|]+) \|", section, flags=re.M):
        for name in re.findall(r"`([^`]+)`", row[1]):
            key = "FAMILY_PACKAGES" if name == "families/<family>/" else name.removesuffix(".py").rstrip("/")
            out[key] = int(row[0])
    return out


def test_every_folder_and_top_module_has_its_row_in_the_tier_the_layers_test_enforces():
    rows = table_tiers(DESIGN.read_text())
    present = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    present.discard("__main__")
    assert present - set(rows) == set(), "folders without a row in DESIGN.md's table"
    tier_of = {name: i for i, tier in enumerate(TIERS) for name in tier}
    assert {n: t for n, t in rows.items() if tier_of.get(n) != t} == {}, "DESIGN.md and TIERS disagree"


def test_every_path_the_design_names_exists():
    text = DESIGN.read_text()
    found = re.finditer(r"(?<![/\w.])((?:autotune|tests|scripts|benchmarks|search_spaces)/[\w/.-]*\w)", text)
    named = {m.group(1) for m in found if text[m.end():m.end() + 1] != "<"}      # `.../sm<XY>.json`: a pattern
    root = PACKAGE.parent
    missing = sorted(p for p in named if "<" not in p and not (root / p).exists()
                     and not (root / f"{p}.py").exists())
    assert missing == []


def test_the_table_parser_reads_tiers_and_names():
    text = "## Folders by role\n\n| tier | folder | holds |\n|---|---|---|\n| 0 | `errors.py`, `fileio/` | x |\n" \
           "| 6 | `families/<family>/` | y |\n\n## Next\n| 9 | `other/` | z |\n"
    assert table_tiers(text) == {"errors": 0, "fileio": 0, "FAMILY_PACKAGES": 6}


def test_every_catalog_gpu_has_what_the_checklist_asks_for():
    """DESIGN.md's "A GPU model": a catalog row is all a known architecture needs, and a new architecture's
    section is in the search space."""
    from autotune.contract.spaces import load
    from autotune.gpus.catalog import CATALOG, SMEM_OPTIN
    from autotune.gpus.device import planned_gpu

    sections = set(load("triton_moe")["arch"])
    for gpu in CATALOG:
        assert gpu.sm in SMEM_OPTIN, gpu.name
        assert gpu.arch in sections, f"{gpu.name}: no {gpu.arch} section in search_spaces/triton_moe.yaml"
        dev = planned_gpu(gpu.name)
        assert (dev.sm, dev.smem_optin, dev.num_sms) == (gpu.sm, gpu.smem_optin, gpu.num_sms)
        assert dev.file_name == gpu.name.replace(" ", "_")


def long_or_wide(source: str) -> list[tuple[str, int, int]]:
    """(function, lines, parameters) of each function over 80 lines or 7 parameters (self/cls not counted)."""
    import ast

    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
            params -= bool(a.args and a.args[0].arg in ("self", "cls"))
            lines = n.end_lineno - n.lineno + 1
            if lines > 80 or params > 7:
                out.append((n.name, lines, params))
    return out


def test_no_function_is_over_80_lines_or_7_parameters():
    """What travels together is one value (a dataclass, the run's context), and a step fits on a screen."""
    found = {str(p.relative_to(PACKAGE.parent)): long_or_wide(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    assert {p: f for p, f in found.items() if f} == {}


def test_the_size_rule_finds_a_long_and_a_wide_function():
    wide = "def f(a, b, c, d, e, f, g, *h):\n    pass\nclass C:\n    def m(self, a, b, c, d, e, f, g):\n        pass\n"
    long = "def g():\n" + "    x = 1\n" * 80
    assert long_or_wide(wide) == [("f", 2, 8)]
    assert long_or_wide(long) == [("g", 81, 0)]
