#!/usr/bin/env bash
# Refreshes the image's lock, Dockerfile.pip-freeze.txt, on purpose (never a side effect of a build):
# builds the image resolving its stack afresh (IMAGE_STACK=resolve: the Dockerfile's version args,
# requirements/cpu.lock's versions as constraints), then writes what pip installed there as the lock,
# each package with the sha256 of the files the index offers for its version (scripts/image_lock.py;
# the indexes asked: pip's configured one, or PyPI, and the Dockerfile's TORCH_INDEX_URL where given).
# Review the diff and commit it: scripts/build_image.sh then installs exactly it, and fails where an
# image holds anything else.
#   bash scripts/lock_image.sh [--base IMAGE] [-- BUILD-ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "lock_image.sh: $*; usage: scripts/lock_image.sh [--base IMAGE] [-- BUILD-ARGS...]" >&2; exit 2; }
base_args=() extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) [ $# -ge 2 ] && [ -n "$2" ] || usage "--base needs an image"; base_args=(--base "$2"); shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
freeze=build/lock-image.pip-freeze.txt
bash scripts/build_image.sh "${base_args[@]}" --tag autotune:lock --resolve --freeze "$freeze" -- "${extra[@]}"
indexes=(--index "${PIP_INDEX_URL:-$(python3 -m pip config get global.index-url 2>/dev/null || echo https://pypi.org/simple)}")
for a in "${extra[@]}"; do
  case "$a" in TORCH_INDEX_URL=*) indexes+=(--index "${a#TORCH_INDEX_URL=}") ;; esac
done
built_from=$(sed -n 's/^# Built FROM \(.*\)\.$/\1/p' "$freeze")
python3 scripts/image_lock.py write "$freeze" --built-from "$built_from" "${indexes[@]}" > Dockerfile.pip-freeze.txt.part
mv Dockerfile.pip-freeze.txt.part Dockerfile.pip-freeze.txt
echo "lock_image.sh: wrote Dockerfile.pip-freeze.txt ($(grep -c '==' Dockerfile.pip-freeze.txt) packages): review and commit it"
