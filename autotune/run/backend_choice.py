"""`autotune run`'s backend-choice step: every available backend (and its tactics) of each family
at every M, the per-M winners, one backend per server, server_args.yaml, and FlashInfer's files
for the tactics (its autotune cache of the winners, its blocklist of the disqualified)."""
from __future__ import annotations

from dataclasses import dataclass, field

from autotune.contract import registry
from autotune.errors import NothingDone, UsageError
from autotune.run.step import Step


@dataclass
class BackendChoice(Step):
    """The backend families' plans. Its check (a run that writes): the folder's earlier choices can be
    merged with this run's, and FlashInfer's files there are ours to replace."""
    needs = ("request", "device", "sinks", "plan_only", "plans", "pool", "storage", "run_name", "folder")
    plans: list = field(default_factory=list)
    mix: str = "decode"                 # the workload the one backend per server is chosen for
    checkpoint: str | None = None       # the family whose choice server_args.yaml gives as --checkpoint's
    wrote: bool = False

    def check(self, ctx) -> None:
        from autotune.export import server_args
        from autotune.export.tactics import BLOCKLIST_FILE, CACHE_FILE
        from autotune.fileio.writing import claim, json_with

        if not self.plans or ctx.plan_only:
            return
        try:       # a folder whose choices cannot be merged is refused before anything is measured
            server_args.check_folder(ctx.folder)
        except server_args.ChoicesError as e:
            raise UsageError(str(e)) from None
        claim(ctx.folder.path / BLOCKLIST_FILE, json_with("invalid_tactics"))
        claim(ctx.folder.path / CACHE_FILE, json_with("_metadata"))

    def run(self, ctx) -> None:
        from autotune.run.plan import phase_name

        if not self.plans:
            return
        if hasattr(ctx.pool, "use_phase"):
            ctx.pool.use_phase(phase_name(registry.BACKENDS))
        self.wrote = choose_backends(ctx, self.plans, self.mix, self.checkpoint)

    def nothing_done(self, ctx) -> Exception:
        return NothingDone("no backend of " + ", ".join(fp.name for fp in self.plans) + " ran correctly at a "
                           "measured batch size: nothing written (the tables above say why; --skip-backends may "
                           "have left out the ones that run)")


def choose_backends(ctx, plans, mix: str, checkpoint: str | None) -> bool:
    """Every available backend of each family at every M of each problem; per-M winners; the one
    backend per server for the decode and prefill mixes; server_args.yaml. False: no backend ran
    correctly anywhere, and nothing was written."""
    from autotune.export import server_args

    summary = ctx.sinks.summary
    results, details = [], {}
    for fp in plans:
        tuners, per_problem = [], []
        for p in fp.problems:
            t, pinned, kept = measure_problem(ctx, fp, p)
            details.setdefault(fp.name, {})[p.key] = kept
            tuners.append(t)
            per_problem.extend((p, per_m) for per_m in pinned.values())
        both = choose_server_backend(ctx, fp, tuners, mix)
        results.append((both, fp.family))
        write_tactic_files(ctx.folder, fp.family, tuners, per_problem, summary)
        summary.data[f"{fp.name} server"] = {c.mix: c.backend for c in both}
        summary.data[f"{fp.name} auto"] = both[0].auto_line
    if not any(c.backend for chosen, _ in results for c in chosen):
        # Nothing to tell SGLang: the user's server_args.yaml is left as it was, not given a block
        # that only says "SGLang's default stays".
        summary.data["backends_chosen"] = False
        print("\nserver_args.yaml not written: no backend ran correctly at a measured batch size of "
              + ", ".join(fam.name for _, fam in results))
        return False
    try:
        path = server_args.write(ctx.folder, results, checkpoint, details)
    except server_args.ChoicesError as e:
        raise UsageError(f"server_args.yaml not written: {e}") from None
    path = ctx.folder.real(path)
    print(f"\nwrote {path}")
    summary.data["server_args"] = path
    return True


