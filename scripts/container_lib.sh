# Shared by scripts/build_image.sh and scripts/container_setup.sh (source it).

# The container engine to use: AUTOTUNE_CONTAINER_RUNTIME if set, else podman, else docker, the first
# whose engine answers (a docker client without its daemon does not count). Prints its name; where
# none answers, prints why and returns 1.
container_runtime() {
  local rt
  for rt in ${AUTOTUNE_CONTAINER_RUNTIME:-podman docker}; do
    if command -v "$rt" >/dev/null 2>&1 && "$rt" info >/dev/null 2>&1; then echo "$rt"; return 0; fi
  done
  echo "no container engine answers (${AUTOTUNE_CONTAINER_RUNTIME:-podman or docker}: \`info\` failed or not installed)"
  return 1
}

# The CA bundle pip is configured with on this machine (PIP_CERT or pip's config files), or nothing.
pip_ca_bundle() {
  if [ -n "${PIP_CERT:-}" ]; then echo "$PIP_CERT"; return; fi
  python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | head -1
}
