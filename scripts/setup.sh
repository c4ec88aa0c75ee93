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
pip_install -r requirements/cpu.txt
pip_install --no-deps -r requirements/sglang.txt
pip_install --no-deps -e .
# Older SGLang releases' own source, for the tests that load our files through each release's
# loader and kernel signature (tests/test_sglang_releases.py): the package tree only, no install.
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
