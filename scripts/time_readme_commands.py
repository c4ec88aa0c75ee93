#!/usr/bin/env python3
"""Times the two commands at the top of README.md on a fresh clone, as a new user runs them.

    python3 scripts/time_readme_commands.py [--results benchmarks/results/readme_timings.json]

Clones this repository's HEAD into a temporary folder, takes the commands from README's first
```bash block (each is `bash scripts/setup.sh && COMMAND`), and runs them in order: setup then
the main job, setup again (a no-op by then) then the quick tests; each part is timed apart. An
empty AUTOTUNE_CACHE_DIR stands for a new machine; AUTOTUNE_TEST_POSTGRES is unset (the
PostgreSQL tests are skipped, as README says for a local run). One run is appended to the results
file with the date, the commit, the core count and the load average before and after (the machine
may be shared). tests/repo/test_readme_figures.py checks that README quotes what that file holds.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP = "bash scripts/setup.sh"


def readme_commands(readme: Path) -> list[str]:
    """The commands of README's first bash block, in order, comments dropped."""
    block = re.search(r"```bash\n(.*?)```", readme.read_text(), re.S).group(1)
    return [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _timed(cmd: str, cwd: Path, env: dict, log: Path) -> tuple[float, int]:
    t0 = time.monotonic()
    with open(log, "ab") as f:
        f.write(f"$ {cmd}\n".encode())
        f.flush()
        rc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return time.monotonic() - t0, rc


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(ROOT / "benchmarks/results/readme_timings.json"))
    args = ap.parse_args()
    commands = readme_commands(ROOT / "README.md")
    if len(commands) != 2 or not all(c.startswith(SETUP + " && ") for c in commands):
        print(f"README's first bash block is not two '{SETUP} && ...' commands: {commands}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="readme-timing-"))
    clone, cache, log = work / "clone", work / "cache", work / "commands.log"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "AUTOTUNE_TEST_POSTGRES")}
    env["AUTOTUNE_CACHE_DIR"] = str(cache)
    run = {"date": datetime.date.today().isoformat(), "commit": commit, "cores": os.cpu_count(),
           "load_before": _load(), "parts": []}
    for what, cmd in zip(("main job", "quick tests"), commands):
        job = cmd[len(SETUP) + 4:]
        for part, c in (("setup" if what == "main job" else "setup again", SETUP), (what, job)):
            seconds, rc = _timed(c, clone, env, log)
            run["parts"].append({"part": part, "command": c, "seconds": round(seconds, 1), "rc": rc})
            print(f"{part}: {seconds:.0f} s (exit {rc})")
            if rc != 0:
                print(f"failed; log: {log}", file=sys.stderr)
                return 1
    tail = log.read_text(errors="replace").strip().splitlines()[-1]
    run["quick tests result"] = tail.strip("= ")
    run["load_after"] = _load()
    results = Path(args.results)
    data = json.loads(results.read_text()) if results.exists() else {
        "what": "the two commands at the top of README.md on a fresh clone (scripts/time_readme_commands.py)",
        "runs": []}
    data["runs"].append(run)
    results.write_text(json.dumps(data, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"appended to {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
