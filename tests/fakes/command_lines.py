"""The reliability cases' command lines (a replayed `run`, `export`), a storage one worker searched, files written."""
from pathlib import Path

from autotune.cli import main
from tests.conftest import GRID

RUN = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
       "--quiet"]


def small_run(t, *extra, replay=True, bs="8"):
    """A replay run of one problem at one batch size, 6 trials a study: what each case refuses or writes
    is the same at any budget (the default budget's 40 cost a case up to 30 s on a loaded machine)."""
    trials = [] if "--trials" in extra else ["--trials", "6"]
    return [*RUN, *trials, "--out", str(t / "out"), "--storage", f"sqlite:///{t / 'a.db'}",
            *(["--replay", str(GRID)] if replay else []), *(["--batch-sizes", bs] if bs else []), *extra]


def without(argv: list, *flags) -> list:
    """`argv` less each of `flags` and its value."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        else:
            out.append(a)
    return out


def write_file(path: Path, content) -> str:
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return str(path)


EXPORT = ["export", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--replay", str(GRID),
          "--batch-sizes", "8", "--quiet"]


def worked_storage(t: Path) -> Path:
    """A storage one worker searched (3 trials per study) for EXPORT's problem."""
    db = t / "shared.db"
    assert main(["worker", *EXPORT[1:-1], "--trials", "3", "--storage", f"sqlite:///{db}"]) == 0
    return db
