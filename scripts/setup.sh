#!/usr/bin/env bash
# Creates .venv (Python 3.11+) with everything autotune and its tests need on a machine
# without a GPU: CPU-usable torch, Triton (its interpreter runs SGLang's kernels), SGLang's
# kernel and loader modules, Optuna, pandas. Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
# --no-compile: Python compiles what it imports on first use and keeps it; compiling every
# installed file up front (torch, transformers, sglang: tens of thousands) was most of a fresh
# setup's time. (Where PYTHONDONTWRITEBYTECODE is set nothing is kept: unset it for the tests.)
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile "$@"; }
# requirements/cpu.lock (scripts/lock_cpu.py) is the resolved closure of requirements/cpu.txt, each
# package with its installed size. It and SGLang (only its kernel and loader modules are used on the
# CPU) go in with --no-deps as one pip process per core, the parts balanced by size: unpacking torch's
# CUDA wheels (7 GB installed) on one core was most of a fresh setup. tests/repo/test_deploy.py checks that
# the lock holds cpu.txt's pins; pip check below, that it holds everything they need.
# Two parts per core: wheels unpack at different speeds per MiB, and the cores stay busy to the end.
parts=$(( 2 * $(nproc 2>/dev/null || echo 1) )); [ "$parts" -gt 8 ] && parts=8
lockdir=$(mktemp -d); trap 'rm -rf "$lockdir"' EXIT
"$py" scripts/lock_cpu.py --parts "$parts" "$lockdir" requirements/cpu.lock requirements/sglang.txt
pids=()
for f in "$lockdir"/part*.txt; do pip_install --no-deps -r "$f" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid"; done
# pip check: every installed package's requirements met (SGLang's own are not installed on purpose).
broken=$(.venv/bin/python -m pip check 2>/dev/null | grep -v '^sglang ' || true)
[ -z "$broken" ] || { echo "setup: requirements/cpu.lock is incomplete (re-run scripts/lock_cpu.py):" >&2; echo "$broken" >&2; exit 1; }
# setuptools is in the lock: no isolated build environment to set up for the editable install.
pip_install --no-deps --no-build-isolation -e .
# Older SGLang releases' own source, for the tests that load our files through each release's
# loader and kernel signature (tests/adapters/test_sglang_releases.py): the package tree only, no install.
for v in 0.5.16; do
  dest=.venv/sglang-releases/$v
  [ -f "$dest/sglang/__init__.py" ] && continue
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 -d "$tmp" "sglang==$v"
  mkdir -p "$dest.part" && "$PWD/.venv/bin/python" - "$tmp" "$dest.part" <<'PY'
import glob, sys, zipfile
z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/sglang-*.whl")[0])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("sglang/") and not n.endswith(".so")])
PY
  rm -rf "$dest" && mv "$dest.part" "$dest" && rm -rf "$tmp"
done