def measure_problem(ctx, fp, p) -> tuple:
    """One problem's backends and tactics measured, its tables said and summed up, its measurements
    recorded: (its tuner, backend -> M -> pinned tactic, what backend_choice.json keeps of it)."""
    from autotune.search.sieve import BackendTuner
    from autotune.run.report import backend_table, table_records, tactic_table

    device, sinks = ctx.device, ctx.sinks
    with sinks.progress.bar(len(fp.family.space(p, "layer", device).params["backend"]), "backend",
                            f"{fp.name} {p.key}") as bar:
        t = BackendTuner(ctx, p, fp.family, progress=bar)
        t.measure()
    choices = t.select()
    pinned = t.tactic_choices()
    print(f"\n{fp.name} {p.key} ({'replay' if device.is_replay else device.name}):")
    table = backend_table(t, choices)
    sinks.report.table(table)
    entry = {"problem": p.key, "per_M": table_records(table), "disqualified": sorted(t.disqualified())}
    sinks.summary.add(fp.name, entry)
    if pinned:
        tactics = tactic_table(t, pinned)
        sinks.report.table(tactics, head="  best tactic of each tunable backend, re-measured beside its default "
                           "(FlashInfer's cache pins it wherever SGLang runs that backend):")
        entry["tactics"] = table_records(tactics)
    for b, m in sorted(t.disqualified().items()):
        print(f"  disqualified {b}: {m.status} at M={m.M}: {m.reason}")
    for m in t.disqualified_tactics().values():
        print(f"  disqualified {m.config['backend']} tactic {m.config['tactic']}: {m.status} at M={m.M}: "
              f"{m.reason}")
    for b, m in sorted(t.unavailable_backends().items()):
        print(f"  unavailable {b} (skipped, not stored: a re-run retries it): {m.reason}")
    details = {"per_M": {M: c.to_dict() for M, c in choices.items()},
               "disqualified": {b: m.to_dict() for b, m in t.disqualified().items()}}
    sinks.record.add(device, p, [*(m for d in t.measured.values() for m in d.values()), *t.unavailable.values()],
                     careful=t.careful.values())
    return t, pinned, details


def choose_server_backend(ctx, fp, tuners, mix: str) -> list:
    """The one backend per server for `mix` and for the other mix, said; [chosen, other]."""
    from autotune.search.sieve import server_choice

    chosen = server_choice(fp.family, ctx.device, tuners, mix)
    other = server_choice(fp.family, ctx.device, tuners, "prefill" if mix == "decode" else "decode")
    flag = f"--{registry.get(fp.name).flag}"
    if chosen.auto_fails:      # what a user of SGLang's default hits first: said first, in one line
        print(f"\n{fp.name}: SGLang's {flag} {chosen.auto_line}")
    for line in chosen.surprises():
        print(f"  note: {line}")
    print(f"\n{fp.name}: one backend per server, {mix} mix: {chosen.summary}"
          + (f" ({chosen.gain_vs_auto:.3f}x over SGLang's auto {chosen.auto})" if chosen.gain_vs_auto else "")
          + (f", kept over {chosen.within_noise} (faster by less than the noise)" if chosen.within_noise else "")
          + (f"; per-M choice would gain {chosen.per_m_gain:.3f}x more" if chosen.per_m_gain else "")
          + f"; {other.mix} mix: {other.summary}")
    return [chosen, other]


def write_tactic_files(tuned, family, tuners, per_problem, summary) -> None:
    """FlashInfer's cache of the winning tactics and its blocklist of the disqualified ones,
    beside the tuned configs (autotune.export.tactics). `per_problem`: (problem, M -> Choice) pairs,
    one per tunable backend (BackendTuner.tactic_choices)."""
    from autotune.adapters import flashinfer_cache as fi_cache
    from autotune.export import tactics as files

    if getattr(family, "runner", None) is None:
        return
    device, folder = tuned.device, tuned.path
    invalid = files.blocklist_of(family, tuners)
    if invalid:
        path = folder / files.BLOCKLIST_FILE
        try:
            files.write_blocklist(path, invalid, files.blocklist_metadata(device.name))
        except ValueError as e:
            raise UsageError(str(e)) from None
        path = tuned.real(path)
        print(f"wrote {path} ({sum(map(len, invalid.values()))} disqualified tactics; SGLang's start-up tuning "
              f"skips them with FLASHINFER_TACTICS_BLOCKLIST={path})")
        summary.data.setdefault("flashinfer_blocklist", path)
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
    path, folder = tuned.real(path), tuned.real(folder)
    print(f"wrote {path} ({len(entries)} winning tactics; `autotune install {folder} --model-path ... --tp ...` "
          "puts it where SGLang reads it, one identical file per rank)")
    summary.data.setdefault("flashinfer_cache", path)
