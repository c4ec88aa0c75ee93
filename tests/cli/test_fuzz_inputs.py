"""Bad input found by generation, not by listing (hypothesis): model configs, search spaces,
recordings, provenance, flags and the process's environment (git's variables, PATH, TMPDIR, the working
folder) are mutated, the commands run in-process on them, and every run must keep the one invariant of
docs/RELIABILITY.md:

- no exception escapes `main` (a traceback fails the example);
- exit 0 with something useful on stdout and no error line, or a non-zero exit; exit 2 with exactly
  one line on stderr, `autotune: error: ...`; every line printed is printable (a name holding a
  newline or a control character split no line);
- every file that existed before is byte-identical after, and nothing lands outside the example's
  own folder (each example runs with its folder as the working directory, DEPTH folders below a
  sandbox that must hold nothing else afterwards: a name that climbs out with `../` or names an
  absolute path in it is seen).

Quick tier (the README's quick command): a bounded number of examples per property; the slow tier
(.ci/run) runs 8x as many (24x was 15 of the slow tier's 29 minutes on a loaded machine). Both are derandomized (CI's verdict is the code's); AUTOTUNE_FUZZ_RANDOM=1
draws new examples. Cases it found and the code fixed are counted
in docs/RELIABILITY.md."""
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.cli import main
from tests.conftest import GRID, ROOT

TIERS = [pytest.param(("quick", 1), id="quick"), pytest.param(("slow", 8), id="slow", marks=pytest.mark.slow)]
SPACE = (ROOT / "search_spaces/triton_moe.yaml").read_text()
PROVENANCE_FOLDER = ROOT / "tuned_configs/NVIDIA_H200"
CONFIG = {"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40, "num_experts": 256,
          "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
          "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
          "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
          "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
ONE = ["--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe"]

# values a hand-edited or generated file may hold where a number belongs
values = st.one_of(
    st.integers(-3, 3), st.integers(-2**70, 2**70), st.sampled_from([0, 1, 7, 128, 4096, 2**31, 10**9]),
    st.booleans(), st.none(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["sixty", "64", "", "1e3", "NaN", "-1"]),
    st.lists(st.integers(-2, 300), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
# what a user types where a number or a list belongs
flag_text = st.one_of(
    st.sampled_from(["0", "-1", "1", "8", "nan", "inf", "-inf", "1e400", "20", "20m", "5x", "", " ", "1,1",
                     "1,,2", "3/2", "0/1", "abc", "1.5", "0.0", "-0", "99999999999999999999", "all", "8,64",
                     "1.5h", "0s", ".5m", "٣"]),
    st.text(max_size=6), st.integers(-10, 10**6).map(str), st.floats().map(str))


def _snapshot(root: Path) -> dict:
    """Every file's hash; git's own store is left out (publish adds a commit: that is its output)."""
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*")
            if p.is_file() and ".git" not in p.relative_to(root).parts}


# an example's folder lies DEPTH folders below its sandbox, so a name that climbs up to DEPTH folders
# above where it is joined (the deepest: a serving repo's configs/triton_*/, 5 below) still lands in it
DEPTH = 8
SANDBOX = "@SANDBOX@"        # in a generated name: the example's sandbox, an absolute path out of its folder


@contextlib.contextmanager
def _example():
    """A fresh folder, also the working directory, for one generated example."""
    with tempfile.TemporaryDirectory(prefix="autotune-fuzz-") as d:
        root = Path(d).joinpath(*(f"up{i}" for i in range(DEPTH)), "example")
        root.mkdir(parents=True)
        old = os.getcwd()
        os.chdir(root)
        try:
            yield root
        finally:
            os.chdir(old)


def _outside(root: Path) -> list[Path]:
    """What lies in the example's sandbox beside its folder and the folders above it."""
    return [p for p in root.parents[DEPTH].rglob("*") if p != root and root not in p.parents and p not in root.parents]


def _holds(capsys, argv, root: Path, codes=(0, 1, 2)) -> int:
    """Run `argv` in-process and check the invariant; returns the exit code."""
    before = _snapshot(root)
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc in codes, (argv, rc, err)
    assert "Traceback" not in err, err
    assert all(line.isprintable() for line in (out + err).splitlines()), (argv, out, err)   # a name split no line
    if rc == 0:
        assert out.strip() and not any(line.startswith("autotune: error") for line in lines), (argv, out, err)
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("autotune: error: "), (argv, err)
    after = _snapshot(root)
    assert {p: h for p, h in after.items() if p in before} == before, argv
    assert not _outside(root), (argv, _outside(root))
    return rc


def _settings(tier, quick: int):
    """Both tiers derandomized (CI gives the same verdict on the same code); AUTOTUNE_FUZZ_RANDOM=1
    explores new examples, which is how the cases docs/RELIABILITY.md counts were found."""
    name, scale = tier
    return settings(max_examples=quick * scale, deadline=None, database=None,
                    derandomize=os.environ.get("AUTOTUNE_FUZZ_RANDOM") != "1",
                    suppress_health_check=list(HealthCheck))


# --- model configs ----------------------------------------------------------------------------------

@st.composite
def model_configs(draw):
    cfg = dict(CONFIG)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(CONFIG) + ["num_local_experts", "n_routed_experts", "moe_top_k",
                                                     "intermediate_size", "mtp_num_hidden_layers", "attn_output_gate"]))
        if draw(st.booleans()):
            cfg.pop(key, None)
        else:
            cfg[key] = draw(values)
    shape = draw(st.sampled_from(["flat", "nested", "nested-odd"]))
    if shape == "nested":
        return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
                "text_config": cfg}
    if shape == "nested-odd":
        return {"text_config": draw(st.one_of(values, st.just(cfg)))}
    return cfg


