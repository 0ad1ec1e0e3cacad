#!/usr/bin/env bash
# Validate `wagma-bench simulate` against real local runs: train each configuration for real, calibrate the
# simulator on those runs (+ comm-bench JSON when `wagma-bench comm-bench` is available), simulate the same
# configurations and print predicted vs measured throughput with their ratio (goal: within 15%).
#
#   reproduce/scaling/validate.sh                 # full: 2,4,8 ranks x none,shared_draw,lognormal x allreduce,wagma (27 min, 2 cores)
#   TINY=1 reproduce/scaling/validate.sh          # pipeline check: 2 ranks, imbalance=none, 30 steps
#   RANKS="4" IMBALANCES="shared_draw" OPTIMIZERS="allreduce wagma sgp" STEPS=300 reproduce/scaling/validate.sh
#
# Run it on a quiet machine: timings taken while other jobs compete for the cores are not representative.
# Results: $OUT/runs/* (run directories), $OUT/comm_bench.json, $OUT/sim/validation.{csv,json,png}.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin/wagma-bench}
OUT=${OUT:-outputs/validate_sim}
if [[ "${TINY:-0}" == 1 ]]; then
  RANKS=${RANKS:-2}; IMBALANCES=${IMBALANCES:-none}; OPTIMIZERS=${OPTIMIZERS:-allreduce wagma}; STEPS=${STEPS:-30}
else
  RANKS=${RANKS:-2 4 8}; IMBALANCES=${IMBALANCES:-none shared_draw lognormal}; OPTIMIZERS=${OPTIMIZERS:-allreduce wagma}
  STEPS=${STEPS:-220}
fi
mkdir -p "$OUT/runs"

for p in $RANKS; do
  for imb in $IMBALANCES; do
    for opt in $OPTIMIZERS; do
      dir="$OUT/runs/${opt}_${imb}_p${p}"
      if [[ -f "$dir/summary.json" ]]; then echo "== $dir exists, kept"; continue; fi
      echo "== real run: optimizer=$opt imbalance=$imb ranks=$p steps=$STEPS"
      # no evaluation target: a throughput run; evaluation time is excluded from the clock anyway
      "$BIN" run workload=resnet optimizer="$opt" imbalance="$imb" launcher.nproc="$p" \
        train.max_steps="$STEPS" eval.target=null eval.every_steps=100000 checkpoint.every_s=100000 \
        logger.progress=off hydra.run.dir="$dir" > "$dir.log" 2>&1 || { echo "run failed, see $dir.log"; exit 1; }
    done
  done
done

CAL=("$OUT/runs")
if "$BIN" comm-bench --help > /dev/null 2>&1; then
  # comm-bench's own options; the JSON format is the one wagma_bench/simulate/calibrate.py reads
  maxp=$(echo $RANKS | tr ' ' '\n' | sort -n | tail -1)
  if "$BIN" comm-bench --nproc "$maxp" --sizes 4K,64K,1M,16M --out "$OUT/comm_bench.json" > "$OUT/comm_bench.log" 2>&1; then
    CAL+=("$OUT/comm_bench.json")
  else
    echo "comm-bench failed (see $OUT/comm_bench.log): using conf/cluster/local.yaml's network"
  fi
else
  echo "wagma-bench comm-bench not available: using conf/cluster/local.yaml's network"
fi

"$BIN" simulate cluster=local --calibrate "${CAL[@]}" --out "$OUT/sim"
