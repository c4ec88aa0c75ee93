"""Bad input to `autotune run`: one line on stderr, exit 2, no traceback, no file that existed changed."""
import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import GRID

ROOT = Path(__file__).resolve().parent.parent
RUN = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe", "--quiet"]


def run(tmp_path, *extra):
    p = subprocess.run([sys.executable, "-m", "autotune.cli", *RUN, "--out", str(tmp_path / "out"),
                        "--storage", f"sqlite:///{tmp_path / 'a.db'}", *extra],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    return p.returncode, p.stderr.strip().splitlines()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("extra,says", [
    (["--batch-sizes", "1,1,8,8"], "lists a value twice"),
    (["--neighbours", "-1"], "--neighbours must be at least 0"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--trials", "0"], "--trials must be at least 1"),
    (["--replay", f"{GRID},"], "empty name"),
])
def test_bad_flags(tmp_path, extra, says):
    if "--replay" not in extra:
        extra = [*extra, "--replay", str(GRID)]
    rc, err = run(tmp_path, "--batch-sizes", "8", *extra) if "--batch-sizes" not in extra else run(tmp_path, *extra)
    assert rc == 2 and len(err) == 1 and says in err[0] and "Traceback" not in "\n".join(err), err
    assert not list((tmp_path / "out").rglob("*.json"))


def test_record_never_overwrites_a_file_that_is_not_this_gpus_cache(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a cache\n")
    other = tmp_path / "other_gpu.jsonl.gz"
    with gzip.open(other, "wt") as f:
        f.write(json.dumps({"kind": "autotune-measurement-cache", "version": 1,
                            "device": {"name": "NVIDIA B200", "sm": 100}, "problems": {}, "notes": {}}) + "\n")
    before = {p: digest(p) for p in (notes, other)}
    for path, says in ((notes, "refusing to overwrite it"), (other, "holds measurements of NVIDIA B200")):
        rc, err = run(tmp_path, "--batch-sizes", "8", "--replay", str(GRID), "--record", str(path))
        assert rc == 2 and len(err) == 1 and says in err[0], err
    assert {p: digest(p) for p in (notes, other)} == before
