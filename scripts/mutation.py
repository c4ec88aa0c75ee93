"""Mutation testing of the checks that decide what autotune calls correct, faster or worth writing
(pyproject.toml's [tool.mutmut]: the modules and the quick tests that pin them), with mutmut.

The run happens in a scratch copy of the tree (mutmut writes its mutants/ beside the sources), so the
checkout is never touched and two runs never share state. Mutants are judged by the quick tests only
(`-m "not slow"`): a check that only a slow test guards is a check the README's test command misses.

    .venv/bin/python scripts/mutation.py [--children 2] [--limit-s 900] [--min-score S] [--json OUT]
                                        [--survivors] [--keep DIR] [--only PATTERN ...]

Prints per module: killed, survived, timeout, no tests (code no CPU test can reach: CUDA timing),
and the score, killed / (killed + survived + timeout) over the mutants some quick test runs. Exits 1
when the score is below --min-score; past --limit-s the run is stopped and the mutants judged so far
are reported (marked partial), so a slow machine never fails the gate by its speed alone.

`--only PATTERN` (fnmatch, repeatable) runs only the entries of MUTANTS it matches, e.g.
`--only 'autotune.folder.change*'`: one module's tests written against its survivors, without waiting for
every other module's mutants (mutmut still runs the whole test selection once to see what reaches what).

`--since REV` (what .ci/run passes: the commit this branch left main at, or the last one CI ran on) runs
the entries of MUTANTS whose module changed since REV (committed, uncommitted or new), and CORE always:
a change is judged on what it touched, and the checks that matter most on every run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(os.environ.get("AUTOTUNE_MUTATION_TREE") or Path(__file__).resolve().parent.parent)
COPIED = ("pyproject.toml", "autotune", "tests", "search_spaces")
JUDGED = ("killed", "survived", "timeout")       # a mutant some quick test ran; "no tests": none did
# The mutants run (mutmut's names, fnmatch): every function of the modules pyproject.toml lists, but of
# choice.py only the selection and the tactic pin. Its tuner's storage and task plumbing is reached
# only by whole replayed runs, seconds for each of its hundreds of mutants.
MUTANTS = ("autotune.measure.timing.*", "autotune.families.triton_moe.pairs.*", "autotune.search.finalists.*", "autotune.search.server_choice.*",
           "autotune.validate.gate.*", "autotune.families.triton_moe.export.*", "autotune.search.sieve.x_pins_over_default_*",
           *(f"autotune.search.sieve.xǁBackendTunerǁ{f}_*" for f in ("select", "tactic_choices", "_choose", "disqualified",
                                                              "disqualified_tactics", "_failures")),
           "autotune.folder.change.*")


# Judged on every run, whatever a change touched: what calls an output correct (the numerics check, the
# noise floor, the duel) and what picks the winner among the finalists.
CORE = ("autotune.measure.timing.*", "autotune.search.finalists.*")


def chosen(only: list[str] | None) -> tuple[str, ...]:
    """The entries of MUTANTS that `--only`'s patterns match (all of them without `--only`)."""
    return tuple(m for m in MUTANTS if not only or any(fnmatch(m, p) for p in only))


def module_of(entry: str) -> str:
    """The source file a MUTANTS entry's mutants live in (autotune.search.sieve.x_pins_over_default_* ->
    autotune/search/sieve.py)."""
    parts = entry.split(".")
    while parts and (parts[-1] == "*" or parts[-1].startswith(("x_", "xǁ"))):
        parts.pop()
    return "/".join(parts) + ".py"


def changed_files(since: str, tree: Path = ROOT) -> set[str]:
    """The files of `tree` (a git checkout) that differ from commit `since`: committed after it, changed
    in the working tree, or new and not ignored."""
    def git(*args):
        r = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"--since {since}: git {args[0]} failed: {r.stderr.strip()}")
        return r.stdout.splitlines()
    return set(git("diff", "--name-only", since, "--")) | set(git("ls-files", "--others", "--exclude-standard"))


def touched(files: set[str]) -> tuple[str, ...]:
    """The entries of MUTANTS whose module is among `files`, and CORE's."""
    return tuple(m for m in MUTANTS if m in CORE or module_of(m) in files)


