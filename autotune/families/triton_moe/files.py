"""`SglangMoeFiles`: the rules a config family whose product is SGLang's fused-MoE config files hands the
search, the selection, the config search step and the export (the hooks of autotune.contract.protocol's
ConfigFamily), so that none of them names a key of those files. What one file holds is
autotune.families.triton_moe.schema's."""
from __future__ import annotations

from autotune.families.triton_moe.schema import CONFIG_ORDER, SWITCHES


class SglangMoeFiles:
    """What a config family owes the core when its product is SGLang's fused-MoE files (a gate_up file and
    a `_down` file per problem, keyed by M). SGLang sorts tokens once per batch with the gate_up config's
    BLOCK_SIZE_M and runs both GEMMs on that alignment: the search pins it now and then to the other
    GEMM's best (autotune.search.policy), the selection pairs configs sharing it (pairs), and the down
    file is written with gate_up's value (export). Needs `sglang_versions`: the releases the files must run in."""
    coupled = "BLOCK_SIZE_M"
    config_order = CONFIG_ORDER
    config_switches = SWITCHES

    def select(self, tuner, top: int, careful_repeats: int) -> dict:
        from autotune.families.triton_moe.pairs import select_problem
        return select_problem(tuner, top, careful_repeats)

    def why_unselected(self, tuner, M: int) -> str:
        from autotune.families.triton_moe.pairs import why_no_pair
        return why_no_pair(tuner, M)

    def confirm(self, tuner, choices: dict, attempt):
        """On a GPU, each M's pick timed as SGLang serves the layer against SGLang's own pairs
        (autotune.families.triton_moe.confirm)."""
        from autotune.families.triton_moe.confirm import confirm_picks
        return confirm_picks(tuner, choices, attempt)

    def export_targets(self, folder, problems) -> None:
        from autotune.families.triton_moe.export import export_targets
        export_targets(folder, problems)

    def export(self, folder, problem, choices: dict, run) -> dict:
        """The problem's two files and its provenance entry, which records the run (an
        autotune.contract.protocol.ProblemRun) and, per M, its layer check."""
        from autotune.families.triton_moe.export import export_problem
        return export_problem(folder, problem, choices, run.record(run.checked.records), self.sglang_versions)

    def after_export(self, folder, attempt) -> None:
        """Once a problem's files are in: the same files under the folder's other SKU names, then SGLang's
        shipped files for every other shape of the GPU beside ours (SGLANG_MOE_CONFIG_DIR replaces SGLang's
        own folder: autotune.families.triton_moe.overlay)."""
        attempt("SGLang's shipped files and the SKU copies beside the tuned files", self._lay_beside, folder,
                writes=folder)

    def _lay_beside(self, folder) -> None:
        from autotune.export.skus import copy_for_skus
        from autotune.families.triton_moe.overlay import overlay_shipped

        for path in copy_for_skus(folder):
            print(f"  wrote {folder.real(path)} (same configs, for another SKU)")
        rec = overlay_shipped(folder, self.sglang_versions)
        print(f"  SGLang {rec['sglang']}'s shipped files for {folder.device.name}: {len(rec['files'])} copied beside "
              f"ours (SGLANG_MOE_CONFIG_DIR replaces SGLang's folder), {len(rec['skipped'])} left out (provenance.json "
              "says why)")

    @staticmethod
    def file_problem(doc, entry: dict | None, name: str) -> str | None:
        """What is wrong with one of the family's files read back (None: nothing), by the files' schema;
        `entry` (its provenance entry) marks the keys that are SGLang's own choices (the shipped overlay)."""
        from autotune.families.triton_moe.schema import schema_problem, sglangs_own

        own = (lambda M, c: True) if entry is None else (lambda M, c: sglangs_own(entry, M, c, name))
        return schema_problem(doc, own)

    @staticmethod
    def loads(entry: dict, path, doc: dict) -> str | None:
        """Why SGLang's own loader does not serve the file as written (None: it does)."""
        from autotune.families.triton_moe.schema import sglang_loads

        return sglang_loads(entry, path, doc)
