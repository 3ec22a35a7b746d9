#!/usr/bin/env bash
# Submits a scaling sweep written by `distseg-jobs sweep`: one training job per node
# count, then one distseg-report job that waits for all of them.
#
#   bash submit.sh                 submit (from any directory; Slurm output lands here)
#   SBATCH=PROGRAM bash submit.sh  submit through another program taking sbatch's
#                                  arguments (a site wrapper; the tests use a stand-in)
#
# With chaining on (the default, --chain), each training job waits for the one before it
# (afterany: even a failed job releases the next), so the node counts run one at a time
# and are timed without the others loading the file system and network. The report job
# waits for all of them.
set -euo pipefail
cd "$(dirname "$0")"

SBATCH=${SBATCH:-sbatch}
CHAIN=@{chain}
SCRIPTS=(@{scripts})
REPORT=@{report_script}

command -v "$SBATCH" >/dev/null 2>&1 || { echo "error: $SBATCH not found: run this on the cluster's login node" >&2; exit 1; }
mkdir -p @{runs_dir}

# --parsable prints "jobid" or "jobid;cluster".
job_id() {
  local id=${1%%;*}
  case $id in
    '' | *[!0-9]*) echo "error: sbatch did not print a job id for $2: '$1'" >&2; exit 1 ;;
  esac
  echo "$id"
}

ids=()
after=""
for script in "${SCRIPTS[@]}"; do
  out=$("$SBATCH" --parsable ${after:+"--dependency=afterany:$after"} "$script")
  id=$(job_id "$out" "$script")
  ids+=("$id")
  echo "submitted $script as job $id${after:+ (after job $after)}"
  if [ "$CHAIN" = 1 ]; then
    after=$id
  fi
done
all=$(IFS=:; echo "${ids[*]}")
out=$("$SBATCH" --parsable "--dependency=afterany:$all" "$REPORT")
id=$(job_id "$out" "$REPORT")
echo "submitted $REPORT as job $id (after jobs ${all//:/ })"
echo "follow with: squeue -u ${USER:-$(id -un)}"
