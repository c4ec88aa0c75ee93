"""benchmarks/compare_to_grid.py: the issue-2 check of a tuned folder against the recorded grid,
read through SGLang's own loader."""
import importlib.util

from tests.conftest import GRID, ROOT

spec = importlib.util.spec_from_file_location("compare_to_grid", ROOT / "benchmarks/compare_to_grid.py")
compare_to_grid = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_to_grid)


def test_grid_best_files_pass_and_a_worse_entry_is_named(tmp_path, grid_cache, h200, qwen397_bf16, capsys):
    from autotune.families.triton_moe.export import export_problem
    from autotune.folder.tuned import TunedFolder
    from autotune.search.finalists import Choice

    (pk, _), = grid_cache.problems.items()
    choices = {}
    for M in qwen397_bf16.batch_sizes:
        up, down = compare_to_grid.grid_best_pair(grid_cache, pk, M)
        choices[M] = Choice.pair(M, (up.config, down.config), (up.time_us, down.time_us), "tuned")
    export_problem(TunedFolder.under(tmp_path, h200), qwen397_bf16, choices, run={})
    folder = tmp_path / h200.file_name
    assert compare_to_grid.main(["--configs", str(folder), "--grid", str(GRID)]) == 0
    rows = compare_to_grid.compare(folder, GRID)
    assert [r["M"] for r in rows] == list(qwen397_bf16.batch_sizes)
    assert all(abs(r["gap"]) < 1e-9 for r in rows)
    assert all(r["tuned_us"] < r["default_us"] for r in rows)

    # M=8 written with M=1's pair: SGLang loads it at M=8, and the check names M=8 alone.
    import json
    for name in [p for p in TunedFolder.under(tmp_path, h200).config_dir().iterdir() if p.suffix == ".json"]:
        d = json.loads(name.read_text())
        d["8"] = d["1"]
        name.write_text(json.dumps(d))
    capsys.readouterr()
    assert compare_to_grid.main(["--configs", str(folder), "--grid", str(GRID)]) == 1
    err = capsys.readouterr().err
    assert "M=8:" in err and "M=1:" not in err and "M=32:" not in err