@pytest.mark.parametrize("tier", TIERS)
def test_model_configs(tier, capsys):
    @_settings(tier, 25)
    @given(model_configs(), st.sampled_from(["shapes", "rank-model", "dry-run"]), st.sampled_from(["1", "2", "8"]))
    def prop(cfg, command, tp):
        with _example() as root:
            (root / "config.json").write_text(json.dumps(cfg))
            argv = {"shapes": ["shapes", "--model-config", "config.json", "--tp", tp],
                    "rank-model": ["rank-model", "--model-config", "config.json", "--tp", tp, "--out", "rank"],
                    "dry-run": ["run", "--model-config", "config.json", "--tp", tp, "--dry-run", "--target-device",
                                "NVIDIA H200", "--kernels", "triton_moe,fp8_gemm"]}[command]
            _holds(capsys, argv, root)
    prop()


# --- what is handed as an input file: any kind of file, any nesting ---------------------------------

INPUT_FLAGS = {   # flag -> the command it is given to (each reads the file before anything else)
    "--model-config": ["shapes", "--tp", "8"],
    "--search-space": ["shapes", "--model", "qwen3.5-35b-a3b", "--tp", "8"],
    "--replay": ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                 "--batch-sizes", "8", "--quiet", "--out", "out", "--storage", "sqlite:///a.db"],
    "--warm-start": ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
                     "--batch-sizes", "8", "--quiet", "--out", "out", "--storage", "sqlite:///a.db", "--replay", str(GRID)],
}


def _nested(kind: str, depth: int) -> str:
    return {"json-objects": '{"a": ' * depth + "1" + "}" * depth, "json-lists": "[" * depth + "]" * depth,
            "yaml-block": "".join("  " * i + "a:\n" for i in range(min(depth, 3000))) + "  " * min(depth, 3000) + "1\n",
            "yaml-flow": "x: " + "[" * depth + "]" * depth + "\n"}[kind]


@st.composite
def input_files(draw):
    """(kind, maker): a FIFO, a link to nothing, a folder, a device, an empty or binary file, a document
    nested up to 200000 deep, alone or as one line of a recording after a real header."""
    kind = draw(st.sampled_from(["fifo", "dangling-link", "folder", "dev-null", "empty", "binary", "nested",
                                 "nested-record", "folder-with-fifo-config"]))
    depth = draw(st.sampled_from([50, 1000, 5000, 200_000]))
    nest = draw(st.sampled_from(["json-objects", "json-lists", "yaml-block", "yaml-flow"]))

    def make(path: Path) -> Path:
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dangling-link":
            path.symlink_to(path.parent / "gone")
        elif kind == "folder":
            path.mkdir()
        elif kind == "dev-null":
            path.symlink_to("/dev/null")
        elif kind == "empty":
            path.write_text("")
        elif kind == "binary":
            path.write_bytes(b"\x1f\x8b\x08\x00\xff" + bytes(range(256)))
        elif kind == "nested":
            path.write_text(_nested(nest, depth))
        elif kind == "nested-record":
            with gzip.open(GRID, "rt") as f:
                header = f.readline()
            with gzip.open(path, "wt") as f:
                f.write(header + _nested("json-lists" if nest.startswith("yaml") else nest, depth) + "\n")
        else:
            path.mkdir()
            os.mkfifo(path / "config.json")
        return path
    return kind, make


@pytest.mark.parametrize("tier", TIERS)
def test_input_files_of_any_kind(tier, capsys):
    """Whatever kind of file an input flag names, the command says so in one line (never blocks on a
    FIFO, never recurses out of the stack), and changes nothing."""
    @_settings(tier, 20)
    @given(st.sampled_from(sorted(INPUT_FLAGS)), input_files())
    def prop(flag, made):
        kind, make = made
        with _example() as root:
            name = {"--search-space": "s.yaml", "--model-config": "config.json"}.get(flag, "r.jsonl.gz")
            make(root / name)
            rc = _holds(capsys, [*INPUT_FLAGS[flag][:1], *INPUT_FLAGS[flag][1:], flag, name], root)
            assert rc == 2, (flag, kind)           # none of these is an input: never "useful output"
    prop()


# --- search spaces ----------------------------------------------------------------------------------

@st.composite
def spaces(draw):
    text = SPACE
    for _ in range(draw(st.integers(1, 2))):
        how = draw(st.sampled_from(["value", "drop-line", "add-key", "family", "indent", "truncate"]))
        lines = text.splitlines()
        i = draw(st.integers(0, len(lines) - 1))
        if how == "value" and ":" in lines[i]:
            key = lines[i].split(":")[0]
            lines[i] = f"{key}: {json.dumps(draw(values))}"
        elif how == "drop-line":
            del lines[i]
        elif how == "add-key":
            lines.insert(i, f"{'  ' * draw(st.integers(0, 3))}{draw(st.sampled_from(['BLOCK_SIZE_Q', 'arch', 'sm75', 'params', 'gate_up']))}: "
                            f"{json.dumps(draw(values))}")
        elif how == "family":
            lines = [f"family: {draw(st.sampled_from(['triton_moe', 'fp8_gemm', '']))}" if line.startswith("family:")
                     else line for line in lines]
        elif how == "indent":
            lines[i] = " " + lines[i]
        else:
            lines = lines[:i]
        text = "\n".join(lines) + "\n"
    return text


