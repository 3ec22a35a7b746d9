#!/usr/bin/env bash
# Train with several Horovod ranks inside one container, with the repository's data/ and
# runs/ mounted, so the run directory is on the host afterwards.
#
#   docker/run-local.sh [distseg-train options]      e.g. --preset demo --epochs 2
#
# Environment: IMAGE (default distseg), RANKS (default 4), DATA (a file under data/,
# default data/liver117.h5, converted from LiTS case 117 inside the container when
# missing), RUN (default runs/docker-npRANKS-DATE), BUILD=1 to rebuild the image.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${IMAGE:-distseg}
RANKS=${RANKS:-4}
DATA=${DATA:-data/liver117.h5}
RUN=${RUN:-runs/docker-np$RANKS-$(date +%Y%m%d-%H%M%S)}

case $DATA in data/*) ;; *) echo "error: DATA must be a path under data/ (mounted at /work/data), got $DATA" >&2; exit 2 ;; esac
case $RUN in runs/*) ;; *) echo "error: RUN must be a path under runs/ (mounted at /work/runs), got $RUN" >&2; exit 2 ;; esac
command -v docker >/dev/null 2>&1 || { echo "error: docker not found" >&2; exit 1; }

if [ "${BUILD:-0}" = 1 ] || ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  docker build -f "$here/docker/Dockerfile" -t "$IMAGE" "$here"
fi
mkdir -p "$here/data" "$here/runs"

# --user: files in runs/ and data/ belong to you, not to the image's user; HOME=/tmp
#   because that uid has no home directory in the image.
# --shm-size: Open MPI's shared-memory transport between the ranks lives in /dev/shm,
#   and Docker's default 64 MB is too small for a U-Net's gradients.
# horovodrun -H localhost:RANKS starts every rank in this one container; Horovod's
#   defaults for CPU scaling come from distseg itself (distseg/parallel/distributed.py).
docker run --rm --init \
  --user "$(id -u):$(id -g)" -e HOME=/tmp \
  --shm-size=1g \
  -v "$here/data:/work/data" -v "$here/runs:/work/runs" \
  "$IMAGE" \
  bash -c 'set -e
    [ -f "/work/$1" ] || distseg-data lits-sample --out "/work/$1"
    data=$1 run=$2 ranks=$3; shift 3
    horovodrun -np "$ranks" -H "localhost:$ranks" distseg-train --data "/work/$data" --run-dir "/work/$run" "$@"
    distseg-report "/work/$run" --out "/work/$run-report"' \
  run-local "$DATA" "$RUN" "$RANKS" "$@"
echo "run: $here/$RUN (report: $here/$RUN-report/report.html)"
