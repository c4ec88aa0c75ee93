"""The Dockerfile and compose file, checked statically, and the image's recorded stack against requirements/
(tests/repo/test_container.py builds nothing: it runs the image scripts/build_image.sh built, where an engine exists)."""
import re

import yaml

from tests.conftest import ROOT

INSTRUCTIONS = {"FROM", "ARG", "RUN", "ENV", "WORKDIR", "COPY", "USER", "VOLUME", "ENTRYPOINT", "CMD", "LABEL", "EXPOSE"}


def dockerfile():
    text = (ROOT / "Dockerfile").read_text()
    logical, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip().rstrip("\\").rstrip() + " "
        if not line.rstrip().endswith("\\"):
            logical.append(cur.strip())
            cur = ""
    assert not cur, "dangling line continuation"
    return logical


def pins(path):
    return dict(re.findall(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)", (ROOT / path).read_text(), re.M))


def canonical(pinned: dict) -> dict:
    """name -> version with names as pip compares them (extras dropped, case and -_. folded)."""
    return {re.sub(r"[-_.]+", "-", re.sub(r"\[.*\]", "", n)).lower(): v for n, v in pinned.items()}


def test_every_instruction_is_known_and_the_image_runs_autotune_as_non_root():
    lines = dockerfile()
    assert all(ln.split()[0] in INSTRUCTIONS for ln in lines), [ln for ln in lines if ln.split()[0] not in INSTRUCTIONS]
    assert lines[0].startswith("ARG") and any(ln.startswith("FROM ${CUDA_IMAGE}") for ln in lines)
    assert 'ENTRYPOINT ["autotune"]' in lines
    users = [ln.split()[1] for ln in lines if ln.startswith("USER")]
    assert users and users[-1] not in ("root", "0")
    assert any(ln.startswith("VOLUME") and "/cache" in ln for ln in lines)


def test_image_pins_the_versions_the_project_pins():
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", (ROOT / "Dockerfile").read_text(), re.M))
    cpu, sg = pins("requirements/cpu.txt"), pins("requirements/sglang.txt")
    assert args["SGLANG_VERSION"] == sg["sglang"]
    assert args["FLASHINFER_VERSION"] == cpu["flashinfer-python"]
    assert args["OPTUNA_VERSION"] == cpu["optuna"]
    assert args["PSYCOPG_VERSION"] == cpu["psycopg[binary]"]
    assert args["TORCH_VERSION"] == cpu["torch"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'sglang=={sg["sglang"]}' in pyproject


def test_the_images_entrypoint_is_the_cli(capsys):
    """The Dockerfile's ENTRYPOINT ["autotune"] is the console script pyproject.toml declares: the
    installed metadata names the same function, and it runs a sub-command, with its output."""
    from importlib.metadata import entry_points

    target = re.search(r'^autotune = "([\w.]+:\w+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    [installed] = entry_points(group="console_scripts", name="autotune")
    assert installed.value == target
    fn = installed.load()
    assert fn(["shapes", "--model", "qwen3.5-35b-a3b", "--tp", "8"]) == 0
    out = capsys.readouterr().out
    # Qwen3.5-35B-A3B: 256 experts, moe_intermediate 512 / tp 8 = 64, hidden 2048, top-8
    assert "3 fused-MoE problems" in out and re.search(r"\b256\s+64\s+2048\s+8 bf16\b", out)


def test_compose_runs_one_worker_per_gpu_on_one_postgres_study():
    doc = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    services = doc["services"]
    workers = {k: v for k, v in services.items() if k.startswith("worker")}
    assert len(workers) >= 2
    gpus = [w["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0] for w in workers.values()]
    assert len(set(gpus)) == len(gpus)
    for w in workers.values():
        cmd = w["command"]
        assert cmd[0] == "worker" and "postgres:5432" in cmd[cmd.index("--storage") + 1]
        assert cmd[cmd.index("--study") + 1] == services["export"]["command"][services["export"]["command"].index("--study") + 1]
    assert "postgres" in services


def test_the_lock_setup_installs_holds_every_pin_of_cpu_txt_at_its_version():
    # setup.sh installs requirements/cpu.lock with --no-deps (in parallel) and cpu.txt only checks it:
    # a pin changed in cpu.txt without re-running scripts/lock_cpu.py would test another stack.
    lock, cpu = canonical(pins("requirements/cpu.lock")), canonical(pins("requirements/cpu.txt"))
    assert {n: v for n, v in cpu.items() if lock.get(n) != v} == {}
    assert "torch" in lock and "sglang" not in lock    # sglang goes in apart, with --no-deps


def test_the_images_recorded_stack_is_the_tested_one_and_its_own_pins():
    """Dockerfile.pip-freeze.txt (the image's lock, scripts/lock_image.sh: what pip resolved) holds the
    Dockerfile's version args, and every package of requirements/cpu.lock (the CPU tests' stack, the
    build's constraints) at the locked version, except the ones the Dockerfile leaves out of the
    constraints, which must differ (else the exception is stale). A pin moved in requirements/ or the
    Dockerfile without the image rebuilt and its freeze committed fails here."""
    text = (ROOT / "Dockerfile").read_text()
    assert "COPY Dockerfile.pip-freeze.txt requirements/cpu.lock /tmp/lock/" in text
    left_out = set(re.search(r"grep -v -E '\^\(([\w|.-]+)\)==' /tmp/lock/cpu\.lock", text).group(1).split("|"))
    freeze = canonical(pins("Dockerfile.pip-freeze.txt"))
    lock = canonical(pins("requirements/cpu.lock"))
    args = dict(re.findall(r"^ARG (\w+)_VERSION=(\S+)", text, re.M))
    names = {"TORCH": "torch", "SGLANG": "sglang", "FLASHINFER": "flashinfer-python", "OPTUNA": "optuna",
             "PSYCOPG": "psycopg"}
    assert set(args) == set(names)
    assert {names[a]: v for a, v in args.items() if freeze.get(names[a]) != v} == {}
    differ = {n: (v, freeze[n]) for n, v in lock.items() if n in freeze and freeze[n] != v}
    assert set(differ) == left_out, (differ, left_out)


def test_the_wheel_lists_every_package_of_the_tree():
    """pyproject.toml names the packages the wheel (and the image's install) carries: a new folder of
    autotune/ left out of it would import in a checkout and be missing where the tool is installed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "autotune").rglob("__init__.py")}
    assert listed == on_disk | {"autotune", "autotune.search_spaces"}


# --- the image installs its lock, and a build leaves the tree as it was ---------------------------------

def test_the_image_installs_exactly_its_lock_and_resolves_only_when_told():
    """The default build installs Dockerfile.pip-freeze.txt with --no-deps (nothing resolved, so two builds
    a day apart install the same stack); IMAGE_STACK=resolve is the lock refresh's build
    (scripts/lock_image.sh), which build_image.sh asks for only with --resolve."""
    run = next(ln for ln in dockerfile() if "pip install" in ln and "/tmp/lock/" in ln)
    locked = run.split("else", 1)[1]
    assert "--no-deps" in locked and "-r /tmp/lock/Dockerfile.pip-freeze.txt" in locked and " -c " not in locked
    assert "ARG IMAGE_STACK=locked" in dockerfile()
    script = (ROOT / "scripts/build_image.sh").read_text()
    assert "--build-arg IMAGE_STACK=resolve" in script
    lock = (ROOT / "Dockerfile.pip-freeze.txt").read_text()
    assert "scripts/lock_image.sh" in lock.splitlines()[1]


FAKE_ENGINE = r"""#!/bin/sh
# a container engine that builds nothing: answers what scripts/build_image.sh asks of it
echo "$*" >> "$FAKE_LOG"
case "$1" in
  info) exit 0 ;;
  build) exit 0 ;;
  image) echo 11250000000 ;;
  run)
    case "$*" in
      *"--entrypoint pip"*) cat "$FAKE_FREEZE" ;;
      *"--entrypoint bash"*) echo "Debian GNU/Linux 12 (bookworm), Python 3.11.2" ;;
      *) echo "autotune 0.1.0" ;;
    esac ;;
