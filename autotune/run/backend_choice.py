"""`autotune run`'s backend-choice step: every available backend (and its tactics) of each family
at every M, the per-M winners, one backend per server, server_args.yaml, and FlashInfer's files
for the tactics (its autotune cache of the winners, its blocklist of the disqualified)."""
from __future__ import annotations

import sys
from pathlib import Path

from autotune.families import registry
from autotune.errors import UsageError
from autotune.folder.change import real, tuned_folder
from autotune.run.common import no_bar, record_measurements


def run_backend_choice(req, plans, device, pool, storage, dev_name, summary: dict) -> None:
    """Every available backend of each family at every M of each problem; per-M winners; the one
    backend per server for the decode and prefill mixes; server_args.yaml."""
    from tqdm import tqdm

    from autotune.search.context import SearchContext
    from autotune.search.sieve import BackendTuner, server_choice
    from autotune.export import server_args
    from autotune.run.report import backend_table, format_table, table_records, tactic_table

    try:       # a folder whose choices cannot be merged is refused before anything is measured
        server_args.check_folder(req.out, device)
    except server_args.ChoicesError as e:
        raise UsageError(str(e)) from None
    results, details = [], {}
    for fp in plans:
        tuners, per_problem = [], []
        for p in fp.problems:
            with tqdm(total=len(fp.family.space(p, "layer", device).params["backend"]), unit="backend",
                      desc=f"{fp.name} {p.key}", file=sys.stderr, disable=no_bar(req), dynamic_ncols=True) as bar:
                t = BackendTuner(SearchContext(storage, device, pool, run_name=dev_name), p, fp.family, progress=bar)
                t.measure()
            choices = t.select()
            tuners.append(t)
            pinned = t.tactic_choices()
            per_problem.extend((p, per_m) for per_m in pinned.values())
            print(f"\n{fp.name} {p.key} ({'replay' if device.is_replay else device.name}):")
            table = backend_table(t, choices)
            print(format_table(table))
            summary.setdefault(fp.name, []).append({"problem": p.key, "per_M": table_records(table),
                                                           "disqualified": sorted(t.disqualified())})
            if pinned:
                tactics = tactic_table(t, pinned)
                print(f"  best tactic of each tunable backend, re-measured beside its default (FlashInfer's cache "
                      f"pins it wherever SGLang runs that backend):\n{format_table(tactics)}")
                summary[fp.name][-1]["tactics"] = table_records(tactics)
            for b, m in sorted(t.disqualified().items()):
                print(f"  disqualified {b}: {m.status} at M={m.M}: {m.reason}")
            for m in t.disqualified_tactics().values():
                print(f"  disqualified {m.config['backend']} tactic {m.config['tactic']}: {m.status} at M={m.M}: "
                      f"{m.reason}")
            for b, m in sorted(t.unavailable_backends().items()):
                print(f"  unavailable {b} (skipped, not stored: a re-run retries it): {m.reason}")
            details.setdefault(fp.name, {})[p.key] = {
                "per_M": {M: c.to_dict() for M, c in choices.items()},
                "disqualified": {b: m.to_dict() for b, m in t.disqualified().items()}}
            if req.record:
                record_measurements(req.record, device, p, [*(m for d in t.measured.values() for m in d.values()),
                                                 *t.unavailable.values()], careful=t.careful.values())
        chosen = server_choice(fp.family, device, tuners, req.mix)
        other = server_choice(fp.family, device, tuners, "prefill" if req.mix == "decode" else "decode")
        flag = f"--{registry.get(fp.name).flag}"
        if chosen.auto_fails:      # what a user of SGLang's default hits first: said first, in one line
            print(f"\n{fp.name}: SGLang's {flag} {chosen.auto_line}")
        for line in chosen.surprises():
            print(f"  note: {line}")
        print(f"\n{fp.name}: one backend per server, {req.mix} mix: {chosen.summary}"
              + (f" ({chosen.gain_vs_auto:.3f}x over SGLang's auto {chosen.auto})" if chosen.gain_vs_auto else "")
              + (f", kept over {chosen.within_noise} (faster by less than the noise)" if chosen.within_noise else "")
              + (f"; per-M choice would gain {chosen.per_m_gain:.3f}x more" if chosen.per_m_gain else "")
              + f"; {other.mix} mix: {other.summary}")
        results.append(([chosen, other], fp.family))
        write_tactic_files(req.out, device, fp.family, tuners, per_problem, summary)
        summary[f"{fp.name} server"] = {c.mix: c.backend for c in (chosen, other)}
        summary[f"{fp.name} auto"] = chosen.auto_line
    if not any(c.backend for chosen, _ in results for c in chosen):
        # Nothing to tell SGLang: the user's server_args.yaml is left as it was, not given a block
        # that only says "SGLang's default stays".
        summary["backends_chosen"] = False
        print("\nserver_args.yaml not written: no backend ran correctly at a measured batch size of "
              + ", ".join(fam.name for _, fam in results))
        return
    try:
        path = server_args.write(req.out, device, results, req.checkpoint, details)
    except server_args.ChoicesError as e:
        raise UsageError(f"server_args.yaml not written: {e}") from None
    path = real(path)
    print(f"\nwrote {path}")
    summary["server_args"] = path