@pytest.mark.parametrize("tier", TIERS)
def test_search_spaces(tier, capsys):
    @_settings(tier, 20)
    @given(spaces())
    def prop(text):
        with _example() as root:
            (root / "s.yaml").write_text(text)
            _holds(capsys, ["run", *ONE, "--replay", GRID, "--search-space", "s.yaml", "--dry-run",
                            "--batch-sizes", "8"], root)
    prop()


# --- recordings -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_recording(tmp_path_factory) -> list[str]:
    """The H200 grid at M=8 only: the lines of a recording a replay run reads in a second."""
    from autotune.measure.records import Cache, read_cache, write_cache

    grid = read_cache(GRID)
    small = Cache(grid.device, {k: m for k, m in grid.records.items() if m.M == 8}, grid.problems, grid.notes)
    path = tmp_path_factory.mktemp("rec") / "small.jsonl.gz"
    write_cache(path, small)
    with gzip.open(path, "rt") as f:
        return f.read().splitlines()


HEADER_PATHS = [("device", "name"), ("device", "sm"), ("device", "versions"), ("device",), ("problems",),
                ("notes", "compile_workers"), ("version",), ("kind",),
                ("problems", "E=512,N=128,K=4096,topk=10,bf16", "E"),
                ("problems", "E=512,N=128,K=4096,topk=10,bf16", "batch_sizes"),
                ("problems", "E=512,N=128,K=4096,topk=10,bf16", "dtype")]
RECORD_FIELDS = ["M", "config", "status", "time_us", "spread", "gemm", "problem", "error", "compile_s", "bench_s",
                 "samples", "tactics"]
# one edit of a recording: (what, where (a fraction of the file), which field, the value put there)
recording_edits = st.lists(st.tuples(st.sampled_from(["header", "record", "garbage", "truncate"]), st.floats(0, 1),
                                     st.integers(0, 99), values), min_size=1, max_size=3)


def _edited(lines: list[str], edits) -> str:
    """The recording's lines with `edits` applied (a small, readable falsifying example)."""
    lines = list(lines)
    for what, where, which, value in edits:
        i = min(len(lines) - 1, 1 + int(where * (len(lines) - 1)))
        if what == "header" and lines:
            try:
                head = json.loads(lines[0])
            except ValueError:
                continue
            path, node = HEADER_PATHS[which % len(HEADER_PATHS)], head
            for k in path[:-1]:
                node = node.setdefault(k, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict):
                node[path[-1]] = value
            lines[0] = json.dumps(head)
        elif what == "record" and len(lines) > 1:
            try:
                rec = json.loads(lines[i])
            except ValueError:
                continue                    # an earlier edit's garbage line
            if isinstance(rec, dict):
                rec[RECORD_FIELDS[which % len(RECORD_FIELDS)]] = value
                lines[i] = json.dumps(rec)
        elif what == "garbage":
            lines.insert(max(1, i), ["{", "[]", "null", "1", "{}", json.dumps(value)][which % 6])
        elif what == "truncate":
            lines = lines[: int(where * len(lines))]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("tier", TIERS)
def test_recordings(tier, capsys, small_recording):
    @_settings(tier, 8)
    @given(recording_edits, st.sampled_from(["run", "dry-run", "merge-caches"]))
    def prop(edits, command):
        with _example() as root:
            with gzip.open(root / "rec.jsonl.gz", "wt") as f:
                f.write(_edited(small_recording, edits))
            argv = {"run": ["run", *ONE, "--replay", "rec.jsonl.gz", "--trials", "1", "--batch-sizes", "8", "--quiet",
                            "--out", "out", "--storage", "sqlite:///a.db"],
                    "dry-run": ["run", *ONE, "--replay", "rec.jsonl.gz", "--dry-run"],
                    "merge-caches": ["merge-caches", "rec.jsonl.gz", str(GRID), "-o", "merged.jsonl.gz"]}[command]
            _holds(capsys, argv, root)
    prop()


# --- provenance -------------------------------------------------------------------------------------

PROV = json.loads((PROVENANCE_FOLDER / "provenance.json").read_text())


def _paths(node, prefix=()):
    """Every key path of a JSON document, down to 4 levels."""
    if len(prefix) < 4 and isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


PROV_PATHS = sorted({p for p in _paths(PROV) if "per_M" not in p or len(p) <= 4}, key=str)


# names a provenance may give its files: climbing out, absolute, with separators, empty
names = st.one_of(
    st.builds(lambda ups, tail: "../" * ups + tail, st.integers(1, DEPTH + 4),
              st.sampled_from(["escaped.json", "x/escaped.json", "", ".."])),
    st.sampled_from([f"{SANDBOX}/escaped.json", f"{SANDBOX}/up0/x.json", "a/b.json", "a\\b.json", "..\\escaped.json",
                     "configs/../../escaped.json", "./x.json", ".", "..", "", "/"]),
    st.text(alphabet="./\\ab", max_size=8))