esac
"""


def _build_with_a_fake_engine(tmp_path, freeze: str, *args: str):
    """scripts/build_image.sh run in a copy of what it reads (the checkout is never written), with an engine
    on PATH that builds nothing and whose image's `pip freeze` is `freeze`."""
    import os
    import shutil
    import subprocess

    repo = tmp_path / f"repo{len(list(tmp_path.glob('repo*')))}"
    for name in ("scripts", "requirements"):
        shutil.copytree(ROOT / name, repo / name)
    for name in ("Dockerfile", "Dockerfile.pip-freeze.txt"):
        shutil.copy2(ROOT / name, repo / name)
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "podman").write_text(FAKE_ENGINE)
    (bin_ / "podman").chmod(0o755)
    (tmp_path / "freeze.txt").write_text(freeze)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "AUTOTUNE_CONTAINER_RUNTIME": "podman",
           "FAKE_LOG": str(tmp_path / "engine.log"), "FAKE_FREEZE": str(tmp_path / "freeze.txt"), "PIP_CERT": ""}
    r = subprocess.run(["bash", "scripts/build_image.sh", *args], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=120)
    return r, repo


def _lock_pins() -> str:
    return "".join(f"{n}=={v}\n" for n, v in pins("Dockerfile.pip-freeze.txt").items())


