"""What the steps of run, worker and export share: the "what to tune" selection read from a request,
the note on problems that share one SGLang file, progress bars, the search settings with the warm
start read once, the --json summary begun, and the --record cache extended."""
from __future__ import annotations

import sys

from autotune.errors import UsageError


def selection(req):
    """(models, tps, eps, dtypes or None, batch sizes) from the "what to tune" settings."""
    from autotune.problems import models

    return (models.select_models(req.shapes, req.model, req.model_config),
            models.parse_int_list(req.tp, "--tp"), models.parse_int_list(req.ep, "--ep"),
            tuple(d.strip() for d in req.dtype.split(",")) if req.dtype is not None else None,
            models.parse_int_list(req.batch_sizes, "--batch-sizes", models.MAX_BATCH) if req.batch_sizes
            else models.DEFAULT_BATCH_SIZES)


def problems(req):
    from autotune.problems import models

    ms, tps, eps, dtypes, bss = selection(req)
    return models.expand(ms, tps, eps, dtypes or models.TRITON_DTYPES, bss)


def shared_notes(exp) -> list[str]:
    """Where two problems map to one SGLang file: which one the file is tuned for."""
    out = []
    for key, others in exp.shared.items():
        owner = next(p for p in exp.problems if p.file_key == key)
        for o in others:
            who = ", ".join(sorted({f"{s[0]} tp{s[1]}" for s in o.sources}))
            out.append(f"note: {who} (K={o.K}, top_k={o.top_k}) maps to the same SGLang file as {owner.key}; "
                       f"that file is tuned for K={owner.K}, top_k={owner.top_k}")
    return out


def print_shared(exp) -> None:
    for line in shared_notes(exp):
        print(line)


def no_bar(req) -> bool:
    """Progress bars only on a terminal: in a log file they are thousands of carriage returns. The
    one-line summary after each problem is printed either way."""
    return bool(req.quiet) or getattr(req, "log_level", "info") == "warning" or not sys.stderr.isatty()


def triton_settings(req, budget, warm):
    """The search's settings; `warm`: the warm start load_warm_start read (or None)."""
    from autotune.search.study import TuneSettings
    return TuneSettings(trials=req.trials or 40, budget_s=budget, seed=req.seed,
                        neighbours=req.neighbours, use_shipped=not req.no_shipped, warm_start=warm)


def load_warm_start(path):
    """--warm-start's source, read once by the command before anything is measured (None: none); its
    configs are those of the config family the commands that name none work on."""
    if not path:
        return None
    from autotune.families import registry
    from autotune.search.warm_start import WarmStartError, load
    try:
        warm = load(path, registry.get(registry.default()).cls)
    except WarmStartError as e:
        raise UsageError(str(e)) from None
    print(f"warm start: {warm.describe()}")
    return warm


def after_search(summary: dict, what: str, fn, *args, let_through=(), folder_step=False, **kwargs):
    """A step after the search (the layer check, writing files, --record, the summary): where it fails
    the run says so in one line, notes it in the summary's "incomplete" list (the run then exits 4) and
    goes on; what was measured is in the storage, so the same command does the step again without
    measuring. Returns fn's result, None where it failed; `let_through`: exceptions the caller handles;
    `folder_step`: the step writes into the tuned folder, whose change is then thrown away whole
    (autotune.folder.change: a folder changes as one)."""
    import logging

    try:
        return fn(*args, **kwargs)
    except let_through:
        raise
    except Exception as e:
        from autotune.errors import one_line

        logging.getLogger("autotune").debug("%s failed", what, exc_info=True)
        from autotune.folder.change import in_words

        line = in_words(f"{what} failed: {type(e).__name__}: {one_line(e)}")
        print(f"  {line}; nothing measured is lost (the storage holds it): the same command does it again "
              "without measuring", flush=True)
        summary.setdefault("incomplete", []).append(line)
        if folder_step:
            from autotune.folder.change import fail_open
            fail_open(line)
        return None


def new_summary() -> dict:
    """What the run did, for --json (filled by the steps, written once at its end)."""
    return {"command": "autotune " + " ".join(sys.argv[1:])}


def record_measurements(path, device, problem, measurements, careful=()) -> None:
    from autotune.measure.records import Cache, CacheError, read_cache, write_cache

    try:
        cache = read_cache(path)
    except CacheError:
        cache = Cache(device.to_dict())
    cache.problems[problem.key] = problem.to_dict()
    for ms, is_careful in ((measurements, False), (careful, True)):
        for m in ms:
            if m.status != "invalid":
                cache.add(m, careful=is_careful)
    write_cache(path, cache)