def _rename(prov, draw) -> None:
    """One file name of `prov` (a tuned file's, its `_down` file's, its Triton version's or an
    overlay path) replaced by a drawn one."""
    where, name = draw(st.sampled_from(["key", "down_file", "triton", "overlay"])), draw(names)
    overlay, files = prov.get("shipped_overlay"), prov.get("files")
    if where == "overlay" and isinstance(overlay, dict) and isinstance(overlay.get("files"), list):
        overlay["files"].insert(0, name)
    elif isinstance(files, dict) and files:
        key = draw(st.sampled_from(sorted(files)))
        if where == "key":
            files[name] = files.pop(key)
        elif isinstance(files[key], dict):
            files[key][where] = name


@st.composite
def provenances(draw, shapes=True):
    """PROV with parts dropped or set to drawn values and file names replaced (`shapes=False`: names only)."""
    prov = json.loads(json.dumps(PROV))
    renames = draw(st.integers(0 if shapes else 1, 2))      # a renamed file alone: the rest as export wrote it
    for _ in range(draw(st.integers(0 if renames else 1, 3)) if shapes else 0):
        path = draw(st.sampled_from(PROV_PATHS))
        node = prov
        for k in path[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            if draw(st.booleans()):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = draw(values)
    for _ in range(renames):
        _rename(prov, draw)
    return draw(st.one_of(st.just(prov), st.just(prov), st.just(prov), values)) if shapes else prov


@pytest.mark.parametrize("tier", TIERS)
def test_provenance(tier, capsys):
    @_settings(tier, 15)
    @given(provenances(), st.sampled_from(["check", "only-drifted", "publish"]))
    def prop(prov, command):
        _provenance_holds(capsys, prov, command)
    prop()


@pytest.mark.parametrize("tier", TIERS)
def test_provenance_names(tier, capsys):
    """Only the names: the rest of the folder is as export left it, so publish gets as far as writing."""
    @_settings(tier, 10)
    @given(provenances(shapes=False), st.sampled_from(["check", "publish", "publish"]))
    def prop(prov, command):
        _provenance_holds(capsys, prov, command)
    prop()


def _provenance_holds(capsys, prov, command):
    """The invariant for `command` on the committed H200 folder with `prov` as its provenance.json;
    a refused publish also leaves the serving repo on its branch, clean, with no other branch."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-C", str(root / "serving"), *args], capture_output=True, text=True).stdout
    with _example() as root:
        folder = root / "NVIDIA_H200"
        shutil.copytree(PROVENANCE_FOLDER, folder)
        (folder / "provenance.json").write_text(json.dumps(prov).replace(SANDBOX, str(root.parents[DEPTH])))
        if command == "publish":
            repo = root / "serving"
            repo.mkdir()
            subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
            subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                            "--allow-empty", "-m", "init"], check=True)
        argv = {"check": ["check", folder, "--sglang-version", "0.5.23"],
                "only-drifted": ["run", "--only-drifted", folder, "--replay", GRID, "--dry-run",
                                 "--sglang-version", "0.5.16"],
                "publish": ["publish", "--to", root / "serving", "--from", folder]}[command]
        rc = _holds(capsys, argv, root)
        if command == "publish" and rc != 0:        # refused: the serving repo as it was
            assert (git("branch", "--list"), git("status", "--porcelain", "--ignored")) == ("* main\n", ""), argv


# --- the files of a tuned folder ---------------------------------------------------------------------

CHOICE = json.loads((PROVENANCE_FOLDER / "backend_choice.json").read_text())
CHOICE_PATHS = sorted(_paths(CHOICE), key=str)
BF16 = "configs/triton_3_6_0/E=512,N=128,device_name=NVIDIA_H200.json"
folder_edits = st.lists(st.tuples(st.sampled_from(["choice", "config", "server_args"]), st.integers(0, 10**6),
                                  st.booleans(), values), min_size=1, max_size=3)


def _edit_folder(folder: Path, edits) -> None:
    choice, config = json.loads(json.dumps(CHOICE)), json.loads((folder / BF16).read_text())
    for what, which, drop, value in edits:
        if what == "server_args":
            lines = (folder / "server_args.yaml").read_text().splitlines()
            lines.insert(which % (len(lines) + 1), f"{['tp-size', 'moe-runner-backend', '# x', '- a', ':'][which % 5]}: "
                                                    f"{json.dumps(value)}" if not drop else "  : [")
            (folder / "server_args.yaml").write_text("\n".join(lines) + "\n")
            continue
        doc, paths = (choice, CHOICE_PATHS) if what == "choice" else (config, sorted(_paths(config), key=str))
        path, node = paths[which % len(paths)], doc
        for k in path[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None) if drop else node.__setitem__(path[-1], value)
    (folder / "backend_choice.json").write_text(json.dumps(choice))
    (folder / BF16).write_text(json.dumps(config))


@pytest.mark.parametrize("tier", TIERS)
def test_tuned_folder_files(tier, capsys):
    @_settings(tier, 12)
    @given(folder_edits, st.sampled_from(["check", "merge-choices", "merge-choices-onto", "publish"]))
    def prop(edits, command):
        with _example() as root:
            folder = root / "NVIDIA_H200"
            shutil.copytree(PROVENANCE_FOLDER, folder)
            _edit_folder(folder, edits)
            if command == "merge-choices-onto":       # the edited folder is the destination
                shutil.copytree(PROVENANCE_FOLDER, root / "src" / "NVIDIA_H200")
            if command == "publish":
                import subprocess
                subprocess.run(["git", "init", "-q", "-b", "main", str(root / "serving")], check=True)
                subprocess.run(["git", "-C", str(root / "serving"), "-c", "user.name=t", "-c", "user.email=t@t",
                                "commit", "-q", "--allow-empty", "-m", "init"], check=True)
            argv = {"check": ["check", folder, "--sglang-version", "0.5.23"],
                    "merge-choices": ["merge-choices", folder, "--out", root / "merged"],
                    "merge-choices-onto": ["merge-choices", root / "src" / "NVIDIA_H200", "--out", root],
                    "publish": ["publish", "--to", root / "serving", "--from", folder]}[command]
            rc = _holds(capsys, argv, root) if command != "merge-choices-onto" else None
            if command == "merge-choices-onto":
                # merging into the edited folder: its server_args.yaml and backend_choice.json are ours to
                # replace, so only the other files must stay; the user's YAML lines must survive
                before = (folder / "server_args.yaml").read_text()
                rc = main([str(a) for a in argv])
                capsys.readouterr()
                if rc == 0:
                    from autotune.export.server_args import user_lines
                    kept = [line for part in user_lines(before) for line in part]
                    after = (folder / "server_args.yaml").read_text().splitlines()
                    assert all(line in after for line in kept), (kept, after)
    prop()


# --- flags ------------------------------------------------------------------------------------------

NUMERIC = {
    "run": ["--trials", "--neighbours", "--workers", "--timeout", "--seed", "--skew", "--routings", "--budget",
            "--tp", "--ep", "--batch-sizes", "--replay-realtime", "--gpus", "--out", "--json", "--sglang-version",
            "--kernels", "--dtype", "--skip-backends", "--device-name", "--target-device", "--study"],
    "shapes": ["--tp", "--ep", "--batch-sizes", "--target-sm", "--dtype", "--model", "--shapes"],
    "check": ["--batch-sizes", "--sglang-version"],
    "rank-model": ["--tp", "--layers"],
    "validate": ["--tp", "--repeats", "--min-effect", "--batch-sizes", "--layers", "--port", "--input-len"],
    "record": ["--shard", "--budget", "--workers"],
    "merge-choices": ["--out"],
}


def _base(command: str) -> list:
    return {"run": ["run", *ONE, "--replay", GRID, "--dry-run", "--batch-sizes", "8"],
            "shapes": ["shapes", "--model", "qwen3.5-35b-a3b", "--tp", "8"],
            "check": ["check", PROVENANCE_FOLDER, "--no-retime"],
            "rank-model": ["rank-model", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--out", "rank"],
            "validate": ["validate", "--engine", "harness", "--model", "qwen3.5-35b-a3b", "--configs", "none"],
            "record": ["record", "--cache", "c.jsonl.gz", "--model", "qwen3.5-35b-a3b"],
            "merge-choices": ["merge-choices", PROVENANCE_FOLDER]}[command]


@pytest.mark.parametrize("tier", TIERS)
def test_flags(tier, capsys):
    @_settings(tier, 30)
    @given(st.sampled_from(sorted(NUMERIC)).flatmap(lambda c: st.tuples(st.just(c), st.sampled_from(NUMERIC[c]))),
           flag_text)
    def prop(command_flag, text):
        command, flag = command_flag
        with _example() as root:
            _holds(capsys, [*_base(command), f"{flag}={text}"], root)
    prop()


# --- issue 37: the formats parsed by the library that owns them ---------------------------------------

# storage URLs: what SQLAlchemy's parser and SQLite read, generated (file names with a query string,
# URI forms, options SQLite reads or drops, repeated ones, values the driver refuses)
url_names = st.one_of(
    st.sampled_from(["a.db", "sub/a.db", "a b.db", "a#b.db", "a%20b.db", "%61.db", "a%2561.db", "sub/../a.db",
                     "é.db", ":memory:", "", "file:u.db", "file::memory:", "file:sub/u.db", "file:u%3Fx.db",
                     "file:", "?.db", "a.db?", "a&b.db"]),
    st.text(alphabet="ab.%?#&=:/ é", min_size=1, max_size=10)).filter(lambda name: not name.startswith("/"))
# (a name from '/' is a file at the machine's root: absolute names are drawn inside the sandbox only)
url_options = st.lists(st.tuples(
    st.sampled_from(["timeout", "mode", "uri", "immutable", "cache", "check_same_thread", "isolation_level", "nolock",
                     "vfs", "detect_types", "x"]),
    st.sampled_from(["30", "0", "-1", "nan", "1e999", "ro", "rw", "rwc", "memory", "true", "false", "1", "shared", "",
                     "soon", "unix-none"])), max_size=3)
storage_urls = st.builds(lambda scheme, name, options: scheme + name + ("?" + "&".join(f"{k}={v}" for k, v in options)
                                                                        if options else ""),
                         st.sampled_from(["sqlite:///", "sqlite://", f"sqlite:///{SANDBOX}/", "sqlite+pysqlite:///"]),
                         url_names, url_options)


def _made(root: Path) -> set:
    return {p.resolve() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("tier", TIERS)
def test_storage_urls_name_the_file_sqlite_opens(tier):
    """Whatever the URL, parse() either refuses it in one line, creating nothing, or names exactly the
    file SQLAlchemy and SQLite then open (none for a database in memory), and calls it read-only
    exactly when SQLite refuses to write it."""
    import sqlalchemy

    from autotune.store.storage_url import StorageUrlError, parse

    @_settings(tier, 40)
    @given(storage_urls)
    def prop(url):
        with _example() as root:
            (root / "sub").mkdir()
            url = url.replace(SANDBOX, str(root))
            try:
                target = parse(url)
            except StorageUrlError as e:
                assert "\n" not in str(e) and not _made(root), (url, str(e))
                return
            assert target.sqlite and not _made(root), url
            if target.read_only:
                return        # it names a file that must exist first: test_storage_url makes one
            engine = sqlalchemy.create_engine(url)
            try:
                with engine.begin() as c:
                    c.execute(sqlalchemy.text("CREATE TABLE t (x)"))
            except sqlalchemy.exc.OperationalError as e:
                assert "unable to open" in str(e) and not _made(root), (url, str(e))   # a folder not there
                return
            finally:
                engine.dispose()
            made = _made(root.parents[DEPTH])
            assert made == (set() if target.in_memory else {target.file.resolve()}), (url, target, made)
    prop()


@pytest.mark.parametrize("tier", TIERS)
def test_storage_urls_on_the_command_line(tier, capsys):
    """The same URLs given to a run: the invariant, and a user's database is never written into."""
    import sqlite3

    @_settings(tier, 10)
    @given(storage_urls)
    def prop(url):
        with _example() as root:
            (root / "sub").mkdir()
            with sqlite3.connect(root / "a.db") as c:           # the user's own database, wherever a URL names it
                c.execute("CREATE TABLE mine (x)")
            _holds(capsys, ["run", *ONE, "--replay", GRID, "--batch-sizes", "8", "--trials", "1", "--quiet",
                            "--out", "out", "--storage", url.replace(SANDBOX, str(root))], root)
    prop()


# recording headers: the names and versions a header hands us, as any text
header_text = st.one_of(st.text(max_size=12), st.sampled_from(
    ["NVIDIA H200", "NVIDIA\nH200", "NVIDIA\tH200", "NVIDIA H200 ", " NVIDIA", "NVIDIA/H200", "NVIDIA_H200,dtype=x",
     "3.6.0", "3.6.0/../../x", "3.6", "..", "", "3.6.0\n", "é"]), values)
header_fields = st.sampled_from([("device", "name"), ("device", "versions", "triton"), ("device", "driver"),
                                 ("device", "smem_optin"), ("device", "sm"), ("device", "kind"),
                                 ("device", "gpu_count"), ("notes", "compile_workers")])


@pytest.mark.parametrize("tier", TIERS)
def test_recording_headers(tier, capsys, small_recording):
    """A header whose names or numbers are any value: the invariant, and what an accepted one makes
    the run write has plain names (the device's name and Triton version name files and folders)."""
    @_settings(tier, 12)
    @given(st.lists(st.tuples(header_fields, header_text), min_size=1, max_size=2),
           st.sampled_from(["run", "merge-caches"]))
    def prop(edits, command):
        with _example() as root:
            head = json.loads(small_recording[0])
            for path, value in edits:
                node = head
                for k in path[:-1]:
                    node = node.setdefault(k, {})
                node[path[-1]] = value
            with gzip.open(root / "rec.jsonl.gz", "wt") as f:
                f.write("\n".join([json.dumps(head), *small_recording[1:]]) + "\n")
            argv = {"run": ["run", *ONE, "--replay", "rec.jsonl.gz", "--trials", "1", "--batch-sizes", "8", "--quiet",
                            "--out", "out", "--storage", "sqlite:///a.db"],
                    "merge-caches": ["merge-caches", "rec.jsonl.gz", "-o", "merged.jsonl.gz"]}[command]
            if _holds(capsys, argv, root) == 0:
                written = [p.relative_to(root) for p in root.rglob("*") if p.name != "rec.jsonl.gz"]
                assert all(part.isascii() and part.isprintable() for p in written for part in p.parts), written
    prop()


# flags: several at once, repeated, contradicting each other, empty
FLAG_VALUES = {"--model": ["qwen3.5-397b-a17b", "qwen3.5-35b-a3b", ""], "--shapes": ["qwen3.5", ""],
               "--model-config": ["config.json"], "--tp": ["8", "1,8"], "--dtype": ["bf16", "", "bf16,bf16"],
               "--kernels": ["triton_moe", "fp8_gemm", "triton_moe,fp8_gemm"], "--replay": [str(GRID), ""],
               "--replay-realtime": ["0", "1"], "--batch-sizes": ["8", "8,8"],
               "--target-device": ["NVIDIA H200"], "--search-space": [str(ROOT / "search_spaces/triton_moe.yaml")],
               "--only-drifted": [str(PROVENANCE_FOLDER)], "--gpus": ["0", "0,0"], "--checkpoint": ["moe_bf16"],
               "--study": ["s", ""], "--sglang-version": ["0.5.23", ""], "--dry-run": [None]}
SINGLE = {f for f, v in FLAG_VALUES.items() if v != [None]}
EXCLUSIVE = [{"--model", "--model-config", "--shapes", "--only-drifted"}]


@pytest.mark.parametrize("tier", TIERS)
def test_flags_together(tier, capsys):
    """Any few flags of `run`, each maybe twice: the invariant, and a single-valued flag given twice or
    two flags of one exclusive group are always a refusal."""
    @_settings(tier, 25)
    @given(st.lists(st.sampled_from(sorted(FLAG_VALUES)).flatmap(
        lambda f: st.tuples(st.just(f), st.sampled_from(FLAG_VALUES[f]))), min_size=1, max_size=6))
    def prop(flags):
        with _example() as root:
            (root / "config.json").write_text(json.dumps(CONFIG))
            argv = ["run", "--out", "out", "--storage", "sqlite:///a.db", "--trials", "1", "--quiet",
                    *[a for f, v in flags for a in ((f,) if v is None else (f, v))]]
            rc = _holds(capsys, argv, root)
            names = [f for f, _ in flags]
            if any(names.count(f) > 1 for f in SINGLE) or any(len(group & set(names)) > 1 for group in EXCLUSIVE):
                assert rc == 2, argv
    prop()


# --- issue 44: the process's environment ---------------------------------------------------------------
# What a shell, a hook or a container leaves around a command: git's own variables naming another repository
# (or nothing, or a file), a PATH without git or naming a file, a TMPDIR missing or a file, a working folder
# inside another repository or deleted under the command. @OTHER@: another repository beside the serving
# one; @HERE@: the example's folder.

git_variables = st.dictionaries(
    st.sampled_from(["GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR",
                     "GIT_CEILING_DIRECTORIES", "GIT_CONFIG_GLOBAL", "GIT_NAMESPACE", "GIT_AUTHOR_DATE"]),
    st.sampled_from(["@OTHER@/.git", "@OTHER@", "@OTHER@/.git/index", "@HERE@/missing", "@HERE@/file", ""]),
    min_size=1, max_size=3)
environments = st.fixed_dictionaries({
    "git": git_variables,
    "PATH": st.sampled_from(["@PATH@", "", "@HERE@/bin", "@HERE@/file", "@HERE@/missing", "@HERE@/bin:@PATH@"]),
    "TMPDIR": st.sampled_from([None, "@HERE@/tmp", "@HERE@/missing", "@HERE@/file", ""]),
    "cwd": st.sampled_from(["here", "other-repo", "deleted"]),
    "command": st.sampled_from(["publish", "merge-choices"])})


@contextlib.contextmanager
def _environment(env: dict, root: Path, other: Path):
    """os.environ (and tempfile's cached folder, and the working folder) as `env` says, while the block runs."""
    import tempfile

    def filled(v: str) -> str:
        return v.replace("@OTHER@", str(other)).replace("@HERE@", str(root)).replace("@PATH@", os.environ["PATH"])
    saved, saved_tmp = dict(os.environ), tempfile.tempdir
    os.environ.update({k: filled(v) for k, v in env["git"].items()})
    os.environ["PATH"] = filled(env["PATH"])
    if env["TMPDIR"] is not None:
        os.environ["TMPDIR"] = filled(env["TMPDIR"])
    tempfile.tempdir = None
    cwd = {"here": root, "other-repo": other, "deleted": root / "gone"}[env["cwd"]]
    cwd.mkdir(exist_ok=True)
    os.chdir(cwd)
    if env["cwd"] == "deleted":
        cwd.rmdir()
    try:
        yield
    finally:
        os.chdir(root)
        os.environ.clear()
        os.environ.update(saved)
        tempfile.tempdir = saved_tmp


@pytest.mark.parametrize("tier", TIERS)
def test_environments(tier, capsys, tmp_path_factory):
    """publish and merge-choices under any such environment: the invariant; another repository (its refs,
    HEAD, index and files) byte-identical whatever GIT_* names it; the serving repo as found, or holding the
    one new branch of an exit 0; and nothing left in the TMPDIR the command saw."""
    from tests.fakes.tuned_folders import git_state, serving_repo, tuned

    @_settings(tier, 8)
    @given(environments)
    def prop(env):
        with _example() as root:
            (root / "bin").mkdir()
            (root / "tmp").mkdir()
            (root / "file").write_text("a file where a folder belongs\n")
            (root / "elsewhere").mkdir()
            other, serving = serving_repo(root / "elsewhere"), serving_repo(root)
            src = tuned(root, "t", {1: 10.0})
            (root / "merged").mkdir()
            other_state, serving_state = git_state(other), git_state(serving)
            argv = (["publish", "--to", serving, "--from", src] if env["command"] == "publish" else
                    ["merge-choices", str(PROVENANCE_FOLDER), "--out", root / "merged"])
            with _environment(env, root, other):
                rc = _holds(capsys, argv, root)
            assert git_state(other) == other_state, env
            if env["command"] == "publish" and rc == 0:
                assert git_state(serving)[2].count("\n") == serving_state[2].count("\n") + 1, env  # one branch more
            elif env["command"] == "publish":
                assert git_state(serving) == serving_state, env
            assert list((root / "tmp").iterdir()) == [], env
            if env["cwd"] == "deleted":
                assert rc == 2, env
    prop()


def test_the_invariant_fails_where_it_should(capsys):
    """The checker itself: an exit 0 without output, or two error lines, is caught."""
    with _example() as root:
        with pytest.raises(AssertionError):
            _holds(capsys, ["shapes", "--model", "qwen9"], root, codes=(0,))
        (root / "x").write_text("mine")
        import autotune.cli as cli
        real = cli.build_parser

        def clobber(args):
            (root / "x").write_text("changed")
            print("done")
            return 0
        parser = real()
        parser._subparsers._group_actions[0].choices["shapes"].set_defaults(fn=clobber)
        cli.build_parser = lambda: parser
        try:
            with pytest.raises(AssertionError):
                _holds(capsys, ["shapes"], root)              # a pre-existing file changed
        finally:
            cli.build_parser = real


# --- what the properties found (docs/RELIABILITY.md counts them), pinned as plain examples ------------

def _found_space(root):
    (root / "s.yaml").write_text("  BLOCK_SIZE_Q: null\n" + SPACE)     # YAML's error spans four lines
    return ["run", *ONE, "--replay", GRID, "--search-space", "s.yaml", "--dry-run", "--batch-sizes", "8"]


def _found_arch(root, lines):
    (root / "s.yaml").write_text(SPACE.replace("  sm90: {}", "  sm90: 5"))   # a section that is not a mapping
    return ["run", *ONE, "--replay", GRID, "--search-space", "s.yaml", "--dry-run", "--batch-sizes", "8"]


def _found_recording(edit, command):
    def make(root, lines):
        with gzip.open(root / "rec.jsonl.gz", "wt") as f:
            f.write(_edited(lines, [edit]))
        return (["merge-caches", "rec.jsonl.gz", str(GRID), "-o", "merged.jsonl.gz"] if command == "merge" else
                ["run", *ONE, "--replay", "rec.jsonl.gz", "--trials", "1", "--batch-sizes", "8", "--quiet",
                 "--out", "out", "--storage", "sqlite:///a.db"])
    return make


def _found_folder(edit_prov=None, edit_choice=None, command="publish"):
    def make(root, lines):
        folder = root / "NVIDIA_H200"
        shutil.copytree(PROVENANCE_FOLDER, folder)
        if edit_prov:
            prov = json.loads((folder / "provenance.json").read_text())
            (folder / "provenance.json").write_text(json.dumps(edit_prov(prov)))
        if edit_choice:
            choice = json.loads((folder / "backend_choice.json").read_text())
            edit_choice(choice)
            (folder / "backend_choice.json").write_text(json.dumps(choice))
        if command == "publish":
            import subprocess
            subprocess.run(["git", "init", "-q", "-b", "main", str(root / "serving")], check=True)
            subprocess.run(["git", "-C", str(root / "serving"), "-c", "user.name=t", "-c", "user.email=t@t",
                            "commit", "-q", "--allow-empty", "-m", "init"], check=True)
            return ["publish", "--to", root / "serving", "--from", folder]
        return ["merge-choices", folder, "--out", root / "merged"]
    return make


def _per_m(value):
    def edit(prov):
        next(iter(prov["files"].values()))["per_M"]["1"] = value
        return prov
    return edit


FOUND = {
    "fuzz-error-spans-lines": lambda root, lines: _found_space(root),
    "fuzz-space-section-not-a-mapping": _found_arch,
    "fuzz-provenance-not-an-object": _found_folder(lambda prov: 7),
    "fuzz-record-field-type": _found_recording(("record", 0.5, 0, "eight"), "merge"),
    "fuzz-recording-versions-not-an-object": _found_recording(("header", 0, 2, 3), "merge"),
    "fuzz-replay-versions-not-an-object": _found_recording(("header", 0, 2, 3), "run"),
    "fuzz-record-cost-null": _found_recording(("record", 0.0, 8, None), "run"),
    "fuzz-provenance-per-m-not-an-object": _found_folder(_per_m(5)),
    "fuzz-provenance-file-entry-shape": _found_folder(_per_m({"tuned_us": "fast"})),
    "fuzz-choices-device-name-a-list": _found_folder(edit_choice=lambda c: c["device"].update(name=[]),
                                                     command="merge-choices"),
    "fuzz-choices-device-name-null": _found_folder(edit_choice=lambda c: c["device"].update(name=None),
                                                   command="merge-choices"),
    # issue 37's sweep
    "fuzz-path-flag-control-character": lambda root, lines: ["merge-choices", PROVENANCE_FOLDER, "--out=\x1b"],
    "fuzz-storage-uri-without-a-name": lambda root, lines: ["run", *ONE, "--replay", GRID, "--dry-run",
                                                           "--storage", "sqlite://?uri=true"],
    "fuzz-header-compile-workers-null": _found_recording(("header", 0, HEADER_PATHS.index(("notes", "compile_workers")),
                                                          None), "run"),
}


@pytest.mark.parametrize("case", list(FOUND))
def test_cases_the_property_suite_found(case, capsys, small_recording):
    """Each was a traceback (or a message of several lines) before the fix named in docs/RELIABILITY.md."""
    with _example() as root:
        assert _holds(capsys, FOUND[case](root, small_recording), root) == 2
