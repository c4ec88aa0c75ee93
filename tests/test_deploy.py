"""The Dockerfile and compose file, checked statically, and the image's recorded stack against requirements/
(tests/test_container.py builds nothing: it runs the image scripts/build_image.sh built, where an engine exists)."""
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
    """Dockerfile.pip-freeze.txt (scripts/build_image.sh: what pip resolved in the image) holds the
    Dockerfile's version args, and every package of requirements/cpu.lock (the CPU tests' stack, the
    build's constraints) at the locked version, except the ones the Dockerfile leaves out of the
    constraints, which must differ (else the exception is stale). A pin moved in requirements/ or the
    Dockerfile without the image rebuilt and its freeze committed fails here."""
    text = (ROOT / "Dockerfile").read_text()
    assert "source=requirements/cpu.lock" in text
    left_out = set(re.search(r"grep -v -E '\^\(([\w|.-]+)\)==' /tmp/cpu\.lock", text).group(1).split("|"))
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
