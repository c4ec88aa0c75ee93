#!/usr/bin/env bash
# Builds autotune's image from the repository's Dockerfile exactly as a user would (`docker build .`),
# with podman or docker, whichever can build here (AUTOTUNE_CONTAINER_RUNTIME picks one).
#   bash scripts/build_image.sh [--base IMAGE] [--tag TAG] [--resolve] [--freeze FILE] [-- BUILD-ARGS...]
#     --base IMAGE   the image to build FROM (the Dockerfile's CUDA_IMAGE; default its docker.io/nvidia/cuda one)
#     --tag TAG      default autotune:cu130, the name deploy/docker-compose.yml runs
#     --resolve      resolve the stack afresh (IMAGE_STACK=resolve) instead of installing the lock
#                    (scripts/lock_image.sh builds so, to write a new lock)
#     --freeze FILE  where the image's `pip freeze` is written (default build/image.pip-freeze.txt, untracked)
#     BUILD-ARGS     passed to the build as they are (e.g. --build-arg TORCH_INDEX_URL=...)
# Prints the build's wall time, the image's size and its `autotune --version`, writes the image's
# `pip freeze` to FILE, and fails (exit 1, one line) where the image holds other packages than the lock,
# Dockerfile.pip-freeze.txt (scripts/image_lock.py compare): the image users build is the stack tested.
# The tracked tree is never written: a build leaves it clean.
# Behind a TLS-inspecting proxy pip needs the machine's CA bundle: the one pip's own configuration
# names (PIP_CERT, `pip config list`) goes in as a build secret, mounted read-only at its own path for
# the pip step only (the Dockerfile's PIP_CERT), never a layer of the image.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "build_image.sh: $*; usage: scripts/build_image.sh [--base IMAGE] [--tag TAG] [--resolve] [--freeze FILE] [-- BUILD-ARGS...]" >&2; exit 2; }
base="" tag=autotune:cu130 extra=() resolve=0 freeze=build/image.pip-freeze.txt
while [ $# -gt 0 ]; do
  case "$1" in
    --base) [ $# -ge 2 ] && [ -n "$2" ] || usage "--base needs an image"; base=$2; shift 2 ;;
    --tag) [ $# -ge 2 ] && [ -n "$2" ] || usage "--tag needs a name"; tag=$2; shift 2 ;;
    --resolve) resolve=1; shift ;;
    --freeze) [ $# -ge 2 ] && [ -n "$2" ] || usage "--freeze needs a file"; freeze=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
# shellcheck source=scripts/container_lib.sh
source scripts/container_lib.sh
rt=$(container_runtime) || { echo "build_image.sh: $rt" >&2; exit 1; }

args=(build -t "$tag" -f Dockerfile)
[ -z "$base" ] || args+=(--build-arg "CUDA_IMAGE=$base")
[ "$resolve" = 0 ] || args+=(--build-arg IMAGE_STACK=resolve)
cert=$(pip_ca_bundle)
if [ -n "$cert" ]; then
  [ -r "$cert" ] || { echo "build_image.sh: pip's configured CA bundle $cert cannot be read" >&2; exit 1; }
  args+=(--secret "id=pip-cert,src=$cert" --build-arg "PIP_CERT=$cert")
fi
echo "build_image.sh: $rt ${args[*]} ${extra[*]} ."
t0=$SECONDS
"$rt" "${args[@]}" "${extra[@]}" .
build_s=$((SECONDS - t0))

size=$("$rt" image inspect --format '{{.Size}}' "$tag")
version=$("$rt" run --rm --network host "$tag" --version)
from=$("$rt" run --rm --network host --entrypoint bash "$tag" -c \
  '. /etc/os-release && echo "$PRETTY_NAME, $(python --version)"')
built_on=${base:-"the Dockerfile's default CUDA_IMAGE"}
mkdir -p "$(dirname "$freeze")"
{
  echo "# pip freeze of the image $tag (scripts/build_image.sh)."
  echo "# Built FROM $built_on ($from); build args: ${extra[*]:-none}."
  # --all: setuptools is a requirement too (torch's), which a plain freeze leaves out (and a lock without it let the
  # venv's own older setuptools fail pip check); pip itself is the venv's, not the stack's
  "$rt" run --rm --network host --entrypoint pip "$tag" freeze --all --exclude pip --exclude-editable
} > "$freeze.part"
mv "$freeze.part" "$freeze"
echo "build_image.sh: built $tag in ${build_s} s; size $(awk -v b="$size" 'BEGIN { printf "%.2f GB", b / 1e9 }'); $version"
echo "build_image.sh: $(($(wc -l < "$freeze") - 2)) packages in $freeze"
if [ "$resolve" = 0 ]; then
  python3 scripts/image_lock.py compare Dockerfile.pip-freeze.txt "$freeze" || exit 1
  echo "build_image.sh: the image holds exactly Dockerfile.pip-freeze.txt"
fi