def test_a_build_leaves_the_tracked_lock_as_it_was_and_an_image_of_other_versions_fails(tmp_path):
    before = (ROOT / "Dockerfile.pip-freeze.txt").read_bytes()
    ok, repo = _build_with_a_fake_engine(tmp_path, _lock_pins())
    assert ok.returncode == 0, ok.stderr
    assert (repo / "Dockerfile.pip-freeze.txt").read_bytes() == before         # the tree stays clean
    assert pins(str(repo / "build/image.pip-freeze.txt")) == pins("Dockerfile.pip-freeze.txt")
    assert "IMAGE_STACK" not in (tmp_path / "engine.log").read_text()
    drifted = _lock_pins().replace("grpcio==", "grpcio==9.9.9 #was ")
    bad, repo = _build_with_a_fake_engine(tmp_path, drifted)
    err = bad.stderr.strip().splitlines()
    assert bad.returncode == 1 and len(err) == 1 and "grpcio " in err[0] and "-> 9.9.9" in err[0], bad.stderr
    assert (repo / "Dockerfile.pip-freeze.txt").read_bytes() == before


def test_the_lock_refresh_takes_every_hash_the_index_gives_or_none(tmp_path):
    """scripts/image_lock.py write: each pin with the sha256 of the files its index offers for that
    version (PEP 691 JSON or PEP 503 HTML); where one package has none, no package gets any (pip's hash
    checking is all or nothing) and that package is named."""
    import http.server
    import importlib.util
    import json
    import threading

    spec = importlib.util.spec_from_file_location("image_lock", ROOT / "scripts/image_lock.py")
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    a, b, other = "a" * 64, "b" * 64, "c" * 64
    pages = {"/simple/grpcio/": ("application/vnd.pypi.simple.v1+json", json.dumps({"files": [
                 {"filename": "grpcio-1.85.3-cp311-cp311-manylinux_2_17_x86_64.whl", "hashes": {"sha256": a}},
                 {"filename": "grpcio-1.85.3.tar.gz", "hashes": {"sha256": b}},
                 {"filename": "grpcio-1.85.4.tar.gz", "hashes": {"sha256": other}}]})),
             "/simple/pyyaml/": ("text/html", f'<a href="../f/PyYAML-6.0.2.tar.gz#sha256={a}">PyYAML-6.0.2.tar.gz</a>'),
             "/simple/nohash/": ("application/vnd.pypi.simple.v1+json",
                                 json.dumps({"files": [{"filename": "nohash-1.0.tar.gz", "hashes": {}}]}))}

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            kind, body = pages.get(self.path, ("text/html", ""))
            self.send_response(200 if self.path in pages else 404)
            self.send_header("Content-Type", kind)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_port}/simple"
    try:
        text, missing = lock.lock_text("grpcio==1.85.3\nPyYAML==6.0.2\n", "base", [index])
        assert missing == [] and f"grpcio==1.85.3 \\\n    --hash=sha256:{a} \\\n    --hash=sha256:{b}\n" in text
        assert f"PyYAML==6.0.2 \\\n    --hash=sha256:{a}\n" in text and other not in text
        text, missing = lock.lock_text("grpcio==1.85.3\nnohash==1.0\n", "base", [index])
        assert missing == ["nohash"] and "--hash" not in text and "grpcio==1.85.3\n" in text
    finally:
        server.shutdown()
    assert lock.drift(text, "grpcio==1.85.3\nnohash==1.0\n") == ""
    assert lock.drift(text, "grpcio==1.85.4\nextra==2\n") == "grpcio 1.85.3 -> 1.85.4, nohash 1.0 missing, extra 2 not in the lock"


