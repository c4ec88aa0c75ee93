#!/usr/bin/env bash
# Builds autotune's image from the repository's Dockerfile exactly as a user would (`docker build .`),
# with podman or docker, whichever can build here (AUTOTUNE_CONTAINER_RUNTIME picks one).
#   bash scripts/build_image.sh [--base IMAGE] [--tag TAG] [-- BUILD-ARGS...]
#     --base IMAGE   the image to build FROM (the Dockerfile's CUDA_IMAGE; default its nvidia/cuda one)
#     --tag TAG      default autotune:cu130, the name deploy/docker-compose.yml runs
#     BUILD-ARGS     passed to the build as they are (e.g. --build-arg TORCH_INDEX_URL=...)
# Prints the build's wall time, the image's size and its `autotune --version`, and writes the versions
# pip resolved inside it to Dockerfile.pip-freeze.txt, beside the Dockerfile (committed: the image's
# stack, checked against requirements/ by tests/test_deploy.py).
# Behind a TLS-inspecting proxy pip needs the machine's CA bundle: the one pip's own configuration
# names (PIP_CERT, `pip config list`) goes in as a build secret, mounted read-only at its own path for
# the pip step only (the Dockerfile's PIP_CERT), never a layer of the image.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "build_image.sh: $*; usage: scripts/build_image.sh [--base IMAGE] [--tag TAG] [-- BUILD-ARGS...]" >&2; exit 2; }
base="" tag=autotune:cu130 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) [ $# -ge 2 ] && [ -n "$2" ] || usage "--base needs an image"; base=$2; shift 2 ;;
    --tag) [ $# -ge 2 ] && [ -n "$2" ] || usage "--tag needs a name"; tag=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
# shellcheck source=scripts/container_lib.sh
source scripts/container_lib.sh
rt=$(container_runtime) || { echo "build_image.sh: $rt" >&2; exit 1; }

args=(build -t "$tag" -f Dockerfile)
[ -z "$base" ] || args+=(--build-arg "CUDA_IMAGE=$base")
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
{
  echo "# pip freeze of the image scripts/build_image.sh built from the Dockerfile (do not edit: run the script)."
  echo "# Built FROM $built_on ($from); build args: ${extra[*]:-none}."
  "$rt" run --rm --network host --entrypoint pip "$tag" freeze --exclude-editable
} > Dockerfile.pip-freeze.txt.part
mv Dockerfile.pip-freeze.txt.part Dockerfile.pip-freeze.txt
echo "build_image.sh: built $tag in ${build_s} s; size $(awk -v b="$size" 'BEGIN { printf "%.2f GB", b / 1e9 }'); $version"
echo "build_image.sh: $(($(wc -l < Dockerfile.pip-freeze.txt) - 2)) packages in Dockerfile.pip-freeze.txt"