def scratch_copy(dest: Path) -> None:
    """The files mutmut and the selected tests read, without caches or the venv."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for name in (*COPIED, *cfg.get("also_copy", [])):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore, dirs_exist_ok=True)
        elif src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run_mutmut(work: Path, children: int, limit_s: float, mutants: tuple[str, ...] = MUTANTS) -> tuple[bool, float]:
    """(finished, seconds): mutmut run in `work`, its whole process group stopped past `limit_s`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}   # compile once, keep it
    # One memo of SGLang's loader answers for every mutant's test session: without it each session
    # makes its own (tests/conftest.py) and imports SGLang again, seconds per mutant.
    env.setdefault("AUTOTUNE_CACHE_DIR", str(work / "sglang-memo"))
    Path(env["AUTOTUNE_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    # Each mutant runs in a fork of the process that ran every test once (what it imported stays
    # imported: the fast way). A fork whose parent ran torch's OpenMP pool deadlocks when it runs one
    # itself (seen: the interpreter's launch tests hung): one thread, no pool.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.monotonic()
    with open(work / "mutmut.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *mutants], cwd=work,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False, time.monotonic() - t0
    if proc.returncode != 0:
        tail = (work / "mutmut.log").read_text(errors="replace")[-3000:].replace("\r", "\n")
        raise SystemExit(f"mutmut run failed (exit {proc.returncode}):\n{tail}")
    return True, time.monotonic() - t0


def results(work: Path, mutants: tuple[str, ...] = MUTANTS) -> dict[str, dict[str, str]]:
    """module path -> mutant name -> status (mutmut's own names for its exit codes)."""
    from mutmut.stats import status_by_exit_code

    out = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        asked = {k: status_by_exit_code[v] for k, v in codes.items() if any(fnmatch(k, m) for m in mutants)}
        if asked:                   # a module --only left out is not reported as all zeros
            out[str(meta.relative_to(work / "mutants"))[: -len(".meta")]] = asked
    return out


def score(statuses) -> float | None:
    c = Counter(statuses)
    judged = sum(c[s] for s in JUDGED)
    return c["killed"] / judged if judged else None


def report(res: dict, finished: bool, seconds: float) -> dict:
    rows = {m: dict(Counter(st.values())) for m, st in res.items()}
    every = [s for st in res.values() for s in st.values()]
    total = dict(Counter(every))
    return {"finished": finished, "seconds": round(seconds), "modules": rows, "total": total,
            "score": score(every), "survivors": sorted(k for st in res.values() for k, s in st.items()
                                                       if s in ("survived", "timeout"))}


def print_report(r: dict) -> None:
    cols = ("killed", "survived", "timeout", "no tests", "not checked")
    print(f"{'module':<28}" + "".join(f"{c:>12}" for c in cols) + f"{'score':>8}")
    for m, c in (*r["modules"].items(), ("total", r["total"])):
        s = score([k for k, n in c.items() for _ in range(n)])
        print(f"{m:<28}" + "".join(f"{c.get(col, 0):>12}" for col in cols) + f"{'-' if s is None else f'{s:.1%}':>8}")
    state = "" if r["finished"] else " (stopped at the time limit: partial)"
    print(f"mutation score {r['score']:.1%} over the mutants a quick test runs, {r['seconds']} s{state}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    ap.add_argument("--limit-s", type=float, default=900.0, help="stop the run after this many seconds")
    ap.add_argument("--min-score", type=float, default=None, help="exit 1 below this score (0..1)")
    ap.add_argument("--json", default=None, help="write the counts, the score and the survivors here")
    ap.add_argument("--survivors", action="store_true", help="list the surviving mutants")
    ap.add_argument("--keep", default=None, help="run in this folder (kept: `mutmut show NAME` there)")
    ap.add_argument("--only", action="append", metavar="PATTERN",
                    help="run only the entries of MUTANTS this matches (fnmatch; repeatable)")
    ap.add_argument("--since", metavar="REV", default=None,
                    help="run the entries whose module changed since commit REV, and CORE's")
    a = ap.parse_args()
    if a.only and a.since:
        print("--only and --since each choose the mutants: give one", file=sys.stderr)
        return 2
    mutants = touched(changed_files(a.since)) if a.since else chosen(a.only)
    if a.since:
        print(f"mutants of {', '.join(sorted({module_of(m) for m in mutants}))} (changed since {a.since[:12]}, "
              f"or the core: {', '.join(sorted({module_of(m) for m in CORE}))})", flush=True)
    if not mutants:
        print(f"--only {' '.join(a.only)} matches none of {', '.join(MUTANTS)}", file=sys.stderr)
        return 2
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="autotune-mutation-"))
    try:
        scratch_copy(work)
        finished, seconds = run_mutmut(work, a.children, a.limit_s, mutants)
        r = report(results(work, mutants), finished, seconds)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_report(r)
    if a.survivors:
        print("\n".join(r["survivors"]))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1) + "\n")
    if a.min_score is not None and (r["score"] or 0.0) < a.min_score:
        print(f"mutation score {r['score'] or 0.0:.1%} is below {a.min_score:.1%}: a check lost a test", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