# --- the deployment as documented ----------------------------------------------------------------------

def test_every_image_is_named_in_full_so_podman_resolves_it():
    """podman resolves no short name (nvidia/cuda:..., debian:...) without a registries.conf: every base
    image a Dockerfile pulls, the compose file's pulled images and the docs' build lines name a registry."""
    def full(image: str) -> bool:
        host = image.split("/", 1)[0]
        return "/" in image and ("." in host or ":" in host or host == "localhost")
    bases = [re.search(r"^ARG CUDA_IMAGE=(\S+)", (ROOT / "Dockerfile").read_text(), re.M).group(1),
             re.search(r"^ARG BASE_IMAGE=(\S+)", (ROOT / "deploy/postgres/Dockerfile").read_text(), re.M).group(1)]
    assert all(full(b) for b in bases), bases
    services = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())["services"]
    pulled = [s["image"] for s in services.values() if "build" not in s and not s["image"].startswith("autotune:")]
    assert pulled and all(full(i) for i in pulled), pulled
    for doc in ("docs/DEPLOY.md", "README.md", "Dockerfile", "scripts/build_image.sh"):
        named = re.findall(r"CUDA_IMAGE=([A-Za-z][\w./:-]*)|from (\S*nvidia/cuda\S*)", (ROOT / doc).read_text())
        assert all(full(x or y) for x, y in named), (doc, named)


def test_no_compose_service_restarts_without_bound_and_the_replay_deployment_needs_no_gpu():
    """A worker without a GPU exits 2 with one line; `restart: on-failure` restarted it forever. The
    replay profile runs the same deployment on the committed H200 recording, with no GPU reserved: its
    commands are ones autotune's parser takes, and the recording they name is where the volume mounts."""
    from autotune.cli import build_parser

    doc = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    services = doc["services"]
    assert {n: s["restart"] for n, s in services.items() if s.get("restart", "no") not in ("no",)
            and not re.fullmatch(r"on-failure:\d+", s["restart"])} == {}
    replay = {n: s for n, s in services.items() if "replay" in s.get("profiles", [])}
    assert set(replay) == {"replay-worker-0", "replay-worker-1", "replay-export"}
    for s in replay.values():
        assert "deploy" not in s
        args = build_parser().parse_args(s["command"])
        mounts = dict(v.split(":")[1::-1] for v in s["volumes"])        # target -> source
        src = (ROOT / "deploy" / mounts["/recordings"] / args.replay.removeprefix("/recordings/"))
        assert src.is_file(), src
    assert {build_parser().parse_args(s["command"]).study for s in replay.values()} == {"qwen35-replay"}


def test_every_file_the_dockerfile_copies_is_sent_to_the_engine():
    """.dockerignore sends the engine nothing but what the Dockerfile reads: a COPY of a file it filters out
    fails the build at that step ("no items matching glob ... filtered out"), as the image's lock once did."""
    import fnmatch
    import re

    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]

    def sent(path: str) -> bool:
        keep = True
        for rule in rules:                       # the last matching rule decides, as the engines read the file
            pattern = rule.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                keep = rule.startswith("!")
        return keep
    copied = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied += [p for p in line.split()[1:-1] if not p.startswith("--")]
        copied += re.findall(r"type=bind,source=([^,\s]+)", line)
    assert copied and all((ROOT / p).exists() for p in copied), copied
    assert [p for p in copied if not sent(p)] == []
