"""After a device run (issue 35): what its storage holds as each config's verdict, and whether every
written Triton MoE file has a key for every batch size.

    python benchmarks/memory_audit.py --storage sqlite:///run.db --out TUNED_FOLDER [--json FILE]

Counts every completed trial and every baseline / careful re-measurement by status, and names those
whose failure reads as the machine's (out of memory, device busy or unavailable: records.is_resource_failure)
stored as a config's failure, which must be 0. Exits 1 when any is, or when a file misses a batch size.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import optuna

from autotune.measure.records import Measurement, is_resource_failure
from autotune.store.storage import ATTR


def audit_storage(url: str) -> dict:
    storage = optuna.storages.RDBStorage(url)
    by_status: collections.Counter = collections.Counter()
    resource = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        stored = [t.user_attrs[ATTR] for t in study.get_trials(deepcopy=False) if ATTR in t.user_attrs]
        stored += [v for k, v in study.user_attrs.items() if k.startswith(("baseline:", "careful:"))]
        for d in stored:
            m = Measurement.from_dict(d)
            by_status[m.status] += 1
            if is_resource_failure(m):
                resource.append(f"{summary.study_name}: {m.status}: {m.reason[:160]}")
    return {"by_status": dict(by_status), "resource_failures_stored": resource}


def audit_files(out: Path) -> dict:
    """Keys of each file a provenance.json lists as ours, and of its down-projection file (not the
    shipped overlay's copies)."""
    ours = set()
    for prov in out.rglob("provenance.json"):
        for name in json.loads(prov.read_text()).get("files", {}):
            ours |= {name, name[:-len(".json")] + "_down.json"}
    return {str(path.relative_to(out)): sorted(int(k) for k in json.loads(path.read_text()))
            for path in sorted(out.rglob("*.json")) if path.name in ours}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--batch-sizes", type=int, default=18, help="keys every file must hold")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    report = {"storage": audit_storage(a.storage), "files": audit_files(a.out)}
    short = {name: len(keys) for name, keys in report["files"].items() if len(keys) < a.batch_sizes}
    report["files_short"] = short
    print(f"stored verdicts by status: {report['storage']['by_status']}")
    print(f"resource failures stored as a config's failure: {len(report['storage']['resource_failures_stored'])}")
    for line in report["storage"]["resource_failures_stored"][:10]:
        print("  " + line)
    print(f"{len(report['files'])} Triton MoE files; keys per file: "
          f"{sorted({len(k) for k in report['files'].values()})}; short of {a.batch_sizes}: {short or 'none'}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))
    return 1 if short or report["storage"]["resource_failures_stored"] else 0


if __name__ == "__main__":
    sys.exit(main())
