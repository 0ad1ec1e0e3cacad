#!/usr/bin/env bash
# Validate `wagma-bench simulate` against real local runs: train each configuration for real, calibrate the
# simulator on those runs (+ comm-bench JSON), simulate the same configurations and print predicted vs measured
# throughput with their ratios (the bar: trace within 5%, resampled within 15%).
#
#   reproduce/scaling/validate.sh                 # full: 2,4,8 ranks x none,independent,lognormal x nine optimizers
#   TINY=1 reproduce/scaling/validate.sh          # pipeline check: 2 ranks, imbalance=none, 30 steps, two optimizers
#   RANKS="4" IMBALANCES="independent" OPTIMIZERS="allreduce wagma sgp" STEPS=300 reproduce/scaling/validate.sh
#   GOSSIP_PAIRS=3 reproduce/scaling/validate.sh  # also AD-PSGD's exchange cost: interleaved pairs (see below)
#
# An OPTIMIZERS entry is an optimizer name, or LABEL:OVERRIDE+OVERRIDE... for a variant (its run directory is
# named by LABEL): streaming DiLoCo is local SGD with an outer Nesterov step averaged fragment by fragment.
# The loops interleave the optimizers inside each (ranks, imbalance) cell: the machine's speed drifts.
#
# GOSSIP_PAIRS=N: N interleaved pairs at 4 and 8 ranks, imbalance=none, of AD-PSGD (its gossip thread on) and local
# SGD with period = AD-PSGD's sync_every (the same compute path and the same barrier every 10 rounds, no thread):
# what the exchange costs a rank's compute (`gossip_cost.py` reads them).
#
# Run it on a quiet machine: timings taken while other jobs compete for the cores are not representative.
# Results: $OUT/runs/* (run directories), $OUT/comm_bench.json, $OUT/sim/validation.{csv,json,png}.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin/wagma-bench}
OUT=${OUT:-outputs/validate_sim}
NINE="allreduce wagma local_sgd dpsgd adpsgd sgp eager dropcompute"
NINE+=" diloco_streaming:optimizer=local_sgd+optimizer.outer=nesterov+optimizer.fragments=2+optimizer.fragment_delay=1"
if [[ "${TINY:-0}" == 1 ]]; then
  RANKS=${RANKS:-2}; IMBALANCES=${IMBALANCES:-none}; OPTIMIZERS=${OPTIMIZERS:-allreduce wagma}; STEPS=${STEPS:-30}
else
  RANKS=${RANKS:-2 4 8}; IMBALANCES=${IMBALANCES:-none independent lognormal}; OPTIMIZERS=${OPTIMIZERS:-$NINE}
  STEPS=${STEPS:-220}
fi
GOSSIP_PAIRS=${GOSSIP_PAIRS:-0}
mkdir -p "$OUT/runs" "$OUT/gossip"

# one real run: DIR OVERRIDE... (kept when it completed, so an interrupted campaign resumes; a run stopped short
# is made again)
real_run() {
  local dir=$1; shift
  if grep -qs '"status": "completed"' "$dir/summary.json"; then echo "== $dir completed, kept"; return; fi
  rm -rf "$dir"
  echo "== $(date +%H:%M:%S) real run: $* -> $dir"
  # no evaluation target: a throughput run; evaluation time is excluded from the clock anyway
  "$BIN" run workload=resnet "$@" train.max_rounds="$STEPS" eval.target=null eval.every_rounds=100000 \
    checkpoint.every_s=100000 logger.progress=off hydra.run.dir="$dir" > "$dir.log" 2>&1 \
    || { echo "run failed, see $dir.log"; exit 1; }
}

for p in $RANKS; do
  for imb in $IMBALANCES; do
    for entry in $OPTIMIZERS; do
      label=${entry%%:*}
      if [[ "$entry" == *:* ]]; then IFS=+ read -r -a extra <<< "${entry#*:}"; else extra=(optimizer="$entry"); fi
      real_run "$OUT/runs/${label}_${imb}_p${p}" "${extra[@]}" imbalance="$imb" launcher.nproc="$p"
    done
  done
done

for ((i = 1; i <= GOSSIP_PAIRS; i++)); do
  for p in 4 8; do
    real_run "$OUT/gossip/adpsgd_p${p}_pair${i}" optimizer=adpsgd imbalance=none launcher.nproc="$p"
    real_run "$OUT/gossip/nothread_p${p}_pair${i}" optimizer=local_sgd optimizer.sync_period=10 imbalance=none \
      launcher.nproc="$p"
  done
done

CAL=("$OUT/runs")
maxp=$(echo $RANKS | tr ' ' '\n' | sort -n | tail -1)
if [[ -f "$OUT/comm_bench.json" ]] || "$BIN" comm-bench --nproc "$maxp" --sizes 4K,64K,1M,16M \
    --out "$OUT/comm_bench.json" > "$OUT/comm_bench.log" 2>&1; then
  CAL+=("$OUT/comm_bench.json")
else
  echo "comm-bench failed (see $OUT/comm_bench.log): using conf/cluster/local.yaml's network"
fi

"$BIN" simulate cluster=local --calibrate "${CAL[@]}" --out "$OUT/sim"
