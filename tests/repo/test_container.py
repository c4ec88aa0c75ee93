"""The image, built and run: what scripts/build_image.sh built (AUTOTUNE_IMAGE, default autotune:cu130),
run with podman or docker (the engine scripts/container_lib.sh picks), on the CPU: replays stand in
for the GPU, labelled as everywhere.

Marked `container`: they run only when selected (-m container: .ci/run's container phase, after
scripts/container_setup.sh and scripts/build_image.sh). Without an engine or the image they skip with
the reason, unless AUTOTUNE_REQUIRE_CONTAINER=1 (CI) makes that a failure. An image built from other
sources than this checkout's is a failure: rebuild it.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import GRID, ROOT, wait_for_trials
from tests.fakes.main_job import assert_as_recorded, main_job, outputs

pytestmark = pytest.mark.container

IMAGE = os.environ.get("AUTOTUNE_IMAGE", "autotune:cu130")
TUNER_UID = 1000            # the Dockerfile's `tuner`
# The problem of tests/run/test_shared_study.py's stop test: 4 studies, a few seconds of replay.
RUN = ["run", "--model", "qwen3.5-397b-a17b", "--tp", "8", "--dtype", "bf16", "--kernels", "triton_moe",
       "--batch-sizes", "1,8", "--trials", "10", "--quiet"]
# What the image holds of the checkout (the Dockerfile's COPY): its digest, here and inside.
SOURCE_DIGEST = """
import hashlib, pathlib, sys
root, h = pathlib.Path(sys.argv[1]), hashlib.sha256()
for p in sorted([*root.glob("autotune/**/*"), *root.glob("search_spaces/**/*"), root / "pyproject.toml"]):
    if p.is_file() and "__pycache__" not in p.parts:
        h.update(str(p.relative_to(root)).encode() + b"\\0" + p.read_bytes())
print(h.hexdigest())
"""


def unavailable(reason: str):
    if os.environ.get("AUTOTUNE_REQUIRE_CONTAINER") == "1":
        pytest.fail(f"AUTOTUNE_REQUIRE_CONTAINER=1 but {reason}")
    pytest.skip(reason)


@functools.cache
def engine_or_reason() -> tuple[str | None, str]:
    out = subprocess.run(["bash", "-c", "source scripts/container_lib.sh && container_runtime"], cwd=ROOT,
                         capture_output=True, text=True)
    return (out.stdout.strip(), "") if out.returncode == 0 else (None, out.stdout.strip())


def engine(*args, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """The container engine's command line, run to its end."""
    out = subprocess.run([engine_or_reason()[0], *args], capture_output=True, text=True, timeout=timeout)
    assert not check or out.returncode == 0, f"{' '.join(args[:3])}: exit {out.returncode}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="session")
def image() -> str:
    name, reason = engine_or_reason()
    if name is None:
        unavailable(reason)
    if engine("image", "inspect", IMAGE, check=False).returncode != 0:
        unavailable(f"no image {IMAGE} (bash scripts/build_image.sh builds it)")
    here = subprocess.run([sys.executable, "-c", SOURCE_DIGEST, str(ROOT)], capture_output=True, text=True).stdout
    inside = engine("run", "--rm", "--network", "host", "--entrypoint", "python", IMAGE, "-c", SOURCE_DIGEST,
                    "/opt/autotune").stdout
    assert inside == here, f"{IMAGE} holds other sources than this checkout: rebuild it (bash scripts/build_image.sh)"
    return IMAGE


def base_of(image: str) -> str:
    """The image the autotune image was built FROM (the label the Dockerfile sets from CUDA_IMAGE)."""
    labels = json.loads(engine("image", "inspect", "--format", "{{json .Labels}}", image).stdout) or {}
    base = labels.get("org.opencontainers.image.base.name")
    if not base:
        unavailable(f"{image} has no base-image label (built before the Dockerfile set it): rebuild it")
    return base


def in_image(image: str, *args, opts=(), timeout: float = 900) -> subprocess.CompletedProcess:
    """`autotune ARGS` in a fresh container of the image (host network, removed after)."""
    return engine("run", "--rm", "--network", "host", *opts, image, *args, timeout=timeout, check=False)


