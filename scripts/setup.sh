#!/usr/bin/env bash
# Creates .venv (Python 3.11+) with everything autotune and its tests need on a machine
# without a GPU: CPU-usable torch, Triton (its interpreter runs SGLang's kernels), SGLang's
# kernel and loader modules, Optuna, pandas. Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements/cpu.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements/sglang.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
