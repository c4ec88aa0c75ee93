"""The package as a user installs it: a built wheel in a fresh virtual environment, and every
third-party package autotune imports declared in its metadata."""
import ast
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow      # builds a wheel and a fresh venv

# import name -> the distribution that provides it (as declared in pyproject.toml)
DISTRIBUTION = {"yaml": "pyyaml", "sqlalchemy": "sqlalchemy", "flashinfer": "flashinfer-python",
                "sgl_kernel": "sglang",     # sgl_kernel comes with sglang (its sglang-kernel dependency)
                "pynvml": "nvidia-ml-py"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    import shutil

    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src")
    # built from a copy: setuptools leaves build/ and autotune.egg-info/ in the tree it builds, and the
    # tests never write into the checkout (tests/conftest.py)
    for name in ("pyproject.toml", "README.md", "autotune", "search_spaces"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                    "-w", str(out)], check=True, capture_output=True, timeout=300)
    return next(out.glob("autotune-*.whl"))


def third_party_imports() -> set[str]:
    stdlib = set(sys.stdlib_module_names)
    names = set()
    for path in (ROOT / "autotune").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in stdlib and n not in ("autotune", "__future__")}


def declared(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    return {r.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower() for r in reqs}


def test_every_imported_package_is_declared(wheel):
    missing = {n for n in third_party_imports() if DISTRIBUTION.get(n, n).lower() not in declared(wheel)}
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


def test_the_wheel_carries_its_search_spaces_and_runs_in_a_fresh_venv(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "autotune/search_spaces/triton_moe.yaml" in names
    assert "autotune/search_spaces/compiled/sm120.json" in names
    venv = tmp_path / "venv"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}     # a checkout there would be imported
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # The dependencies come from the test environment's site-packages, added as a plain path: its
    # .pth files (the editable install of this checkout among them) are not read from there, so
    # `autotune` can only be the installed wheel.
    site = Path(subprocess.check_output([str(venv / "bin/python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True, env=clean).strip())
    (site / "test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300, env=clean)
    where = subprocess.check_output([str(venv / "bin/python"), "-c", "import autotune.contract.spaces as s; print(s.SPACES_DIR)"],
                                    cwd=tmp_path, text=True, env=clean).strip()
    assert where.startswith(str(site)), where
    p = subprocess.run([str(venv / "bin/autotune"), "shapes", "--shapes", "qwen3.5", "--target-sm", "120"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean)
    assert p.returncode == 0, p.stderr
    assert "27 fused-MoE problems" in p.stdout
    assert "sm120: shared memory exact, compiled with Triton 3.8.0" in p.stdout    # the record inside the wheel