def tuner_folder(path: Path) -> Path:
    """A host folder the image's user can write, as a user's own checkout is (uid 1000 owns it)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, TUNER_UID, TUNER_UID)
    else:
        path.chmod(0o777)
    return path


@pytest.fixture
def names():
    """Unique names for containers, volumes and networks; each removed after the test."""
    made = {"container": [], "volume": [], "network": []}
    tag = uuid.uuid4().hex[:8]

    def name(kind: str, what: str) -> str:
        made[kind].append(f"autotune-test-{tag}-{what}")
        return made[kind][-1]
    yield name
    for kind in ("container", "volume", "network"):
        for n in made[kind]:
            # -v: with the container, the anonymous volumes its image declares (/cache)
            args = ("rm", "-f", "-v", n) if kind == "container" else (kind, "rm", "-f", n)
            engine(*args, check=False)


def without_run_facts(provenance: str) -> dict:
    """provenance.json less what belongs to the process that wrote it, not to its result: the time,
    the command line, where the storage was, how much of the measuring this process did, its clock."""
    prov = json.loads(provenance)
    for entry in prov["files"].values():
        entry.pop("date")
        for key in ("command", "storage", "measured_this_run", "complete", "device_seconds", "wall_seconds"):
            entry["run"].pop(key)
    return prov


def assert_same_files(a: Path, b: Path) -> int:
    """Two exported folders hold the same files, byte for byte (provenance.json: less its run facts)."""
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert any(f.endswith("provenance.json") for f in files), files
    for f in files:
        if f.endswith("provenance.json"):
            assert without_run_facts((a / f).read_text()) == without_run_facts((b / f).read_text()), f
        else:
            assert (a / f).read_bytes() == (b / f).read_bytes(), f
    return len(files)


def test_the_image_runs_the_cli_and_reads_its_search_spaces_as_the_host_does(image, tmp_path):
    # `shapes --target-sm` filters each architecture's space (search_spaces/, and the SM120 compile
    # facts in search_spaces/compiled/): the installed package must find them.
    for args in (["--version"], ["shapes", "--shapes", "qwen3.5"],
                 ["shapes", "--shapes", "qwen3.5", "--target-sm", "90", "--target-sm", "120"]):
        inside = in_image(image, *args)
        host = subprocess.run([sys.executable, "-m", "autotune", *args], cwd=tmp_path, capture_output=True, text=True)
        assert inside.returncode == host.returncode == 0, inside.stderr
        assert inside.stdout == host.stdout, args


def test_the_readme_main_job_in_the_image_writes_what_the_host_does_as_its_user(image, tmp_path, names):
    """The README's main job run inside, the output folder a volume: the same files, storage and
    stdout as the host's run (tests/repo/test_readme_main_job.py's recording of it), written by `tuner` and
    readable by anyone on the host; the JIT/memo cache volume written by `tuner` too."""
    work = tuner_folder(tmp_path / "work")
    args = main_job()
    recordings = args[args.index("--replay") + 1].split(",")
    for rel in recordings:       # at the README's relative paths, read from the working folder
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, work / rel)
    cache = names("volume", "cache")
    out = in_image(image, "run", *args, opts=["-v", f"{work}:/work", "-v", f"{cache}:/cache"])
    assert out.returncode == 0, out.stderr[-3000:]
    for rel in recordings:
        (work / rel).unlink()
    assert_as_recorded(outputs(work, out.stdout))
    ours = {Path(rel).parts[0] for rel in recordings}          # the folders the test made
    written = [p for p in work.rglob("*") if p.relative_to(work).parts[0] not in ours]
    assert written and all(p.stat().st_uid == TUNER_UID for p in written)
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in written if p.is_file())
    assert all(p.stat().st_mode & 0o555 == 0o555 for p in written if p.is_dir())
    listing = engine("run", "--rm", "--network", "host", "-v", f"{cache}:/cache", "--entrypoint", "find", image,
                     "/cache", "-mindepth", "1", "-printf", "%u %p\\n").stdout.splitlines()
    assert any(line.endswith(".json") for line in listing), listing      # SGLang's loader memo
    assert {line.split()[0] for line in listing} == {"tuner"}, listing


def test_a_stop_mid_run_exits_143_and_the_same_command_resumes_to_an_uninterrupted_runs_files(image, tmp_path, names):
    """`podman stop` / `docker stop` (SIGTERM to the container's autotune) mid-search: exit 143 with
    its one line; the same `run` line again finishes, and writes what a run never stopped writes."""
    work = tuner_folder(tmp_path / "work")
    shutil.copyfile(GRID, work / "grid.jsonl.gz")
    command = [*RUN, "--replay", "grid.jsonl.gz", "--replay-realtime", "2", "--storage", "sqlite:///s.db",
               "--out", "out"]
    name = names("container", "stopped")
    first = subprocess.Popen([engine_or_reason()[0], "run", "--name", name, "--network", "host", "-v", f"{work}:/work",
                              image, *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_trials(first, work / "s.db", 4, "the run in the container")
    engine("stop", "--time", "60", name)             # SIGTERM; SIGKILL only after 60 s
    said, _ = first.communicate(timeout=120)
    assert first.returncode == 143, said[-3000:]
    assert "Traceback" not in said and said.strip().splitlines()[-1].startswith("autotune: stopped by SIGTERM")
    assert not (work / "out").exists() or not any((work / "out").rglob("*.json"))
    again = in_image(image, *command, opts=["-v", f"{work}:/work"])
    assert again.returncode == 0, again.stderr[-3000:]
    host = tmp_path / "host"
    host.mkdir()
    shutil.copyfile(GRID, host / "grid.jsonl.gz")
    whole = subprocess.run([sys.executable, "-m", "autotune", *command], cwd=host, capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert assert_same_files(work / "out", host / "out") > 2


# --- the shared-study deployment: deploy/docker-compose.yml's services, run as the file says ---------

COMPOSE = ROOT / "deploy/docker-compose.yml"
# The study the workers search, small enough to be searched whole (so any interleaving of two workers
# measures every config, and selection sees what one process sees): 8 configs per GEMM; one problem
# (Qwen3.5 at TP 8), 2 GEMMs x 2 batch sizes.
SMALL_SPACE = """family: triton_moe
params: {BLOCK_SIZE_M: [16, 64], BLOCK_SIZE_N: [64, 128], BLOCK_SIZE_K: [128], GROUP_SIZE_M: [1, 16],
         num_warps: [4], num_stages: [3]}
gemm_params: {gate_up: {USE_TMA: [false]}, down: {USE_TMA: [false]}}
"""
# Appended to the compose commands: a replay instead of the GPU, the small space and budget. A study
# searched whole ends short of its trial budget, which export calls partial: hence --partial.
REPLAY_ARGS = ["--replay", "/data/grid.jsonl.gz", "--search-space", "/data/space.yaml", "--dtype", "bf16",
               "--batch-sizes", "1,8", "--trials", "20", "--quiet"]


def service_run_args(service: dict, volumes: dict, binds: dict) -> list[str]:
    """`run` options for a compose service: its environment, and its volumes with named ones renamed
    (`volumes`) and host folders (relative to deploy/) replaced (`binds`). Everything else a service
    names is refused, so the compose file cannot grow what this test does not run."""
    known = {"image", "build", "environment", "volumes", "command", "depends_on", "restart", "healthcheck",
             "deploy", "profiles"}
    assert set(service) <= known, f"the test does not run {set(service) - known}"
    opts = []
    for key, value in service.get("environment", {}).items():
        opts += ["-e", f"{key}={value}"]
    for spec in service.get("volumes", []):
        src, target = spec.split(":", 1)
        opts += ["-v", f"{binds[src] if src in binds else volumes[src]}:{target}"]
    return opts


def wait_for_line(container: str, text: str, timeout: float = 300) -> None:
    """Until the container's output has a line holding `text` (followed as it is written)."""
    seen = threading.Event()
    follow = subprocess.Popen([engine_or_reason()[0], "logs", "-f", container], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)

    def read():
        for line in follow.stdout:
            if text in line:
                seen.set()
                return
    threading.Thread(target=read, daemon=True).start()
    try:
        assert seen.wait(timeout), f"{container}: no '{text}' in {timeout:.0f} s"
    finally:
        follow.kill()
        follow.wait()


def measured_trials(url: str) -> int:
    """COMPLETE trials holding a measurement, over the run's studies in the storage at `url`."""
    storage = optuna.storages.RDBStorage(url.replace("postgresql://", "postgresql+psycopg://"))
    n = 0
    for summary in optuna.get_all_study_summaries(storage):
        if summary.study_name.startswith("triton_moe|"):
            trials = optuna.load_study(study_name=summary.study_name, storage=storage).trials
            n += sum(t.state == optuna.trial.TrialState.COMPLETE and "measurement" in t.user_attrs for t in trials)
    return n


def test_two_workers_on_the_compose_postgres_export_what_one_process_writes(image, tmp_path, names):
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    pg, workers, export = services["postgres"], [services["worker-0"], services["worker-1"]], services["export"]
    assert {s["image"] for s in [*workers, export]} == {"autotune:cu130"}     # what build_image.sh tags
    base = base_of(image)
    engine("build", "-t", pg["image"], *([] if "nvidia/cuda" in base else ["--build-arg", f"BASE_IMAGE={base}"]),
           str(COMPOSE.parent / pg["build"]), timeout=900)
    data = tmp_path / "data"
    data.mkdir()
    shutil.copyfile(GRID, data / "grid.jsonl.gz")
    (data / "space.yaml").write_text(SMALL_SPACE)
    out = tuner_folder(tmp_path / "tuned_configs")
    volumes = {v: names("volume", v) for v in doc["volumes"]}
    binds = {"../tuned_configs": out}
    net = names("network", "net")
    engine("network", "create", net)

    db = names("container", "postgres")
    engine("run", "-d", "--name", db, "--network", net, "--network-alias", "postgres", "-p", "127.0.0.1::5432",
           *service_run_args(pg, volumes, binds), pg["image"])
    wait_for_line(db, "database system is ready to accept connections")
    health = pg["healthcheck"]["test"]
    assert health[0] == "CMD"
    engine("exec", db, *health[1:])                  # the compose healthcheck says ready too

    def in_net(service, *extra, name=None):
        """The service's container on the test's network: its command, the replay arguments appended."""
        return ["run", *(["-d", "--name", name] if name else ["--rm"]), "--network", net,
                *service_run_args(service, volumes, binds), "-v", f"{data}:/data:ro", image,
                *service["command"], *extra]
    ids = [engine(*in_net(w, *REPLAY_ARGS, name=names("container", f"worker-{i}"))).stdout.strip()
           for i, w in enumerate(workers)]
    stored = []
    for cid in ids:
        code = engine("wait", cid, timeout=900).stdout.strip()
        logs = engine("logs", cid).stdout + engine("logs", cid).stderr
        assert code == "0", logs[-3000:]
        stored.append(sum(map(int, re.findall(r"this worker stored (\d+) trial measurements", logs))))
    port = engine("port", db, "5432").stdout.split()[0].rsplit(":", 1)[1]
    cmd = export["command"]
    url = cmd[cmd.index("--storage") + 1]
    host_url = url.replace("@postgres:5432/", f"@127.0.0.1:{port}/")
    # Both workers measured, into the one study, and no trial twice: what they say they stored adds
    # up to the study's measured trials.
    assert all(stored) and sum(stored) == measured_trials(host_url), (stored, measured_trials(host_url))

    # export from the host, on the study the containers filled (the compose URL, through the port)
    host_args = [a if a != url else host_url for a in cmd]
    host_replay = [str(data / Path(a).name) if a.startswith("/data/") else a for a in REPLAY_ARGS]
    exported = subprocess.run([sys.executable, "-m", "autotune", *host_args, *host_replay, "--partial",
                               "--out", str(tmp_path / "host")], capture_output=True, text=True, cwd=tmp_path)
    assert exported.returncode == 0, exported.stdout[-3000:] + exported.stderr[-3000:]
    # the compose export service, inside (it writes into the tuned_configs volume)
    inside = engine(*in_net(export, *REPLAY_ARGS, "--partial"), timeout=900, check=False)
    assert inside.returncode == 0, inside.stdout[-3000:] + inside.stderr[-3000:]
    # one process, the same study on SQLite
    single_args = [*[a for a in cmd[1:] if a not in (url, "--storage")], *host_replay]
    single = subprocess.run([sys.executable, "-m", "autotune", "run", *single_args, "--kernels", "triton_moe",
                             "--storage", f"sqlite:///{tmp_path / 'single.db'}", "--out", str(tmp_path / "single")],
                            capture_output=True, text=True, cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]
    n = assert_same_files(tmp_path / "host", tmp_path / "single")
    assert assert_same_files(out / "replay", tmp_path / "single") == n > 2
