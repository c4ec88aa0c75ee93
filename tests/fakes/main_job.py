"""README's main job: its arguments, a run of it, what it wrote (times masked, storage rows), the recording's check."""
from __future__ import annotations

import difflib
import gzip
import json
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/data/readme_main_job.json.gz"
# Two runs of one commit differ only here (checked with two runs of e947a93 side by side).
ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:\+00:00|Z)?")
WALL = re.compile(r'"wall_seconds": [0-9.]+')
STAMPED = ("provenance.json", "backend_choice.json", "server_args.yaml")
STAMPED_HASH = re.compile(r'("(?:[^"]*/)?(?:' + "|".join(map(re.escape, STAMPED)) + r')"): "[0-9a-f]{64}"')
VOLATILE_COLUMNS = {"trials": {"datetime_start", "datetime_complete"}, "trial_heartbeats": {"heartbeat"}}


def main_job() -> list[str]:
    """The arguments of README's first `autotune run` line."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if "autotune run" in line and "--replay" in line:
            return shlex.split(line.split("autotune run", 1)[1].split("#")[0])
    raise AssertionError("README.md has no main job (an `autotune run ... --replay` line)")


def run_main_job(folder: Path) -> str:
    """The job in `folder` (its recordings linked in at README's relative paths); returns stdout."""
    args = main_job()
    replay = args[args.index("--replay") + 1].split(",")
    for rel in replay:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).symlink_to(ROOT / rel)
    out = subprocess.run([sys.executable, "-m", "autotune", "run", *args], cwd=folder, capture_output=True,
                         text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-4000:]
    # a warning (SGLang's own `auto` unknown here, say) changes what the run writes: said as itself
    assert [ln for ln in out.stderr.splitlines() if ln.startswith("autotune: ")] == [], out.stderr[-4000:]
    for rel in replay:
        (folder / rel).unlink()
    return out.stdout


def storage_rows(db: Path) -> dict:
    """Every table of the SQLite storage, its rows in primary-key order, volatile columns left out."""
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        out = {}
        for t in tables:
            cols = [c[1] for c in con.execute(f"PRAGMA table_info({t})") if c[1] not in VOLATILE_COLUMNS.get(t, ())]
            rows = [list(r) for r in con.execute(f"SELECT {', '.join(cols)} FROM {t} ORDER BY rowid")]
            if t == "study_user_attributes":
                key, value = cols.index("key"), cols.index("value_json")
                rows = [r[:value] + ['"<opened>"'] + r[value + 1:] if r[key] == "opened" else r for r in rows]
            out[t] = {"columns": cols, "rows": rows}
        return out
    finally:
        con.close()


def outputs(folder: Path, stdout: str) -> dict:
    """path -> text of everything the job wrote (timestamps masked), the storage and stdout."""
    files = {}
    for p in sorted((folder / "tuned_configs").rglob("*")):
        if p.is_file():
            text = p.read_text()
            if p.name in STAMPED:
                text = WALL.sub('"wall_seconds": <wall>', ISO_TIME.sub("<time>", text))
                # provenance's hash of every file: a stamped file's changes with its time
                text = STAMPED_HASH.sub(r'\1: "<sha256 of a stamped file>"', text)
            files[str(p.relative_to(folder))] = text
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    return {"written": written, "files": files, "storage": storage_rows(folder / "autotune.db"), "stdout": stdout}


def _diff(a: str, b: str, name: str) -> str:
    return "\n".join(list(difflib.unified_diff(a.splitlines(), b.splitlines(), f"recorded {name}", f"now {name}",
                                               lineterm=""))[:60])


def assert_as_recorded(got: dict) -> None:
    """`got` (outputs()) is what the recording holds: files, stdout and storage rows."""
    want = json.loads(gzip.decompress(GOLDEN.read_bytes()))
    assert got["written"] == want["written"]
    for name, text in want["files"].items():
        assert got["files"][name] == text, _diff(text, got["files"][name], name)
    assert got["stdout"] == want["stdout"], _diff(want["stdout"], got["stdout"], "stdout")
    for table, rec in want["storage"].items():
        now = got["storage"][table]
        assert now["columns"] == rec["columns"], table
        first = next((i for i, (a, b) in enumerate(zip(rec["rows"], now["rows"])) if a != b), None)
        assert first is None and len(now["rows"]) == len(rec["rows"]), (
            f"{table}: {len(rec['rows'])} rows recorded, {len(now['rows'])} now; first difference at row {first}: "
            f"{rec['rows'][first] if first is not None else '-'} != {now['rows'][first] if first is not None else '-'}")
    assert set(got["storage"]) == set(want["storage"])