def write_tactic_files(out, device, family, tuners, per_problem, summary: dict) -> None:
    """FlashInfer's cache of the winning tactics and its blocklist of the disqualified ones,
    beside the tuned configs (autotune.export.tactics). `per_problem`: (problem, M -> Choice) pairs,
    one per tunable backend (BackendTuner.tactic_choices)."""
    from autotune.adapters import flashinfer_cache as fi_cache
    from autotune.export import tactics as files

    if getattr(family, "runner", None) is None:
        return
    folder = tuned_folder(out, device)
    invalid = files.blocklist_of(family, tuners)
    if invalid:
        path = folder / files.BLOCKLIST_FILE
        try:
            files.write_blocklist(path, invalid, files.blocklist_metadata(device.name))
        except ValueError as e:
            raise UsageError(str(e)) from None
        path = real(path)
        print(f"wrote {path} ({sum(map(len, invalid.values()))} disqualified tactics; SGLang's start-up tuning "
              f"skips them with FLASHINFER_TACTICS_BLOCKLIST={path})")
        summary.setdefault("flashinfer_blocklist", path)
    searched = any(m.config.get("tactic", -1) != -1 for t in tuners for M in t.Ms for m in t.measured[M].values())
    if searched and not invalid:
        print("no tactic was disqualified: every tactic FlashInfer's runners listed ran correctly; no blocklist written")
    entries = files.cache_entries_of(family, per_problem)
    if not entries:
        if searched:    # say so: an absent cache is the answer, not a step that failed
            print("no tactic beat its backend's default (-1) beyond the noise at any batch size: no FlashInfer "
                  "cache written (SGLang's start-up tuning runs as it would without autotune)")
        return
    path = folder / files.CACHE_FILE
    try:
        # What FlashInfer recorded of this machine; a field it could not read ("unknown", e.g. the
        # CuTe-DSL version where that package is absent) would make every normal install ignore
        # the file, so it becomes the wildcard.
        seen = device.versions.get("flashinfer_metadata") or device.versions
        unknown = [k for k, v in seen.items() if v in (None, "unknown")]
        fi_cache.write_cache(path, entries, fi_cache.metadata_for(seen, wildcard=unknown))
    except ValueError as e:
        print(f"  {len(entries)} winning tactics not written to {path.name}: {e}")
        return
    path, folder = real(path), real(folder)
    print(f"wrote {path} ({len(entries)} winning tactics; `autotune install {folder} --model-path ... --tp ...` "
          "puts it where SGLang reads it, one identical file per rank)")
    summary.setdefault("flashinfer_cache", path)
