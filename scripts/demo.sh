#!/usr/bin/env bash
# The main job behind `make demo`: real training on LiTS case 117 with 1 and 2 Horovod
# ranks, then the scaling report. Assumes scripts/install.sh has run (make does that).
#
# Environment: VENV (default .venv), DEMO_EPOCHS (default 8), DEMO_RANKS (default 2).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
BIN=${VENV:-$here/.venv}/bin
export PATH="$BIN:$PATH" TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
EPOCHS=${DEMO_EPOCHS:-8}
RANKS=${DEMO_RANKS:-2}
say() { printf '\n[demo] %s\n' "$*"; }

data=data/liver117.h5
if [ ! -f "$data" ]; then
  say "converting LiTS case 117 to $data"
  distseg-data lits-sample --out "$data"
fi

demo=runs/demo-$(date +%Y%m%d-%H%M%S)
# One thread per rank in both runs, so the comparison is rank for rank on 2 cores.
args=(--preset demo --data "$data" --epochs "$EPOCHS" --intra-op-threads 1 --inter-op-threads 1)

say "1 rank -> $demo/np1"
distseg-train "${args[@]}" --run-dir "$demo/np1"

say "$RANKS Horovod ranks -> $demo/np$RANKS"
timeout 1800 horovodrun -np "$RANKS" -H "localhost:$RANKS" distseg-train "${args[@]}" --run-dir "$demo/np$RANKS"

say "report -> $demo/report"
distseg-report "$demo/np1" "$demo/np$RANKS" --target-loss -0.75 --target-loss -0.76 --out "$demo/report"

python - "$demo" "$RANKS" <<'PY'
"""Samples/s at 1 and N ranks (epochs after the first), the whole training time, and
the final validation Dice: the same model, sooner?"""
import sys
from distseg.core import rundir, schema
demo, ranks = sys.argv[1], int(sys.argv[2])

def summary(run, size):
    epochs = {}
    for rank in range(size):
        for r in schema.read_log(rundir.log_path(f"{demo}/{run}", rank))[0]:
            if r["type"] == "epoch":
                epochs.setdefault(r["epoch"], []).append(r)
    steady = [e for e in sorted(epochs) if e > 0] or sorted(epochs)
    samples = sum(r["samples"] for e in steady for r in epochs[e])
    # A synchronous epoch lasts as long as its slowest rank.
    train = {e: max(r.get("train_time", r["epoch_time"]) for r in epochs[e]) for e in epochs}
    seconds = sum(train[e] for e in steady)
    last = epochs[max(epochs)][0]
    return (samples / seconds, seconds / len(steady), sum(train.values()),
            last["val_dice"].get("liver"), last["train_loss"])

one = summary("np1", 1)
many = summary(f"np{ranks}", ranks)
print()
for name, (sps, ept, total, dice, loss) in (("1 rank", one), (f"{ranks} ranks", many)):
    print(f"[demo] {name:8s} {ept:6.2f} s/epoch (training, epochs 2+)  {sps:7.2f} samples/s  "
          f"training {total:6.1f} s  final train loss {loss:.3f}  final val liver Dice {dice:.3f}")
print(f"[demo] {ranks} ranks / 1 rank: samples/s {many[0] / one[0]:.2f}x, training time "
      f"{many[2] / one[2]:.2f}x, val liver Dice {many[3] - one[3]:+.3f}")
PY
say "done: runs in $demo, report in $demo/report/report.html"
