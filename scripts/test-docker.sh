#!/usr/bin/env bash
# Build docker/Dockerfile and run 4 Horovod ranks in the image, on a machine without a
# Docker engine or a registry (what `make test-docker` runs; see docs/docker.md).
#
#   scripts/test-docker.sh OUT        the run and its report end up in OUT/runs on the host
#
# 1. A Debian bookworm base with Python 3.11, made locally with debootstrap and imported
#    into buildah's store once (cached there as $BASE_IMAGE).
# 2. The image, built from docker/Dockerfile unchanged with that base as its BASE build
#    argument: buildah, chroot isolation, cached layers, pip's cache kept between builds.
# 3. Inside the image, as its unprivileged user: synthetic data, then
#    horovodrun -np 4 -H localhost:4 distseg-train, then distseg-report on the run.
# The host-side checks of the logs are tests/test_docker.py's.
#
# Environment: BASE_IMAGE (default localhost/distseg-base:bookworm), IMAGE (default
# localhost/distseg:test), MIRROR (Debian mirror for debootstrap, default
# http://deb.debian.org/debian), REBUILD_BASE=1 to make the base again.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BASE_IMAGE=${BASE_IMAGE:-localhost/distseg-base:bookworm}
IMAGE=${IMAGE:-localhost/distseg:test}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# A Docker engine runs containers through an OCI runtime; on this kind of machine the
# runtime's setrlimit is refused, so builds and runs use buildah's chroot isolation.
export BUILDAH_ISOLATION=chroot

say() { printf '[test-docker] %s\n' "$*"; }
elapsed() { echo "$(( $(date +%s) - $1 )) s"; }
# Each line of a log with the time it was written, to see where a build spends it.
stamp() { while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done; }

[ $# = 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
out=$1
# debootstrap, chroot and buildah's chroot isolation all need root.
[ "$(id -u)" = 0 ] || { echo "error: $0 needs root (debootstrap, buildah)" >&2; exit 1; }

install_tools() {
  local missing="" p
  for p in buildah debootstrap; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -z "$missing" ] && return
  say "apt-get install$missing"
  apt-get update -qq
  # shellcheck disable=SC2086 # a list of package names
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# The base: Debian bookworm's own python3 is 3.11, so minbase plus python3 and
# python3-venv stands in for python:3.11-slim-bookworm. It trusts the host's CA bundle
# (a TLS-inspecting proxy's CA, where there is one, is in it) and pip is told to use the
# system bundle, so the build reaches PyPI the way this machine does.
build_base() {
  if [ "${REBUILD_BASE:-0}" != 1 ] && buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    say "base $BASE_IMAGE: cached"
    return
  fi
  local start
  start=$(date +%s)
  rootfs=$(mktemp -d /var/tmp/distseg-rootfs.XXXXXX) ctr=""
  trap base_cleanup EXIT
  say "debootstrap bookworm (minbase + python3 python3-venv) from $MIRROR"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; exit 1; }
  mkdir -p "$rootfs/usr/local/share/ca-certificates"
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/usr/local/share/ca-certificates/host-bundle.crt"
  chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  ctr=$(buildah from scratch)
  tar -C "$rootfs" -c . | tar -C "$(buildah mount "$ctr")" -x
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
  buildah commit --rm -q "$ctr" "$BASE_IMAGE" >/dev/null
  ctr=""
  base_cleanup
  trap - EXIT
  say "base $BASE_IMAGE built in $(elapsed "$start")"
}

# The root file system and the working container, on success or failure.
base_cleanup() {
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$rootfs" "$rootfs.log"
}

# --layers: an unchanged context reuses every layer. A changed one reruns install.sh,
# which then finds the Horovod wheel it compiled before in the pip cache mount that
# buildah keeps between builds (docker/Dockerfile's RUN --mount=type=cache).
build_image() {
  local start
  start=$(date +%s)
  say "buildah bud docker/Dockerfile (BASE=$BASE_IMAGE) -> $IMAGE"
  buildah bud --layers --build-arg "BASE=$BASE_IMAGE" \
    --ignorefile "$here/docker/Dockerfile.dockerignore" \
    -f "$here/docker/Dockerfile" -t "$IMAGE" "$here" 2>&1 | stamp >"$out/build.log" \
    || { tail -40 "$out/build.log" >&2; exit 1; }
  # The layers of earlier contexts (2.7 GB each) are never used again: drop the
  # dangling images (untagged, unused by any other) of buildah's store.
  buildah rmi --prune >/dev/null 2>&1 || true
  say "image $IMAGE built in $(elapsed "$start") (log: $out/build.log)"
}

# In a container of the image, with its own user, PATH and Open MPI settings (buildah
# run applies the image's USER and ENV), the host's OUT/data and OUT/runs mounted where
# run-local.sh mounts data/ and runs/.
run_in_image() {
  local start ctr status=0
  start=$(date +%s)
  mkdir -p "$out/data" "$out/runs"
  chown 1000:1000 "$out/data" "$out/runs"  # the image's user, uid 1000, writes there
  ctr=$(buildah from --pull=never "$IMAGE")
  say "in $IMAGE: distseg-data synth, horovodrun -np 4 -H localhost:4 distseg-train, distseg-report"
  # shellcheck disable=SC2016 # expanded in the container, not here
  buildah run -v "$out/data:/work/data" -v "$out/runs:/work/runs" "$ctr" -- bash -c '
    set -e
    echo "user=$(id -un) uid=$(id -u) python=$(python --version 2>&1)" >/work/runs/container.txt
    distseg-data synth --out /work/data/synth.h5 --cases 4 --size 32 --seed 0
    horovodrun -np 4 -H localhost:4 distseg-train --preset smoke --epochs 2 \
      --data /work/data/synth.h5 --run-dir /work/runs/np4
    distseg-report /work/runs/np4 --out /work/runs/np4-report' >"$out/run.log" 2>&1 || status=$?
  buildah rm "$ctr" >/dev/null
  [ "$status" = 0 ] || { tail -40 "$out/run.log" >&2; exit 1; }
  say "ran in the image in $(elapsed "$start") (log: $out/run.log)"
}

main() {
  mkdir -p "$out"
  install_tools
  build_base
  build_image
  run_in_image
}

main
