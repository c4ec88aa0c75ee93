"""The one-batch decode of SGLang with a config folder against SGLang's shipped file, judged by the tool's gate.

Reads the runs scripts/sglang_arms_h200.sh left (MODE=one_batch: `sglang.benchmark.one_batch`'s result lines, one
per batch size and run; the `tuned` arm is whatever folder TUNED named) and, per batch size, compares the arms'
decode throughput (tokens/s of the median decode step) with autotune.validate.gate (paired by repeat, the noise
from the scatter of the paired ratios): gain, within noise or regression.

    python benchmarks/decode_verdict.py RUNS_DIR [--against shipped] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from autotune.validate.gate import Sides, compare

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--against", default="shipped")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    per: dict = defaultdict(lambda: defaultdict(dict))      # batch -> arm -> repeat -> (tok/s, step ms)
    for f in sorted(args.runs.glob("one_batch_*_r*_*.jsonl")):
        m = re.search(r"_r(\d+)_(\w+)\.jsonl$", f.name)
        for line in f.read_text().splitlines():
            d = json.loads(line)
            per[d["batch_size"]][m.group(2)][int(m.group(1))] = (d["median_decode_throughput"],
                                                                1000 * d["median_decode_latency"])
    out = []
    for bs, arms in sorted(per.items()):
        reps = sorted(set(arms["tuned"]) & set(arms[args.against]))
        c = compare(f"batch {bs}", Sides([arms[args.against][r][0] for r in reps], [arms["tuned"][r][0] for r in reps],
                                         against=args.against), x=bs)
        steps = {a: [arms[a][r][1] for r in reps] for a in ("tuned", args.against)}
        print(c.describe() + f"; decode step ms: tuned {steps['tuned']}, {args.against} {steps[args.against]}")
        out.append({**c.to_dict(), "step_ms": steps})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
