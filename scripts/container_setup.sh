#!/usr/bin/env bash
# Makes this machine able to build and run autotune's image (scripts/build_image.sh, the tests marked
# `container`), idempotently:
# - a container engine: podman or docker if one answers, else Debian's podman (as root, by apt-get);
# - where the engine cannot start a container with its defaults (seen: a hard RLIMIT_NOFILE below
#   podman's default ulimit, crun refusing hybrid cgroups), a drop-in containers.conf that sets no
#   default ulimits and the runc runtime (/etc/containers/containers.conf.d/autotune.conf);
# - a local Debian base image, made with debootstrap from this machine's apt mirror and imported
#   (registry images such as nvidia/cuda cannot be pulled everywhere): $AUTOTUNE_BASE_IMAGE, default
#   localhost/autotune-base:<codename>.
# Prints the engine and the base image (for build_image.sh --base) on its last line, "ENGINE IMAGE".
# Where none of this can be done it prints one line that says why and exits 1 (.ci/run then skips
# the container phase with that reason).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/container_lib.sh
source scripts/container_lib.sh
no() { echo "container_setup: $*" >&2; exit 1; }
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
base=${AUTOTUNE_BASE_IMAGE:-localhost/autotune-base:${codename:-bookworm}}
as_root() { [ "$(id -u)" = 0 ] || no "$1 needs root (run this script as root, or do it yourself)"; }
apt_install() {
  as_root "installing $*"
  command -v apt-get >/dev/null || no "installing $* needs apt-get (not a Debian-like machine)"
  (export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@") \
    >/tmp/container_setup_apt.log 2>&1 || no "apt-get install $* failed (/tmp/container_setup_apt.log)"
}

rt=$(container_runtime) || { apt_install podman runc; rt=$(container_runtime) || no "$rt"; }

# The machine's Debian mirror: the first `deb` source (deb822 .sources or sources.list), unless given.
debian_mirror() {
  [ -z "${AUTOTUNE_DEBIAN_MIRROR:-}" ] || { echo "$AUTOTUNE_DEBIAN_MIRROR"; return; }
  # Either file may be missing (awk then fails): not an error while the other names a mirror.
  { awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list 2>/dev/null || true
  } | head -1
}

if ! "$rt" image inspect "$base" >/dev/null 2>&1; then
  [ -n "$codename" ] || no "no VERSION_CODENAME in /etc/os-release: cannot tell debootstrap which Debian to make"
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || no "no apt mirror configured here (set AUTOTUNE_DEBIAN_MIRROR)"
  command -v debootstrap >/dev/null || apt_install debootstrap
  as_root "debootstrap"
  root=$(mktemp -d /var/tmp/autotune-base.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase "$codename" "$root" "$mirror" >/tmp/container_setup_debootstrap.log 2>&1 \
    || no "debootstrap $codename from $mirror failed (/tmp/container_setup_debootstrap.log)"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "$rt" import - "$base" >/tmp/container_setup_import.log 2>&1 \
    || no "$rt import of the debootstrap tree failed (/tmp/container_setup_import.log)"
  rm -rf "$root"
fi

can_run() { "$rt" run --rm --network host "$base" true >/tmp/container_setup_run.log 2>&1; }
if ! can_run; then
  [ "$rt" = podman ] || no "$rt cannot start a container: $(tail -1 /tmp/container_setup_run.log)"
  command -v runc >/dev/null || apt_install runc
  as_root "configuring podman (/etc/containers/containers.conf.d/autotune.conf)"
  mkdir -p /etc/containers/containers.conf.d
  cat > /etc/containers/containers.conf.d/autotune.conf <<'EOF'
# Written by autotune's scripts/container_setup.sh: podman's defaults could not start a container here.
[containers]
# podman's default nofile ulimit is above this machine's hard limit, and setting it is not permitted
default_ulimits = []

[engine]
# crun refuses this machine's hybrid cgroups ("cgroups in hybrid mode not supported")
runtime = "runc"
EOF
  can_run || no "podman cannot start a container even with runc and no default ulimits: $(tail -1 /tmp/container_setup_run.log)"
fi
# Names on a network the engine makes (compose's services reach `postgres` by name): podman's CNI
# backend resolves them only with the dnsname plugin, netavark only with aardvark-dns; Debian's podman
# recommends neither (seen: "failed to resolve host 'postgres'").
if [ "$rt" = podman ]; then
  case "$(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null)" in
    cni) ls /usr/libexec/cni/dnsname /usr/lib/cni/dnsname /usr/local/lib/cni/dnsname /opt/cni/bin/dnsname >/dev/null 2>&1 \
           || apt_install golang-github-containernetworking-plugin-dnsname ;;
    netavark) ls /usr/libexec/podman/aardvark-dns /usr/lib/podman/aardvark-dns >/dev/null 2>&1 || apt_install aardvark-dns ;;
  esac
fi
echo "$rt $base"
