#!/usr/bin/env bash
# Builds the teserve container image without any container registry:
#   1. a Debian 12 root filesystem made with debootstrap from the Debian mirror, trimmed
#      the way debian:bookworm-slim is, committed as localhost/debian:bookworm-slim
#      (skipped when that image exists; TESERVE_REBUILD_BASE=1 makes it anew);
#   2. deploy/Containerfile built on it with buildah into localhost/teserve:dev.
# Prints the time of each part and the image's size. Needs root (debootstrap, buildah);
# installs debootstrap and buildah with apt-get when they are missing.
#
# Environment:
#   TESERVE_IMAGE          image to build (default localhost/teserve:dev)
#   TESERVE_BASE_IMAGE     base image name (default localhost/debian:bookworm-slim)
#   TESERVE_DEBIAN_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   TESERVE_BAZEL_JOBS     Bazel's --jobs inside the build stage (default: auto)
#   TESERVE_ISOLATION      buildah --isolation (default chroot: works where no container
#                          runtime can start, as on our CI machines)
#   TESERVE_REBUILD_BASE   1 = debootstrap the base again even if it exists
#   TESERVE_CA_BUNDLE      CA bundle for HTTPS (pip) inside the build, passed as the build
#                          secret ca-bundle (default: PIP_CERT, SSL_CERT_FILE or the host's
#                          /etc/ssl/certs/ca-certificates.crt; needed where a proxy
#                          re-signs TLS, harmless elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."

image=${TESERVE_IMAGE:-localhost/teserve:dev}
base=${TESERVE_BASE_IMAGE:-localhost/debian:bookworm-slim}
mirror=${TESERVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
isolation=${TESERVE_ISOLATION:-chroot}
jobs=${TESERVE_BAZEL_JOBS:-auto}
ca_bundle=${TESERVE_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}

log() { echo "build_image: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "needs root (debootstrap and buildah write system storage); run with sudo"
  exit 2
fi

missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v buildah >/dev/null || missing+=(buildah)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

start=$SECONDS

# --- 1. the base image -------------------------------------------------------------------
if [ "${TESERVE_REBUILD_BASE:-0}" != 1 ] && buildah inspect --type image "$base" >/dev/null 2>&1; then
  log "base $base exists (TESERVE_REBUILD_BASE=1 to make it anew)"
else
  work=$(mktemp -d /var/tmp/teserve-rootfs.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  rootfs="$work/rootfs"
  log "debootstrap bookworm (minbase) from $mirror"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    exit 1
  }
  # Trim as the slim images do: no documentation, manual pages or locales now or later,
  # no apt lists or caches, the main, updates and security suites as apt sources.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/teserve-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/teserve-slim" <<'EOF'
APT::Install-Recommends "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
EOF
  security=${mirror%/debian}/debian-security
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
  # Files only: packages' scripts expect the directories (openjdk's postinst links into
  # /usr/share/man/man1 and fails without it).
  find "$rootfs"/usr/share/{man,info,lintian} -not -type d -delete 2>/dev/null || true
  rm -rf "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
  find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  tar -C "$rootfs" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -cf "$work/rootfs.tar" .
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$work/rootfs.tar" / >/dev/null
  buildah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.opencontainers.image.description="Debian 12 (bookworm) minbase, trimmed; made by teserve deploy/build_image.sh" \
    "$ctr"
  buildah commit --quiet --rm "$ctr" "$base" >/dev/null
  rm -rf "$work"
  trap - EXIT
  log "base $base made in $((SECONDS - start)) s"
fi
base_done=$SECONDS

# --- 2. the teserve image ----------------------------------------------------------------
log "building $image from deploy/Containerfile (isolation $isolation, bazel --jobs=$jobs)"
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
buildah build --isolation "$isolation" --format docker --layers \
  --build-arg BASE_IMAGE="$base" --build-arg BAZEL_JOBS="$jobs" \
  ${ca_bundle:+--secret "id=ca-bundle,src=$ca_bundle"} \
  -f deploy/Containerfile -t "$image" .
build_done=$SECONDS

log "base: $((base_done - start)) s, image build: $((build_done - base_done)) s, total: $((build_done - start)) s"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$image" | sed 's/^/build_image: image size: /' >&2
exit 0
